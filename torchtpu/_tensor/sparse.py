"""Sparse tensors (``torch.sparse_coo`` and the compressed layouts ``sparse_csr``,
``sparse_csc``, ``sparse_bsr``, ``sparse_bsc``) are not supported on ``tpu``: moving one
to tpu, creating one there, or any op on one raises a ``NotImplementedError`` that names
sparse tensors, the layout and the ATen op, instead of PyTorch's generic "Could not run
... with arguments from the 'SparseCsrtpu' backend" or a half-built tensor that fails
later ("values expected sparse tensor layout but got SparseCsr").
"""

from __future__ import annotations

import torch

_libs = []

_LAYOUTS = {"SparsePrivateUse1": "torch.sparse_coo",
            "SparseCsrPrivateUse1": "a compressed sparse layout (torch.sparse_csr/csc/bsr/bsc)"}


def _fallback_for(key: str):
    def fallback(keyset, op, *args, **kwargs):
        raise NotImplementedError(
            f"torchtpu: sparse tensors are not supported on the tpu device: {op} on "
            f"{_LAYOUTS[key]}.  Convert to a dense tensor first (x.to_dense().to('tpu')), "
            "or keep the sparse computation on the CPU.")

    return fallback


def install() -> None:
    """Register the SparsePrivateUse1 and SparseCsrPrivateUse1 fallbacks (once)."""
    if _libs:
        return
    fb = torch.library.Library("_", "IMPL")
    for key in _LAYOUTS:
        fb.fallback(_fallback_for(key), dispatch_key=key, with_keyset=True)
    _libs.append(fb)
