"""Memory-overlap checks of writes, as PyTorch's ``ATen/MemoryOverlap.cpp``.

A tpu write computes the whole result from the inputs first, then stores it through the
destination view, so a source that partially overlaps its destination would read the
old values where CPU's kernel reads the ones it just wrote.  PyTorch refuses those
calls; so do we, with PyTorch's messages and rules:

* ``has_internal_overlap``: NO for a non-overlapping dense tensor, YES when a dimension
  of size > 1 has stride 0 (an expanded tensor), else TOO_HARD (not checked).
* ``get_overlap_status(a, b)``: FULL for the same memory with the same strides, PARTIAL
  when their byte ranges intersect otherwise, NO when disjoint; TOO_HARD (not checked)
  when either is not non-overlapping and dense.

The executor calls :func:`check_writes` once per executable signature (the signature
holds the storage sharing and every view's offset and strides), so the hot path pays
nothing.
"""

from __future__ import annotations

import torch

NO, YES, TOO_HARD = 0, 1, 2
FULL, PARTIAL = 3, 4

PARTIAL_MSG = ("unsupported operation: some elements of the input tensor and the written-to "
               "tensor refer to a single memory location. Please clone() the tensor before "
               "performing the operation.")
INTERNAL_MSG = ("unsupported operation: more than one element of the written-to tensor refers "
                "to a single memory location. Please clone() the tensor before performing the "
                "operation.")


def has_internal_overlap(t: torch.Tensor) -> int:
    """PyTorch's ``at::has_internal_overlap``: ``NO``, ``YES`` or ``TOO_HARD``."""
    return torch._debug_has_internal_overlap(t)


def overlap_status(a: torch.Tensor, b: torch.Tensor) -> int:
    """PyTorch's ``at::get_overlap_status(a, b)``: ``FULL``, ``PARTIAL``, ``NO`` or
    ``TOO_HARD`` (byte ranges within one storage; different storages never overlap)."""
    if a is b:
        return FULL
    if a.numel() == 0 or b.numel() == 0:
        return NO
    if a.untyped_storage()._cdata != b.untyped_storage()._cdata:
        return NO
    if has_internal_overlap(a) != NO or has_internal_overlap(b) != NO:
        return TOO_HARD
    ab = a.storage_offset() * a.element_size()
    ae = ab + a.numel() * a.element_size()
    bb = b.storage_offset() * b.element_size()
    be = bb + b.numel() * b.element_size()
    if ab == bb and ae == be:
        return FULL if a.stride() == b.stride() else PARTIAL
    if ab < be and bb < ae:
        return PARTIAL
    return NO


def iter_tensors(v):
    """The tensors of one argument value: a Tensor, or the tensors of a list/tuple."""
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            if isinstance(x, torch.Tensor):
                yield x


# Ops whose CPU kernel refuses even a full overlap of a read tensor with the written one
# (``at::assert_no_overlap``): index_put_ (self and values), cat.out (out and inputs).
_NO_FULL_OVERLAP = frozenset({"index_put", "_index_put_impl", "_unsafe_index_put", "cat"})
# In-place ops that write one value everywhere: writing it through an expanded tensor
# gives what CPU gives.
_UNIFORM_WRITES = frozenset({"fill_", "zero_"})


def check_writes(op, mutated: list, out_args: list, vals: list, random: bool = False) -> None:
    """Raise as PyTorch's CPU kernel would for the writes of one call of ``op``.

    Args:
        op: the ``OpOverload`` (its name picks the rules above).
        mutated: indices in ``vals`` of the written arguments; ``out_args`` those that
            are ``out=`` arguments.
        vals: the normalized arguments (tensors on tpu).
        random: the op draws random numbers (a random fill of an expanded tensor keeps
            one of its draws per element, as CPU does).

    Raises:
        RuntimeError: a written tensor partially overlaps a read tensor (PyTorch's
            ``assert_no_partial_overlap``; for index_put_/cat also a full overlap), or an
            ``out=`` / ``copy_`` destination overlaps itself (``assert_no_internal_overlap``).
        NotImplementedError: any other in-place write into a tensor whose elements share
            memory (an expanded tensor): CPU's result depends on its write order.
    """
    written = [(i, t) for i in mutated for t in iter_tensors(vals[i])]
    if not written:
        return
    name = op._schema.name.split("::")[-1]
    for i, w in written:
        if has_internal_overlap(w) == YES:
            if i in out_args or name == "copy_":
                raise RuntimeError(INTERNAL_MSG)
            if not random and name not in _UNIFORM_WRITES:
                raise NotImplementedError(
                    f"torchtpu: {op} writing into a tensor whose elements share memory (an "
                    f"expanded tensor of shape {list(w.shape)}, strides {list(w.stride())}): "
                    f"CPU's result depends on its write order. clone() it first.")
    storages = {t.untyped_storage()._cdata for _, t in written}
    no_full = name.rstrip("_") in _NO_FULL_OVERLAP
    for j, v in enumerate(vals):
        if j in mutated:
            continue
        for r in iter_tensors(v):
            if r.device.type != "tpu" or r.untyped_storage()._cdata not in storages:
                continue
            for _, w in written:
                s = overlap_status(w, r)
                if s == PARTIAL or (s == FULL and no_full):
                    raise RuntimeError(PARTIAL_MSG)


def foreach_in_order(vals: list, mutated_list: int, kinds_list: list) -> bool:
    """Whether an in-place ``_foreach_*_`` call must run element by element, as PyTorch's
    per-element kernel does, instead of as one executable that reads every element before
    writing any.

    ``vals``: the normalized arguments (tpu tensors); ``mutated_list``: the index of the
    written ``Tensor[]`` argument; ``kinds_list``: for each argument, whether it is a
    ``Tensor[]`` (element ``e`` reads its ``e``-th tensor) rather than one tensor every
    element reads.

    True when the element order can show: a written tensor overlaps another written one
    (the same tensor twice is updated twice on CPU), a tensor that another element reads,
    or, within its own element, a tensor it does not fully overlap (CPU's element op
    raises or reads its own writes); or a written tensor overlaps itself (CPU's element
    op raises).  Once per executable signature, which holds the storage sharing and the
    views, so the answer holds for every call with that signature.
    """
    written = [w for w in vals[mutated_list] if isinstance(w, torch.Tensor)]
    if any(has_internal_overlap(w) != NO for w in written):
        return True
    storages = {w.untyped_storage()._cdata for w in written}
    if len(storages) < len(written):
        for e, w in enumerate(written):
            for f in range(e):
                if overlap_status(w, written[f]) != NO:
                    return True
    for j, v in enumerate(vals):
        if j == mutated_list:
            continue
        if kinds_list[j]:
            reads = [(e, r) for e, r in enumerate(v) if isinstance(r, torch.Tensor)]
        elif isinstance(v, torch.Tensor):
            reads = [(None, v)]
        else:
            continue
        for e, r in reads:
            if r.device.type != "tpu" or r.untyped_storage()._cdata not in storages:
                continue
            for f, w in enumerate(written):
                s = overlap_status(w, r)
                if s != NO and not (s == FULL and e == f):
                    return True
    return False
