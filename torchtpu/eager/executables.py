"""Per-op executables and their cache: what a compiled signature is, how it is called,
and the in-place donation rule.

* :class:`Executable`: one compiled per-op executable and the facts needed to wrap its
  results (the C++ hot path reads its slots directly: keep it a ``__slots__`` class);
* :data:`CACHE`: signature key -> :class:`Executable`, bounded
  (``_device.executable_limit``); dropping an entry drops the hot path's tables;
* :func:`first_call` (quick-tier compile, signature cache), :func:`run_executable`,
  :func:`through_jit` (an input structure the signature does not capture);
* :func:`call_donating`: a hot in-place signature hands XLA the written storages' old
  arrays when nothing else holds them.

Split out of ``eager/executor.py`` (which plans ops and keys their calls).
"""

from __future__ import annotations

import itertools
from sys import getrefcount as _getrefcount

from torchtpu import _metrics
from torchtpu._device import executable_limit as _executable_limit
from torchtpu._device import runtime
from torchtpu._tensor import storage as _st
from torchtpu.eager import async_compile as _async
from torchtpu.eager import hotpath as _hot
from torchtpu.eager import inflight as _inflight
from torchtpu.eager import signature_cache as _sigcache
from torchtpu.eager import tiers as _tiers
from torchtpu.eager.modes import CONFIG

M = _metrics.METRICS


_SERIALS = itertools.count()


class Executable:
    """A compiled per-op executable and what is needed to wrap its results.

    Attributes:
        call: ``call(arrays, dyn) -> tuple of arrays`` (new storage arrays first).
        out_meta: ``(size, stride, dtype, perm)`` per new output tensor.
        writes: storage slots written back, in the order of the returned arrays.
        resize: for ``out=`` calls whose out tensors need resizing first, their shapes.
    """

    __slots__ = ("call", "out_meta", "writes", "device_index", "resize", "compiled", "traced",
                 "out_avals", "name", "check_info", "groups", "key", "jitted", "calls",
                 "donating", "serial", "hot_refs")

    def __init__(self, call, out_meta, writes, device_index, resize=None):
        self.compiled = False
        self.traced = None  # the pure function (DeferAndFuse composes these)
        self.out_avals = None
        self.name = ""
        self.check_info = ()  # device checks (exception type, message), see ops._checks
        self.groups = None  # Tensor[] results: per ATen output, its list length (else None)
        self.key = None  # the signature (executor cache key): names it on disk
        self.jitted = None  # the jax.jit function (ex.call may be a loaded executable)
        self.calls = 0  # calls so far (a hot in-place signature donates, see call_donating)
        # never reused, unlike id(): DeferAndFuse keys its fused segments on it, and an
        # evicted executable's address can be a new one's (executable_limit)
        self.serial = next(_SERIALS)
        # the variant donating the written storages' old arrays (False: too small to)
        self.donating = None
        self.hot_refs = []  # (table, hot key) of the hot-path entries naming it (hotpath.put)
        self.call = call
        self.out_meta = out_meta
        self.writes = writes
        self.device_index = device_index
        self.resize = resize


CACHE = _executable_limit.LRUCache()  # per-op executables, bounded (see its module)
CACHE.on_drop = _hot.drop  # the hot path's tables never outlive an executable here


def cache_info() -> dict:
    return {"entries": len(CACHE)}


def clear_cache():
    CACHE.clear()


def first_call(ex, arrays, dyn):
    """An executable's first call traces and compiles, at the quick tier where the
    platform has one (``eager.tiers``); the signature's next call recompiles it at the
    full tier and sets ``ex.call`` to the fully optimized executable."""
    key = ex.key
    entry = _sigcache.entry(key, ex.device_index) if key is not None else None
    options = None
    if key:
        M.op_executables[str(key[0])] += 1
        options = _tiers.elementwise_options(key[0])
    if _async.enabled() and not CONFIG.defer and not CONFIG.debug_sync \
            and _tiers.quick_options() is None \
            and (entry is None or not entry.stored("full")):
        # compiled and first run on a worker; its results are pending values (an
        # executable an earlier process stored is loaded and run here, below)
        return _async.first_call(ex, arrays, dyn, entry, _save_full, options)
    _async.settle_list(arrays)
    outs, ex.call = _tiers.first_call(ex.call, (arrays, dyn),
                                      lambda full: setattr(ex, "call", full),
                                      entry, ex.check_info, options)
    ex.compiled = True
    return outs


def _save_full(entry, compiled, check_info, pc_hits_before):
    entry.save("full", compiled, check_info, pc_hits_before)


def run_executable(ex, arrays, dyn):
    """Run per-op executable ``ex`` on storage ``arrays`` and host values ``dyn``
    (DeferAndFuse replays a segment's ops through this): its results, as a tuple."""
    if not ex.compiled:
        return first_call(ex, arrays, dyn)
    # (an earlier node's first call may still compile on a worker, eager.async_compile:
    # its pending values are waited for here, as a built executable takes arrays only)
    _async.settle_list(arrays)
    try:
        return ex.call(arrays, dyn)
    except TypeError:
        return through_jit(ex, arrays, dyn)


def concrete_outputs(outs) -> tuple:
    """``outs`` with the pending values of first calls compiling on a worker
    (``eager.async_compile``) waited for: arrays only."""
    return _async.concrete(outs)


def through_jit(ex, arrays, dyn):
    """Called while handling a TypeError of ``ex.call``: a call whose inputs' structure
    the signature does not capture (``jax.jit`` traces such a call again; a ``Compiled``
    from the signature cache refuses it).  Run it, and the signature's later calls,
    through ``jax.jit`` (``ex.jitted``), and count it
    (``metrics()["signature_cache"]["structure_mismatches"]``: a key that should name
    more); re-raise when ``ex.call`` is ``jax.jit`` already."""
    if ex.jitted is None or ex.call is ex.jitted:
        raise
    M.signature_cache["structure_mismatches"] += 1
    ex.call = ex.jitted
    return ex.call(arrays, dyn)


# An in-place (or out=) signature called more than this many times runs a second
# executable that donates the written storages' old arrays to XLA, which then updates them
# in place instead of copying the whole storage (x[i] = row on a large x: ~28 -> 12 us on
# CPU).  Not from the first call: a signature used a few times (tests looping over shapes)
# would pay a second compile for nothing.
DONATE_AFTER = 4
# ... and only when the written storages hold at least this many bytes together: below it
# the copy costs less than a microsecond, while the donating variant costs a trace and a
# compile per signature (a loop over small shapes met 0.5-5 ms of that per signature).
DONATE_MIN_BYTES = 64 * 1024
# sys.getrefcount of a storage array nobody else holds, seen from call_donating: the
# storage's ``arr``, the call's ``arrays`` list, the local ``a`` and getrefcount's argument
_REFS_IF_ONLY_STORAGE = 4


def call_donating(ex, arrays, dyn):
    """Run ``ex`` handing XLA the old arrays of the storages it writes, when nothing but
    those storages references them (no other storage sharing the array, no array handed
    out by ``to_jax``, no host view of it): the array is then dead once the op returns,
    as after an in-place kernel on CUDA.  Otherwise the ordinary, copying executable runs.
    Donated arrays are counted in ``metrics()["donated_buffers"]``."""
    d = ex.donating
    if d is False:
        return ex.call(arrays, dyn)
    # (inflight.clear_last, inlined) the previous op's results: replaced after this call anyway
    _inflight.LAST_OUTPUTS = ()
    for j in ex.writes:
        a = arrays[j]
        if a is None or a.__class__ is _st.Lazy or _getrefcount(a) > _REFS_IF_ONLY_STORAGE:
            return ex.call(arrays, dyn)
    if d is None:
        if sum(arrays[j].nbytes for j in ex.writes) < DONATE_MIN_BYTES:
            ex.donating = False  # too small to be worth a second executable
            return ex.call(arrays, dyn)
        d = ex.donating = donating_variant(ex, len(arrays))
        M.donated_buffers += len(ex.writes)
        with _metrics.compile_kind("op_donating"):  # its first call compiles it
            return d(*arrays, dyn)
    M.donated_buffers += len(ex.writes)
    return d(*arrays, dyn)


def donating_variant(ex, n_arrays):
    """``ex.traced`` jitted with the written storage arrays donated: called as
    ``f(*arrays, dyn)`` (donation is per positional argument)."""
    from jax.sharding import SingleDeviceSharding

    jax = runtime.jax()
    traced = ex.traced

    def donating(*args):
        return traced(list(args[:n_arrays]), args[n_arrays])

    sharding = SingleDeviceSharding(runtime.jax_device(ex.device_index))
    return jax.jit(donating, out_shardings=sharding, donate_argnums=tuple(ex.writes))
