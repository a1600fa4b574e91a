"""First calls of constant factories without an XLA compile.

A factory that fills a new tensor with one value (``zeros``, ``ones``, ``full``, their
``_like`` forms, ``scalar_tensor``) otherwise compiles a per-op executable for its exact
shape and dtype on its first call: 20-40 ms of XLA compile on the CPU platform for a
program that writes a constant.  A model's first step makes many such tensors once
(an optimizer's state: one ``zeros_like`` per parameter shape; HF's attention masks and
cache positions), so in a fresh process their compiles are a visible part of the first
step.

Here the **first** call of such a signature (per-op executable cache miss) makes its
array on the host with numpy and transfers it (``runtime.put_host``: no compile and no
host sync; values from PyTorch's own ``torch.full`` of one element, so the dtype inferred
from the fill value and its rounding are PyTorch's).  The signature's **second** call
compiles its executable as before, so a loop that makes the same tensor every step runs
the compiled fill from then on (a device-side fill is cheaper than a transfer for every
call after the first).  Only results of at most ``MAX_BYTES`` bytes, strided layout,
contiguous results (a ``_like`` of a non-contiguous tensor keeps the compiled path, which
gives PyTorch's preserved strides), and real dtypes.  The host values of results up to
64 KiB are remembered beside their device array (``storage.remember_host_copy``), as
for uploads: shape buckets pad them without a sync.

Not used by DeferAndFuse (it records the op into its segment) or inside a bucketed run.

Counters: ``torchtpu.metrics()["host_fills"]``: ``runs`` (first calls filled on the host)
and ``bytes``.  ``TORCHTPU_HOST_FILLS=0`` turns this off.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from torchtpu import _metrics
from torchtpu._device import runtime
from torchtpu._tensor import storage as _st

M = _metrics.METRICS
aten = torch.ops.aten

NO = object()  # run() result: take the compiled path

MAX_BYTES = 1 << 20
_KNOWN_BYTES = 64 << 10  # host values kept beside the device array (as for uploads)
ON = [os.environ.get("TORCHTPU_HOST_FILLS", "1").strip() not in ("0", "")]

# op -> (position of the input tensor of a _like form or None, default fill value or
# None when the fill value is an argument)
OPS = {
    aten.zeros.default: (None, 0),
    aten.ones.default: (None, 1),
    aten.full.default: (None, None),
    aten.zeros_like.default: (0, 0),
    aten.ones_like.default: (0, 1),
    aten.full_like.default: (0, None),
    aten.scalar_tensor.default: (None, None),
}
_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                     torch.int64, torch.float16, torch.bfloat16, torch.float32,
                     torch.float64})
_KEEP = (None, torch.preserve_format, torch.contiguous_format)
_filled: set = set()  # signatures whose first call was filled on the host
_LIMIT = 100_000


def set_enabled(enabled: bool) -> None:
    """Switch host fills of first factory calls on or off (and forget the signatures
    filled so far)."""
    ON[0] = bool(enabled)
    _filled.clear()


def run(plan, vals, key, index: int):
    """The first call of factory signature ``key`` (``plan.op`` in :data:`OPS`, ``vals``
    its normalized arguments, ``index`` the result's ``tpu`` index) made on the host, or
    :data:`NO` (a signature met before, a result this does not cover, a value or dtype
    PyTorch refuses: the compiled path runs, and raises as PyTorch does)."""
    if key in _filled:
        return NO
    like, default = OPS[plan.op]
    args = dict(zip(plan.sig.names, vals))
    if plan.sig.out_args or args.get("layout") not in (None, torch.strided) \
            or args.get("pin_memory"):
        return NO
    dtype = args.get("dtype")
    if like is not None:
        x = vals[like]
        if not isinstance(x, torch.Tensor) or (
                args.get("memory_format") not in _KEEP
                or (args.get("memory_format") is not torch.contiguous_format
                    and not x.is_contiguous())):
            return NO
        size = tuple(x.shape)
        if dtype is None:
            dtype = x.dtype
    elif plan.op is aten.scalar_tensor.default:
        size = ()
    else:
        size = args.get("size")
        if not isinstance(size, (list, tuple)) or not all(isinstance(k, int) and k >= 0
                                                           for k in size):
            return NO
        size = tuple(size)
        if dtype is None and plan.op is not aten.full.default:
            dtype = torch.get_default_dtype()
    value = default
    if value is None:
        value = args.get("fill_value", args.get("s"))
    if not isinstance(value, (bool, int, float)):
        return NO
    if dtype is None and plan.op is aten.scalar_tensor.default:
        dtype = torch.get_default_dtype()
    try:  # PyTorch's own dtype inference and rounding of the fill value
        one = torch.full((1,), value, dtype=dtype)
    except (RuntimeError, TypeError, OverflowError):
        return NO
    if one.dtype not in _DTYPES:
        return NO
    nbytes = math.prod(size) * one.element_size()
    if nbytes > MAX_BYTES:
        return NO
    from torchtpu.eager import handlers  # (handlers imports the executor, which imports us)

    h = handlers.host_array(one)
    host = np.full(size, h[0], dtype=h.dtype)
    arr = runtime.put_host(host, index)
    if nbytes <= _KNOWN_BYTES:
        _st.remember_host_copy(arr, host)
    if len(_filled) > _LIMIT:
        _filled.clear()
    _filled.add(key)
    M.host_fills["runs"] += 1
    M.host_fills["bytes"] += nbytes
    return _st.wrap(arr, index, one.dtype)
