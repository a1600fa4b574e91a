"""Host reads and device-side check verification of ``tpu`` tensors: what a sync point
does (``.cpu()``, ``.item()``, ``torch.tpu.synchronize``, a JAX view of a tensor).

* :func:`to_jax`: the JAX array holding a tensor's elements (a view's elements are read
  by one small executable per view geometry, its offset an argument);
* :func:`to_numpy`: the same on the host, a sync point counted by cause (it ends a
  pending DeferAndFuse segment first and verifies the pending device-side checks);
* :func:`check_pending` / :func:`report_device_checks`: the device-side error flags of
  executables run so far (``eager.inflight.PENDING_CHECKS``), raised as CPU's errors;
* :func:`retype`: a storage's bytes reinterpreted as another dtype (device op).

Split out of ``eager/executor.py`` (which runs ops): nothing here plans or runs an op.
"""

from __future__ import annotations

import numpy as np
import torch

from torchtpu import _metrics
from torchtpu._device import executable_limit as _executable_limit
from torchtpu._device import runtime
from torchtpu._tensor import storage as _st
from torchtpu.eager import buckets as _buckets
from torchtpu.eager import defer as _defer
from torchtpu.eager import inflight as _inflight

M = _metrics.METRICS
_PENDING = _inflight.PENDING_CHECKS  # (one list for the process: appended in place)

_READERS = _executable_limit.LRUCache(share=0.25)  # one executable per view geometry


def to_jax(t: torch.Tensor):
    """The JAX array holding the elements of ``tpu`` tensor ``t`` (its own shape)."""
    sd = _st.data(t)
    offs = []
    spec = _st.dynamic_view_spec(t, sd, offs)
    arr = sd.get()
    if len(spec) == 2:
        return arr
    f = _READERS.get(spec)
    if f is not None:
        _READERS.move_to_end(spec)
    else:  # one reader per view geometry; the offset is an argument
        f = _READERS.put(spec, runtime.jax().jit(lambda a, o, _s=spec: _st.read_view(a, _s, o)))
    return f(arr, np.asarray(offs, dtype=np.int32))


def report_device_checks(flags, info, where) -> None:
    """Queue device-side checks computed by an executable that is not a per-op one (a
    torch.compile graph): ``flags`` is a bool[n] array (or a DeferAndFuse ``Lazy``),
    ``info`` the ``(exception type, message)`` per flag, ``where`` what to name in the
    error.  They are verified at the next sync point, like a per-op executable's."""
    if _inflight.add_check(flags, info, where):
        check_pending()


def check_pending(upto=None) -> None:
    """Verify the device-side checks of every op run so far (a sync on their flags);
    raise the first failure as PyTorch's CPU kernel would have (``ops._checks``).  With
    ``upto`` (an ``inflight.mark()``): only the checks queued up to that mark (work
    dispatched before it), later ones stay queued for the next sync point."""
    if not _PENDING:
        return
    pending = _inflight.take_checks(upto)
    if not pending:
        return
    flags = []
    for flag, info, op in pending:
        if flag.__class__ is _st.Lazy:
            if flag.value is None and flag.node is not _st.ASYNC:
                _defer.flush("device_check")
            flag = _st.settle(flag)
        flags.append(flag)
    # one transfer per flag array, all started before the first is waited for; no new
    # device op: one would queue behind work dispatched since (e.g. a DeferAndFuse
    # optimizer segment) and make this sync wait for it, and a concatenation of the
    # flags compiled a program for each new count of them (~0.1 s each)
    if len(flags) > 1:
        for f in flags:
            start = getattr(f, "copy_to_host_async", None)  # (a JAX array)
            if start is not None:
                start()
    allbad = np.concatenate([np.asarray(f) for f in flags])
    if not _PENDING:
        _defer.checks_verified()
    if not allbad.any():
        return
    pos = 0
    first = None
    for (flag, info, op), f in zip(pending, flags):
        bad = allbad[pos:pos + f.shape[0]]
        pos += f.shape[0]
        if bad.any():
            exc, msg = info[int(np.argmax(bad))]
            error = exc(f"{msg} (in {op}; detected on the device, reported at this sync point)")
            if first is None:
                first = error
        if first is not None:
            # what a stitched step made from the failed values, or after them (its
            # guard saw the device's failed-check flag), raises when read
            _defer.poison(flag, first if not bad.any() else error)
    raise first


_RETYPERS = _executable_limit.LRUCache(share=0.125)


def retype(arr, dtype: torch.dtype, shape: tuple):
    """``arr``'s bytes reinterpreted as ``dtype`` elements of ``shape`` (device op)."""
    key = (arr.shape, arr.dtype, dtype, shape)
    f = _RETYPERS.get(key)
    if f is None:
        f = _RETYPERS.put(key, runtime.jax().jit(
            lambda a: _st._bitcast(a.reshape(-1), dtype).reshape(shape)
        ))
    return f(arr)


def to_numpy(t: torch.Tensor, cause: str, checks_upto=None) -> np.ndarray:
    """Copy ``tpu`` tensor ``t`` to a host numpy array (a sync point, counted by cause).
    ``checks_upto``: an ``inflight.mark()`` taken when ``t``'s producer was dispatched:
    only the device-side checks queued up to it are verified (:func:`check_pending`), so
    the read does not wait for work dispatched after ``t``'s (by default: all)."""
    if _defer.pending_ops():
        # A host read ends the segment even when ``t`` is already computed: the pending
        # ops (e.g. an optimizer step after the forward that produced a logged loss) are
        # dispatched now, asynchronously, so every training step cuts at the same point
        # and the host does not wait for them.
        _defer.flush(cause)  # counts the sync
    else:
        M.sync(cause)
    check_pending(checks_upto)
    p = _st.data(t).arr
    if p.__class__ is _st.Padded and _buckets.whole(t):  # the front of a bucketed array
        arr = p.host(tuple(t.shape))
        M.transfers_to_host_bytes += arr.nbytes
        return arr
    sd = _st.data(t)
    if p.__class__ is _st.Grown and t.dtype is sd.dtype:  # capacity to the host, cut there
        host = p.host(sd.shape)
        M.transfers_to_host_bytes += host.nbytes
        return _st.read_view_host(host, t)
    if (t.dtype is sd.dtype and sd.nbytes <= _HOST_VIEW_READ_BYTES
            and len(_st.view_spec(t, sd)) != 2):
        # a view of a small storage: the whole storage comes to the host (one transfer,
        # kept by the array for later reads) and the view is cut there, instead of a
        # reader executable per view geometry (``x[i].item()`` in a loop over shapes)
        host = np.asarray(sd.get())
        M.transfers_to_host_bytes += host.nbytes
        return _st.read_view_host(host, t)
    arr = np.asarray(to_jax(t))
    M.transfers_to_host_bytes += arr.nbytes
    return arr


# Views of storages up to this size are read to the host whole (``to_numpy``).
_HOST_VIEW_READ_BYTES = 1 << 20
