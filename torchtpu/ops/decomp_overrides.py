"""Decompositions of our own for ops PyTorch's ``torch._decomp`` does not cover
(or covers in a way that is wrong for XLA).  Keyed by ATen overload, like
``torch._decomp.decomposition_table``; consulted after the lowering table."""

from __future__ import annotations

import torch

aten = torch.ops.aten
_TABLE: dict = {}


def decomp(*ops):
    def deco(fn):
        for op in ops:
            _TABLE[op] = fn
        return fn

    return deco


def table() -> dict:
    return _TABLE


@decomp(aten.equal.default)
def equal(a, b):
    """``torch.equal``: same shape and every element equal (NaN != NaN), a Python bool
    (a sync point)."""
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.eq(a, b).all().item())
