"""Strict eager executor: every ATen op that reaches the ``tpu`` backend runs here.

PyTorch calls :func:`dispatch` (registered as the boxed fallback kernel of the
PrivateUse1 dispatch key) with the ``OpOverload`` and its arguments.  Each overload gets
a :class:`Plan` once, chosen in this order:

1. a handler in ``torchtpu.eager.handlers`` (factories, copies, ``item``, resize...);
2. a view op: PyTorch's own CPU view kernel, re-dispatched (metadata only: the result
   shares the storage, exactly as on CPU);
3. a lowering from ``torchtpu.ops`` (functional ops), or a mutable op (``add_``,
   ``add.out``) whose functional variant is lowered;
4. a PyTorch decomposition (``torch._decomp``), whose pieces dispatch back here;
5. otherwise ``NotImplementedError`` naming the op, or the opt-in CPU fallback.

A lowered op runs as one compiled XLA executable per *signature* (op, argument views,
dtypes, static arguments, device): the views of the inputs are read and the mutated
storages written inside that executable, so views and in-place ops cost no extra
dispatch.  The output metadata (dtype, shape, strides) comes from PyTorch's meta kernel,
run once per signature; its errors are PyTorch's errors.  Dispatch is asynchronous: the
host never waits for device results except at sync points (``item``, ``.cpu()``...).
"""

from __future__ import annotations

import itertools
import time
import warnings
from weakref import ref as _weakref

import numpy as np
import torch

from torchtpu import _metrics
from torchtpu._device import runtime, state
from torchtpu._tensor import native as _native
from torchtpu._tensor import overlap as _overlap
from torchtpu._tensor import storage as _st
from torchtpu.eager import async_compile as _async
from torchtpu.eager import buckets as _buckets
from torchtpu.eager import defer as _defer
from torchtpu.eager import executables as _ex
from torchtpu.eager import growth as _growth
from torchtpu.eager import hotpath as _hot
from torchtpu.eager.host_reads import check_pending, to_jax
from torchtpu.eager import inflight as _inflight
from torchtpu.eager import keying as _keying
from torchtpu.eager import padded as _padded
from torchtpu.eager import modes as _modes
from torchtpu.eager.modes import CONFIG
from torchtpu.ops import set_plan_runner as _set_plan_runner
from torchtpu.ops._schema import (  # noqa: F401  (re-exported: eager's names)
    GEN, OPT_SCALAR, OPT_T, OPT_T_LIST, SCALAR, SCALAR_LIST, STATIC, T, T_LIST, Signature,
    call_lowering,
)
from torchtpu.ops._schema import flatten as _flatten
from torchtpu.ops._util import scalar_type_name

M = _metrics.METRICS
# device-side checks not verified yet (``inflight.PENDING_CHECKS``, one list for the whole
# process): the per-op paths append to it directly
_PENDING = _inflight.PENDING_CHECKS
_CHECK_LIMIT = _inflight.CHECK_LIMIT
aten = torch.ops.aten
_matmul_precision = torch._C._get_float32_matmul_precision

_increment_version = torch._C._increment_version  # (tensors): autograd's _version += 1
_modes.get_eager_mode()  # the start-up mode (TORCHTPU_EAGER_MODE) applied to CONFIG


# ------------------------------------------------------------------ errors and helpers


def describe(vals) -> str:
    parts = []
    for v in vals:
        if isinstance(v, torch.Tensor):
            parts.append(f"Tensor{list(v.shape)}:{v.dtype}:{v.device}")
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            parts.append("[" + describe(v) + "]")
        else:
            parts.append(repr(v))
    return ", ".join(parts)




def _meta_of(v):
    if isinstance(v, torch.Tensor):
        if v.device.type == "meta":
            return v
        return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)):
        return type(v)(_meta_of(x) for x in v)
    if isinstance(v, torch.device):
        return torch.device("meta")
    return v


def _cpu_stand_in(v):
    if isinstance(v, torch.Tensor):
        if v.device.type == "meta":
            return torch.zeros((), dtype=v.dtype).expand(v.shape)
        return v
    if isinstance(v, (list, tuple)):
        return type(v)(_cpu_stand_in(x) for x in v)
    if isinstance(v, torch.device) and v.type == "meta":
        return torch.device("cpu")
    return v


def _raise_cpu_error(sig, op, meta_vals):
    """When a meta kernel rejects a call, raise the error CPU gives for it instead (same
    type and message as on CPU), by running the op on memory-free CPU stand-ins.
    Returns CPU's output when CPU accepts the call."""
    stand_ins = [_cpu_stand_in(v) for v in meta_vals]
    for attempt in range(2):
        try:
            out = call_op(sig, op, stand_ins)
        except Exception as cpu_err:
            if "single memory location" not in str(cpu_err):
                raise cpu_err.with_traceback(None) from None
            # an artifact of the stand-ins (an in-place op writing an expanded tensor):
            # once more with real (small) tensors for the written arguments
            def real(v):
                if isinstance(v, torch.Tensor) and v.numel() <= (1 << 20):
                    return torch.zeros(v.shape, dtype=v.dtype)
                return v

            for i in sig.mutated:
                v = meta_vals[i]
                stand_ins[i] = (type(v)(real(x) for x in v) if isinstance(v, (list, tuple))
                                else real(v))  # (a written Tensor[]: in-place list ops)
        else:
            return out


_NUMBER_DTYPE = {bool: torch.bool, int: torch.int64, complex: torch.complex64}


def _meta_number(v):
    """A 0-d meta tensor standing for the Python number ``v`` (its default dtype)."""
    return torch.empty((), dtype=_NUMBER_DTYPE.get(type(v)) or torch.get_default_dtype(),
                       device="meta")


def _debug_checks(op, vals, outs):
    """DEBUG mode: wait for the op; optionally check for NaN/Inf and log it."""
    t0 = time.perf_counter()
    runtime.jax().block_until_ready(outs)
    M.debug_waits += 1
    if CONFIG.debug_nans:
        jnp = runtime.jax().numpy
        for o in outs:
            if jnp.issubdtype(o.dtype, jnp.inexact) and not bool(jnp.isfinite(o).all()):
                raise RuntimeError(
                    f"torchtpu debug: {op} produced NaN or Inf "
                    f"(inputs: {describe(vals)}; output shape {tuple(o.shape)})"
                )
    if CONFIG.log_ops:
        import sys

        print(f"[torchtpu] {op}({describe(vals)}) {time.perf_counter() - t0:.6f}s",
              file=sys.stderr)


def call_op(sig, op, vals):
    """Call ``op`` with normalized ``vals``, passing kwarg-only arguments by name."""
    pos = [v for v, kw in zip(vals, sig.kwarg_only) if not kw]
    kws = {n: v for n, v, kw in zip(sig.names, vals, sig.kwarg_only) if kw}
    return op(*pos, **kws)




class _Recorded:
    """What ``defer.record`` reads of a call (``index``, ``arrays``, ``dyn``): the hot
    path's form of a gathered ``_keying.Call``."""

    __slots__ = ("index", "arrays", "dyn")

    def __init__(self, index, arrays, dyn):
        self.index = index
        self.arrays = arrays
        self.dyn = dyn


_HOT_PLANS: list = []  # LoweredPlans with a hot-path table (their C++ form comes later)
_NATIVE_READY = [False]  # the C++ hot path has its objects (_native_loaded ran)


def _native_plan(plan, mod):
    """The C++ hot path of ``plan`` (``_native.cpp``'s ``HotPlan``)."""
    return mod.HotPlan([c for c, _ in plan.hot_codes],
                       list(plan.sig.defaults), list(plan.sig.names), plan.hot,
                       plan.lowering.prepare, plan.op, bool(plan.lowering.precision),
                       bool(plan.sig.mutated), list(plan.sig.mutated_returns),
                       plan.sig.nret, list(plan.sig.bumped_lists),
                       getattr(plan.lowering.prepare, "skip_at_defaults", None))


def _hot_donating(ex, arrays, dyn):
    try:
        return _ex.call_donating(ex, arrays, dyn)
    except TypeError:
        return _ex.through_jit(ex, arrays, dyn)


def _hot_other_structure(ex, arrays, dyn):
    try:
        return ex.call(arrays, dyn)
    except TypeError:
        return _ex.through_jit(ex, arrays, dyn)


def _hot_wrap_permuted(ex, arr, meta):
    size, stride, dtype, _ = meta
    st = _st.new_storage(tuple(arr.shape), dtype, ex.device_index, arr)
    return _st.tensor_on(st, size, stride, 0, dtype)


def _group_results(results, groups):
    it = iter(results)
    return [list(itertools.islice(it, n)) if n is not None else next(it) for n in groups]


def _native_loaded(mod):
    """The C++ helper is loaded: hand its hot path our objects, and give every plan with
    a hot-path table its C++ form."""
    mod.hot_setup({
        "array_cls": _hot._ARRAY[0], "storage_data_cls": _st.StorageData,
        "executable_cls": _ex.Executable, "allocator": _st.ALLOCATOR,
        "lazy_cls": _st.Lazy,
        "asarray": np.asarray, "np_bool": np.bool_, "np_int": np.int64,
        "np_float": np.float64, "np_complex": np.complex128,
        "default_marker": _hot._DEFAULT, "miss": _hot.MISS,
        "inflight": _inflight, "cache": _ex.CACHE,
        "call_donating": _hot_donating, "call_other": _hot_other_structure,
        "wrap_other": _hot_wrap_permuted, "group_results": _group_results,
        "check_pending": check_pending, "next_addr": _st._next_addr,
        "matmul_precision": _matmul_precision, "donate_after": _ex.DONATE_AFTER,
        "addr_align": _st._ADDR_ALIGN, "check_limit": _CHECK_LIMIT,
        "defer_record": _defer.record_arrays,  # (ex, arrays, dyn): DEFER's recording
    })
    _NATIVE_READY[0] = True
    for plan in _HOT_PLANS:
        plan.native = _native_plan(plan, mod)
    _native_kernels(mod)


def _native_kernels(mod):
    """Register the C++ helper's kernels for every op with its own PrivateUse1 kernel
    (``_device.DIRECT_KERNELS``; ``_native.cpp``, "C++ op kernels"): a call that strict
    eager's hot path finishes then has no Python frame of ours.  They replace the Python
    kernels for the rest of the process (``TORCHTPU_HOT_PATH_NATIVE=0`` or
    ``hotpath.set_native(False)`` sends every call back to the Python runner)."""
    from torchtpu import _device

    mod.set_kernel_switches(CONFIG, _hot.ENABLED, _hot.NATIVE)
    mod.register_kernels([name for name, _ in _device.DIRECT_KERNELS],
                         [_device.qualified_name(op) for _, op in _device.DIRECT_KERNELS],
                         [_device.runner_for(op) for _, op in _device.DIRECT_KERNELS])
    _KERNELS_READY[0] = True
    for plan in list(_PLANS.values()):
        _bind_kernel(plan)


_KERNELS_READY = [False]  # the C++ op kernels are registered (_native_kernels ran)


def _bind_kernel(plan):
    """Give the C++ kernel of ``plan.op`` the plan's ``HotPlan`` when ``plan`` is the op's
    whole plan (not one wrapped by ``_CheckErrors`` or ``_LikeOtherDevice``, whose own
    steps the kernel must not skip)."""
    if (_KERNELS_READY[0] and isinstance(plan, LoweredPlan) and plan.native is not None
            and _PLANS.get(plan.op) is plan):
        from torchtpu import _device

        _native.LOADED.set_kernel_hot(_device.qualified_name(plan.op), plan.native)


def _on_native_load(mod):
    if _hot._ARRAY[0] is not None:  # else _hot_start hands it over
        _native_loaded(mod)


def _hot_start():
    """The first op run: the hot path learns JAX's array class (imported by now; not at
    this module's import, which ``import torch`` reaches through the op table) and takes
    the C++ helper if it is loaded."""
    _hot.set_array_class()
    if _hot._ARRAY[0] is not None and _native.LOADED is not None:
        _native_loaded(_native.LOADED)


class LoweredPlan:
    """Runs a lowered op (functional, in-place or ``out=``) through the executable cache.

    For a mutable op (``add_``, ``add.out``) ``lowering`` is the functional twin's; the
    executable computes it and writes each result through the view of the mutated
    argument, returning the new storage arrays (``out=`` arguments are write-only: their
    old contents are never read).
    """

    def __init__(self, op, sig, lowering, functional_sig=None):
        self.op = op
        self.sig = sig
        self.lowering = lowering
        self.fsig = functional_sig or sig  # schema of the lowered functional op
        self.writeonly = set(sig.out_args)
        self._groups = None  # set by _functional_meta for Tensor[] results
        # an in-place _foreach_*_ (ops.foreach): per argument, whether it is a Tensor[]
        # (for overlap.foreach_in_order); None for every other op
        self.in_order = [k in (T_LIST, OPT_T_LIST) for k in sig.kinds] if (
            sig.mutated_lists and op._schema.name.startswith("aten::_foreach_")) else None
        # the hot path (eager.hotpath): argument codes, hot key -> (_ex.Executable, offsets),
        # and its C++ form once the C++ helper is loaded
        self.hot_codes = _hot.codes_for(self)
        self.hot = _hot.new_table() if self.hot_codes is not None else None
        self.native = None
        self.grow = _growth.rule_for(op)  # cat / attention over grown storages, or None
        self.pad = _padded.rule_for(self)  # ops on padded sequences (eager.padded), or None
        if self.grow is not None:
            _growth.watch(self)
        if self.hot is not None:
            _HOT_PLANS.append(self)
            if _NATIVE_READY[0]:
                self.native = _native_plan(self, _native.LOADED)

    def __call__(self, args, kwargs):
        if self.hot is not None and _hot.ENABLED[0] and not (CONFIG.defer or
                                                             CONFIG.debug_sync):
            nat = self.native
            if nat is not None and _hot.NATIVE[0]:  # the C++ hot path
                r = nat(args, kwargs)
                if r.__class__ is not tuple or len(r) != 3 or r[0] is not _hot.MISS:
                    return r
                if r[1] is not None:  # normalized and prepared; r[2]: the hot gather
                    return self.run_missed(r[1], r[2], args, kwargs)
        vals = self.sig.normalize(args, kwargs)
        M.lowered_ops += 1
        if self.lowering.prepare is not None:  # host-side checks (they may convert)
            vals = self.lowering.prepare(vals)
        hot = None
        if self.hot is not None and _hot.ENABLED[0] and not CONFIG.debug_sync:
            nat = self.native
            if CONFIG.defer and nat is not None and _hot.NATIVE[0]:
                hot = nat.gather(vals, True)  # (the same hot key, built in C++)
            else:
                hot = _hot.gather(self.hot_codes, self.lowering.precision, vals,
                                  _st.Lazy if CONFIG.defer else None)
            if hot is not None:
                try:
                    ex = self.hot.get(hot[0])
                except TypeError:  # an unhashable constant argument
                    ex = hot = None
                if ex is not None:
                    return self._run_hot(ex[0], ex[1], hot, vals)
        if self.lowering.dynamic_shape:
            return self._run_dynamic(vals)
        return self._run(vals, args, kwargs, hot)

    def run_missed(self, vals, hot, args, kwargs):
        """The rest of a call that the C++ hot path missed: ``vals`` normalized and
        prepared (``prepare`` ran once, so its warnings are given once), ``hot`` its hot
        gather or None."""
        M.lowered_ops += 1
        if self.lowering.dynamic_shape:
            return self._run_dynamic(vals)
        return self._run(vals, args, kwargs, hot)

    def _run_hot(self, ex, offs, hot, vals):
        """A call whose executable the hot path knows (``eager.hotpath``): run it on the
        storages' arrays and the call's numbers, as :meth:`_run` would after its
        cache hit."""
        M.cache_hits += 1
        M.hot_path_calls += 1
        _ex.CACHE.move_to_end(ex.key)
        _, arrays, sdatas, dyn = hot
        if offs is not None:  # the views' storage offsets (fixed by the hot key)
            dyn.append(offs)
        if CONFIG.defer:  # record it (eager.defer), as the general path would
            outs = _defer.record_arrays(ex, arrays, dyn)
            if ex.check_info:
                _PENDING.append((outs[-1], ex.check_info, self.op))
                outs = outs[:-1]
            return self._finish(ex, sdatas, vals, outs)
        if not ex.compiled:  # recorded by DeferAndFuse only so far: its first call
            outs = self._first_call(ex, _Recorded(ex.device_index, arrays, dyn), vals)
        else:
            ex.calls += 1
            try:
                if ex.writes and ex.calls > _ex.DONATE_AFTER:
                    outs = _ex.call_donating(ex, arrays, dyn)
                else:
                    outs = ex.call(arrays, dyn)
            except TypeError:
                outs = _ex.through_jit(ex, arrays, dyn)
        _inflight.LAST_OUTPUTS = outs  # (inflight.dispatched, inlined: the hot path)
        if ex.check_info:
            _PENDING.append((outs[-1], ex.check_info, self.op))
            result = self._finish(ex, sdatas, vals, outs[:-1])
            if len(_PENDING) > _CHECK_LIMIT:
                check_pending()
            return result
        return self._finish(ex, sdatas, vals, outs)

    def _run(self, vals, args=None, kwargs=None, hot=None):
        """Run on normalized, prepared ``vals`` (``args``/``kwargs``: the call as made,
        for the CPU fallback and ``out=`` resizing; None for a bucketed run's own call;
        ``hot``: the call's hot-path gather, to remember the executable under)."""
        if _hot._ARRAY[0] is None:
            _hot_start()
        if self.pad is not None:  # eager.padded: run on capacity arrays
            r = _padded.run(self, vals)
            if r is not _padded.NO:
                return r
        if self.grow is not None:  # eager.growth: a cat chain, attention over capacity
            r = self.grow(self, vals)
            if r is not _growth.NO:
                return r
        c = _keying.gather(self, vals)
        key = tuple(c.key)
        ex = _ex.CACHE.get(key)
        if ex is None:
            if _buckets.ON[0] and not CONFIG.defer and not _padded._ACTIVE[0] \
                    and not c.stitched:
                # (a padded sequence's capacity call is shape-generic already)
                # an op churning through shapes: an executable shared by a bucket of sizes
                with _metrics.compile_kind("bucket"):
                    res = _buckets.run(self, vals, c)
                if res is not _buckets.NO:
                    return res
            M.cache_misses += 1
            try:
                ex = _ex.CACHE.put(key, self._build(vals, c, key))
            except _InOrder:
                if args is None:
                    raise NotImplementedError(f"torchtpu: {self.op} on aliased lists") from None
                return _foreach_in_order(self.op, args, kwargs)
            except NotImplementedError as refused:
                # a case the lowering refuses (e.g. overlapping views in a mutated list):
                # the opt-in CPU fallback runs it, as it runs ops without a lowering
                if args is None:
                    raise
                return UnsupportedPlan(self.op).fallback_or_raise(args, kwargs, refused)
        else:
            M.cache_hits += 1
            _ex.CACHE.move_to_end(key)
        if c.padded:
            c.unpad()
        if ex.resize is not None:
            # out= tensors of the wrong shape: resize as PyTorch does, then run again
            self._resize_outs(vals, ex.resize)
            if args is None:  # (a call the C++ hot path missed: its values, prepared)
                return self._run(vals)
            return self(args, kwargs)
        if hot is not None and not c.stitched:
            e = _hot.entry(hot, c, ex)
            if e is not None:  # the next such call takes the hot path
                _hot.put(self.hot, hot[0], e)
        if CONFIG.defer or c.stitched:  # (stitched: see keying.SHAPE_ONLY)
            if c.stitched:
                M.stitched_ops += 1
            outs = _defer.record(ex, c)
            if ex.check_info:
                _PENDING.append((outs[-1], ex.check_info, self.op))
                outs = outs[:-1]
            return self._finish(ex, c.sdatas, vals, outs)
        if ex.compiled:
            ex.calls += 1
            outs = None
            if c.pending:  # an input is a pending first call's value (eager.async_compile)
                if _async.compiling():
                    outs = _async.run(ex, c.arrays, c.dyn)  # on a worker, behind it
                if outs is None:
                    _async.settle_list(c.arrays)
            if outs is None:
                try:
                    if ex.writes and ex.calls > _ex.DONATE_AFTER:
                        outs = _ex.call_donating(ex, c.arrays, c.dyn)
                    else:
                        outs = ex.call(c.arrays, c.dyn)
                except TypeError:
                    outs = self._other_structure(ex, c)
        else:
            outs = self._first_call(ex, c, vals)
        _inflight.LAST_OUTPUTS = outs  # (inflight.dispatched, inlined: the per-op path)
        check = False
        if ex.check_info:
            _PENDING.append((outs[-1], ex.check_info, self.op))
            outs = outs[:-1]
            check = CONFIG.debug_sync or len(_PENDING) > _CHECK_LIMIT
        # the written storages take their new arrays before any check can raise: a
        # donated old array is gone, and the tensors must stay usable after the error
        result = self._finish(ex, c.sdatas, vals, outs)
        if check:
            check_pending()
        if CONFIG.debug_sync:
            _debug_checks(self.op, vals, outs)
        return result

    def _first_call(self, ex, c, vals):
        try:
            return _ex.first_call(ex, c.arrays, c.dyn)
        except (TypeError, ValueError) as e:
            raise RuntimeError(
                f"torchtpu: lowering {self.op} failed for ({describe(vals)}): {e}"
            ) from e

    def _other_structure(self, ex, c):
        """See :func:`_ex.through_jit` (called while handling ``ex.call``'s TypeError)."""
        return _ex.through_jit(ex, c.arrays, c.dyn)

    def _resize_outs(self, vals, shapes):
        inputs = {x.untyped_storage()._cdata for j in self.sig.tensor_idx
                  if j not in self.writeonly for x in _overlap.iter_tensors(vals[j])}
        for i, shape in zip(self.sig.out_args, shapes):
            o = vals[i]
            if tuple(o.shape) != tuple(shape) and o.untyped_storage()._cdata in inputs:
                # an out= that is also an input (x.mul_(y) arrives as mul.out(x, y, out=x))
                # cannot grow: CPU refuses instead of resizing
                raise RuntimeError(f"output with shape {list(o.shape)} doesn't match the "
                                   f"broadcast shape {list(shape)}")
            if tuple(o.shape) != tuple(shape):
                if o.numel() != 0:
                    warnings.warn(
                        f"An output with one or more elements was resized since it had shape "
                        f"{list(o.shape)}, which does not match the required output shape "
                        f"{list(shape)}. This behavior is deprecated, and in a future PyTorch "
                        f"release outputs will not be resized unless they have zero elements. "
                        f"You can explicitly reuse an out tensor t by resizing it, inplace, to "
                        f"zero elements with t.resize_(0). (op {self.op})",
                        stacklevel=_metrics.user_stacklevel(),
                    )
                o.resize_(shape)

    # -- results
    def _finish(self, ex, sdatas, vals, outs):
        nw = len(ex.writes)
        for j, arr in zip(ex.writes, outs[:nw]):
            sd = sdatas[j]
            sd.arr = arr
            if arr.__class__ is _st.Lazy:
                arr.owner = _weakref(sd)
        if self.sig.mutated:
            for i in self.sig.bumped_lists:
                _increment_version(vals[i])
            ret = self.sig.mutated_returns
            if len(ret) == 1:
                return vals[ret[0]]
            return tuple(vals[i] for i in ret) if ret else None
        results = []
        for (size, stride, dtype, perm), arr in zip(ex.out_meta, outs[nw:]):
            if perm is None:
                results.append(_st.new_tensor(arr, ex.device_index, dtype, size, stride))
            else:
                results.append(_hot_wrap_permuted(ex, arr, (size, stride, dtype, perm)))
        if ex.groups is not None:
            results = _group_results(results, ex.groups)
        if self.sig.nret == 1:
            return results[0]
        return tuple(results)

    # -- build
    def _functional_meta(self, vals):
        """Meta outputs [(size, stride, dtype)] of the functional op; runs PyTorch's own
        checks of the real op too (errors are PyTorch's)."""
        # a Python number in a Tensor slot stays a number: PyTorch wraps it as a "wrapped
        # number" 0-d tensor, which never widens a tensor's dtype within its category
        # (a 0-d bfloat16 tensor * 0.5 is bfloat16)
        numbers = [k in (T, OPT_T) and not isinstance(v, (torch.Tensor, type(None)))
                   for v, k in zip(vals, self.sig.kinds)]
        # (a generator never changes the output's shape, and PyTorch's meta references of
        # exponential_/geometric_/log_normal_/cauchy_ assert there is none)
        meta_vals = [v if num else None if isinstance(v, torch._C.Generator) else _meta_of(v)
                     for v, num in zip(vals, numbers)]
        out = None
        own_meta = self.lowering.meta if self.lowering is not None else None
        try:
            try:
                if own_meta is not None:  # PyTorch's meta kernel refuses what CPU accepts
                    out = own_meta(*meta_vals)
                elif self.sig.out_args:
                    with warnings.catch_warnings():
                        # the reference's own resize warning for the meta out= (_resize_outs
                        # gives CPU's, once, at the user's line)
                        warnings.filterwarnings("ignore", "An output with one or more "
                                                "elements was resized")
                        out = call_op(self.sig, self.op, meta_vals)
                else:
                    out = call_op(self.sig, self.op, meta_vals)
            except (TypeError, RuntimeError) as e:
                # a few ops' bindings take no number for a Tensor (special polynomials'
                # ``n``): a 0-d stand-in of the number's default dtype there
                if not (any(numbers) and "Expected a value of type 'Tensor'" in str(e)):
                    raise
                meta_vals = [_meta_number(v) if num else m
                             for v, m, num in zip(vals, meta_vals, numbers)]
                out = call_op(self.sig, self.op, meta_vals)
            if self.sig.mutated:
                fvals = [v for i, v in enumerate(meta_vals) if i not in self.writeonly]
                out = call_op(self.fsig, self.fsig.op, fvals[: len(self.fsig.args)])
        except NotImplementedError:
            if own_meta is not None:  # the lowering refuses the case (the CPU fallback
                raise                 # runs it where enabled: _run)
            return None
        except Exception as meta_err:
            if own_meta is not None:  # the lowering's own checks give CPU's errors
                raise
            if self.op.namespace != "aten":
                # an op with no CPU kernel to ask (a torchtpu.jax_op: its fake kernel is
                # jax.eval_shape, whose error names the real problem)
                raise meta_err
            cpu_out = _raise_cpu_error(self.sig, self.op, meta_vals)
            if self.sig.out_args and self.fsig is not self.sig:
                # an out= call CPU accepts and the reference rejects (``abs(complex,
                # out=<complex>)``): CPU's kernel computes the result and casts it into
                # ``out``, as the write here does
                fvals = [v for i, v in enumerate(meta_vals) if i not in self.writeonly]
                out = call_op(self.fsig, self.fsig.op, fvals[: len(self.fsig.args)])
            else:
                if self.sig.mutated or any(isinstance(v, torch.Tensor) for v in vals):
                    raise meta_err
                # a factory op whose meta kernel (PyTorch's reference) is stricter than
                # its CPU kernel (``arange(0, 2.5, 0.5, dtype=int8)``: the reference casts
                # the step to int8 and rejects 0, CPU returns 5 zeros): CPU's output
                # defines it
                out = torch.utils._pytree.tree_map_only(
                    torch.Tensor, lambda t: torch.empty_strided(
                        t.shape, t.stride(), dtype=t.dtype, device="meta"), cpu_out)
        if isinstance(out, torch.Tensor) or (not self.sig.mutated and self.sig.nret == 1):
            out = [out]  # (a single Tensor[] result, e.g. a torchtpu.jax_op, is one group)
        groups = [len(o) if isinstance(o, (list, tuple)) else None for o in out]
        self._groups = groups if any(g is not None for g in groups) else None
        out = _flatten(out)  # Tensor[] results: one entry per element
        if self.sig.mutated and not self.sig.out_args:
            # In-place: PyTorch's meta kernels skip the cast check CPU makes.
            targets = _flatten([vals[i] for i in self.sig.mutated])
            for t, o in zip(targets, out):
                dst = t.dtype
                if not torch.can_cast(o.dtype, dst):
                    _raise_cpu_error(self.sig, self.op, meta_vals)
                    raise RuntimeError(
                        f"result type {scalar_type_name(o.dtype)} can't be cast to the "
                        f"desired output type {scalar_type_name(dst)}"
                    )
        res = [(tuple(o.shape), tuple(o.stride()), o.dtype) for o in out]
        fix = self.lowering.out_dtypes if self.lowering is not None else None
        if fix is not None:  # the CPU kernel's dtypes where they differ from the meta kernel's
            dts = fix(vals, [r[2] for r in res])
            res = [(size, stride, dt) for (size, stride, _), dt in zip(res, dts)]
        return res

    def _build(self, vals, c, key):
        jax = runtime.jax()
        from torchtpu.ops._scalar import register_pytree

        register_pytree()
        out_meta = self._functional_meta(vals)
        if out_meta is None:
            raise NotImplementedError(
                f"torchtpu: {self.op} has no meta kernel; it needs a dynamic_shape lowering"
            )
        lowering = self.lowering
        kinds = self.sig.kinds
        mutated = self.sig.mutated
        out_set = self.writeonly
        if self.sig.mutated_lists and self.in_order is not None and _overlap.foreach_in_order(
                vals, self.sig.mutated_lists[0], self.in_order):
            raise _InOrder  # (_run: PyTorch's per-element kernel runs the call)
        if mutated:
            # once per signature: it holds the storage sharing and every view
            _overlap.check_writes(self.op, mutated, self.sig.out_args, vals, lowering.random)
        if out_set:
            want = [out_meta[k][0] for k in range(len(self.sig.out_args))]
            have = [tuple(vals[i].shape) for i in self.sig.out_args]
            if want != have:
                return _ex.Executable(None, None, None, c.index, resize=want)
        # Rebuild plan of the lowering's arguments from (arrays, dyn), and the writes.
        writes, write_specs, layout = [], [], []
        out_writes = set()  # positions in writes that are out= arguments
        pos = 1  # position in key after the op
        for i, v in enumerate(vals):
            k = kinds[i]
            kk = key[pos]
            pos += 1
            if k in (T, OPT_T):
                if v is None:
                    item = ("const", None)
                elif kk[0] == "cpu0":
                    if i in mutated:  # an in-place write to a CPU tensor: as CUDA, refuse
                        raise _keying.device_mismatch(self.op, torch.device("tpu", c.index),
                                                      v.device)
                    item = ("dyn",)
                elif kk[0] == "S":
                    item = ("scalar", kk[1])
                else:
                    item = ("view", kk[0], kk[1])
                    if i in mutated:
                        if i in out_set:
                            out_writes.add(len(writes))
                        writes.append(kk[0])
                        write_specs.append(kk[1])
            elif k in (T_LIST, OPT_T_LIST):
                items = []
                for x in v:
                    kx = key[pos]
                    pos += 1
                    if x is None:
                        items.append(("const", None))
                    elif kx[0] == "cpu0":
                        if i in mutated:
                            raise NotImplementedError(
                                f"torchtpu: {self.op} writes a CPU tensor in a list argument")
                        items.append(("dyn",))
                    else:
                        items.append(("view", kx[0], kx[1]))
                        if i in mutated:
                            writes.append(kx[0])
                            write_specs.append(kx[1])
                item = ("list", items)
            elif k in (SCALAR, OPT_SCALAR):
                if v is None:
                    item = ("const", None)
                elif kk[0] == "s":
                    item = ("const", _keying.key_float(kk[2]))
                else:
                    item = ("scalar", kk[1])
            elif k == GEN:
                item = ("drop",)
            elif k == SCALAR_LIST and kk.__class__ is tuple and kk[:1] == ("SL",):
                item = ("list", [("scalar", kind) for kind in kk[1]])
            else:
                item = ("const", v)
            if i not in out_set:
                layout.append(item)
        if self.sig.mutated_lists and len(set(writes)) < len(writes):
            _check_disjoint_writes(self.op, writes, write_specs)
        nf = len(self.fsig.args)
        perms = [_st.dense_permutation(size, stride) for size, stride, _ in out_meta]
        check_info = []  # filled when traced: (exception type, message) per device check
        # (shape, dtype) of each storage slot; never the StorageData themselves, which
        # the compiled function would otherwise keep alive (and their device buffers).
        slot_meta = [(sd.shape, sd.dtype) for sd in c.sdatas]
        op = self.op
        prec = key[-1] if lowering.precision else None  # gather put it last

        has_offs = bool(c.offs)  # the key fixes whether there are runtime view offsets

        def traced(arrays, dyn):
            dyn_it = iter(dyn)
            offs = dyn[-1] if has_offs else None
            largs = [_rebuild(item, arrays, dyn_it, slot_meta, offs) for item in layout]
            key = next(dyn_it) if lowering.random else None
            fixed, checks = call_lowering(lowering, op, largs[:nf], out_meta, key, prec)
            check_info[:] = [(exc, msg) for _, exc, msg in checks]
            flags = (jax.numpy.stack([jax.numpy.any(b) for b, _, _ in checks]),) \
                if checks else ()
            if mutated:
                cur = {}
                for w, (slot, spec, r) in enumerate(zip(writes, write_specs, fixed)):
                    wdt = runtime.to_np_dtype(spec[1])
                    if r.dtype != wdt:  # out= of another dtype: CPU casts the result
                        r = r.astype(wdt)
                    base = cur.get(slot, arrays[slot])
                    if base is None:
                        if len(spec) == 2:
                            cur[slot] = r.reshape(slot_meta[slot][0])
                            continue
                        sshape, sdtype = slot_meta[slot]
                        base = jax.numpy.zeros(sshape, runtime.to_np_dtype(sdtype))
                    if tuple(r.shape) != tuple(spec[0]):
                        r = jax.numpy.broadcast_to(r, spec[0])
                    if flags and (len(spec) > 2 or w in out_writes):
                        # a failed device-side check (raised at the next sync point, as
                        # CUDA's device asserts are) writes nothing, as CPU raises before
                        # writing: the view (or out= tensor) keeps its elements.  (An
                        # in-place write of a whole storage gets this from its lowering,
                        # which drops every update then, ops.indexing._dropped_if: a
                        # select here would copy the storage, 18x slower for a small
                        # index_copy_ into 16 MiB.)
                        r = jax.numpy.where(jax.numpy.any(flags[0]),
                                            _st.read_view(base, spec, offs), r)
                    cur[slot] = _st.write_view(base, spec, r, offs)
                return tuple(cur[s] for s in dict.fromkeys(writes)) + flags
            outs = []
            for r, perm in zip(fixed, perms):
                if perm is not None and perm != "nondense":
                    r = jax.numpy.transpose(r, perm)
                outs.append(r)
            return tuple(outs) + flags

        from jax.sharding import SingleDeviceSharding

        sharding = SingleDeviceSharding(runtime.jax_device(c.index))
        jitted = jax.jit(traced, out_shardings=sharding)
        final_meta = []
        if not mutated:
            for (size, stride, dt), perm in zip(out_meta, perms):
                if perm == "nondense":
                    stride, perm = _st.contiguous_strides(size), None
                final_meta.append((size, stride, dt, perm))
        ex = _ex.Executable(jitted, final_meta, list(dict.fromkeys(writes)), c.index)
        if not mutated:
            ex.groups = self._groups
        ex.check_info = check_info
        ex.traced = traced
        ex.name = str(self.op)
        ex.key = key
        ex.jitted = jitted
        return ex

    def _laid_out(self, vals, i, r, index):
        """Result ``i`` (array ``r``) as a tensor whose dimensions lie in memory in the
        order ``Lowering.layout`` gives (CPU's), the values unchanged: a storage holding
        ``r`` permuted to that order, viewed back with the matching strides."""
        jax = runtime.jax()
        order = self.lowering.layout(vals, i, tuple(r.shape))
        if order is None or list(order) == list(range(r.ndim)):
            return _st.wrap(jax.device_put(r, runtime.jax_device(index)), index)
        base = _st.wrap(jax.device_put(jax.numpy.transpose(r, order),
                                       runtime.jax_device(index)), index)
        strides = [0] * r.ndim
        step = 1
        for d in reversed(order):
            strides[d] = step
            step *= r.shape[d]
        return base.as_strided(tuple(r.shape), tuple(strides), 0)

    def _run_dynamic(self, vals):
        """Data-dependent output shapes: run on concrete arrays (a sync point)."""
        M.sync("data_dependent_shape:" + self.op._schema.name.split("::")[-1])
        index = None
        largs = []
        for i, v in enumerate(vals):
            k = self.sig.kinds[i]
            if i in self.writeonly:
                continue
            if k in (T, OPT_T):
                if isinstance(v, torch.Tensor):
                    if v.device.type == "tpu":
                        index = v.device.index if index is None else index
                        v = to_jax(v)
                    else:
                        v = runtime.jax().numpy.asarray(_keying.host_scalar(v))
                largs.append(v)
            elif k in (T_LIST, OPT_T_LIST):
                largs.append([to_jax(x) if x is not None else None for x in v])
            elif k == GEN:
                largs.append(None)
            else:
                largs.append(v)
        index = state.current_device if index is None else index
        with runtime.jax().default_device(runtime.jax_device(index)):
            res = self.lowering.fn(*largs[: len(self.fsig.args)])
        if not isinstance(res, (tuple, list)):
            res = (res,)
        if self.lowering.layout is not None:  # CPU's memory order (nonzero: column-major)
            outs = [self._laid_out(vals, i, r, index) for i, r in enumerate(res)]
        else:
            outs = [_st.wrap(runtime.jax().device_put(r, runtime.jax_device(index)), index)
                    for r in res]
        if self.sig.out_args:
            targets = [vals[i] for i in self.sig.out_args]
            for o in targets:  # as CUDA: out= on another device is an error, not a copy
                if o.device.type != "tpu":
                    raise _keying.device_mismatch(self.op, torch.device("tpu", index), o.device)
            for o, r in zip(targets, outs):
                if tuple(o.shape) != tuple(r.shape):
                    o.resize_(r.shape)
                o.copy_(r)
            return targets[0] if len(targets) == 1 else tuple(targets)
        return outs[0] if self.sig.nret == 1 else tuple(outs)




def _view_offsets(spec):
    """The storage element offsets a (non-whole-storage) view spec covers, as numpy."""
    size, _, stride, offset = spec[:4]
    idx = np.asarray([offset], dtype=np.int64)
    for n, st in zip(size, stride):
        idx = np.add.outer(idx, np.arange(n, dtype=np.int64) * st).reshape(-1)
    return idx


class _InOrder(Exception):
    """An in-place ``_foreach_*_`` call whose lists alias so that the element order shows
    (``overlap.foreach_in_order``): raised where its executable would be built."""


_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _foreach_in_order(op, args, kwargs):
    """Run the in-place foreach ``op`` as PyTorch's kernel for devices without a foreach
    kernel does (registered for CPU): the element op once per list position, in order,
    each through the dispatcher (so each is a tpu op of its own)."""
    M.foreach_in_order += 1
    return op.redispatch(_CPU_KEYS, *args, **kwargs)


def _check_disjoint_writes(op, writes, specs):
    """A list-mutating op (``_foreach_*_``, ``_amp_foreach_*_``) updates its elements one
    after the other on CPU; one executable reads every element first.  That is the same
    only when no two written views overlap: raise when they may."""
    seen: dict = {}
    for slot, spec in zip(writes, specs):
        if any(d == 0 for d in spec[0]):
            continue  # an empty view writes nothing
        for other in seen.get(slot, ()):
            if len(spec) == 2 or len(other) == 2 or spec[1] != other[1] or np.intersect1d(
                    _view_offsets(spec), _view_offsets(other)).size:
                raise NotImplementedError(
                    f"torchtpu: {op} with overlapping tensors in its mutated arguments (CPU "
                    f"updates them one after the other) is not supported")
        seen.setdefault(slot, []).append(spec)


def _rebuild(item, arrays, dyn_it, slot_meta, offs=None):
    from torchtpu.ops._scalar import Scalar

    tag = item[0]
    if tag == "view":
        arr = arrays[item[1]]
        if arr is None:  # an uninitialized storage reads as zeros (see _keying.Call.tensor)
            shape, dtype = slot_meta[item[1]]
            arr = runtime.jax().numpy.zeros(shape, runtime.to_np_dtype(dtype))
        return _st.read_view(arr, item[2], offs)
    if tag == "const":
        return item[1]
    if tag == "dyn":
        return next(dyn_it)
    if tag == "scalar":
        return Scalar(next(dyn_it), item[1])
    if tag == "list":
        return [_rebuild(x, arrays, dyn_it, slot_meta, offs) for x in item[1]]
    if tag == "drop":
        return None
    raise AssertionError(tag)




# ------------------------------------------------------------------------ plans


class DecompPlan:
    """Runs PyTorch's decomposition of ``op``; its pieces dispatch back to tpu.

    A decomposition that reaches ``op`` again (some go through prims that call the
    very op they implement) means there is no way down: the op is unsupported.
    """

    def __init__(self, op, fn):
        self.op = op
        self.fn = fn
        self.active = False

    def __call__(self, args, kwargs):
        if self.active:
            return UnsupportedPlan(self.op)(args, kwargs)
        M.decomposed_ops += 1
        self.active = True
        try:
            out = self.fn(*args, **kwargs)
        finally:
            self.active = False
        if out is NotImplemented:  # the decomposition declined this case
            return UnsupportedPlan(self.op)(args, kwargs)
        return out


_native_views = [False]  # whether ViewPlan tried torchtpu._tensor.native's view kernels


class ViewPlan:
    """View ops: PyTorch's CPU kernel only computes metadata; re-dispatch to it."""

    def __init__(self, op):
        self.op = op

    def __call__(self, args, kwargs):
        M.view_ops += 1
        if not _native_views[0]:
            # once: C++ as_strided/view kernels if the native helper is built already
            _native_views[0] = True
            from torchtpu._tensor import native

            native.view_kernels_if_built()
        return self.op.redispatch(_st._CPU_KEYSET, *args, **kwargs)


class HandlerPlan:
    def __init__(self, op, fn):
        self.op = op
        self.fn = fn

    def __call__(self, args, kwargs):
        return self.fn(*args, **kwargs)


class UnsupportedPlan:
    def __init__(self, op):
        self.op = op

    def fallback_or_raise(self, args, kwargs, refused: NotImplementedError):
        """For a case a lowered op refuses: the CPU fallback if enabled, else ``refused``."""
        if not CONFIG.cpu_fallback:
            raise refused
        from torchtpu.eager import cpu_fallback

        return cpu_fallback.run(self.op, args, kwargs)

    def __call__(self, args, kwargs):
        if CONFIG.cpu_fallback:
            from torchtpu.eager import cpu_fallback

            return cpu_fallback.run(self.op, args, kwargs)
        raise NotImplementedError(
            f"torchtpu: the ATen op '{self.op}' is not implemented for the tpu device "
            f"(arguments: {describe(list(args) + list(kwargs.values()))}). "
            f"Set torch.tpu.enable_cpu_fallback = True (or TORCHTPU_CPU_FALLBACK=1) to run "
            f"it on the CPU."
        )


_PLANS: dict = {}

# In-place overloads whose functional twin has another name.
_FUNCTIONAL_ALIASES = {
    "bernoulli_.float": "bernoulli.p",
    "normal_.default": "normal_functional.default",
}


def functional_variant(op):
    """The functional overload computing what mutable ``op`` writes, or None."""
    name = op._schema.name.split("::")[1]
    overload = op._overloadname
    full = f"{name}.{overload}"
    if full in _FUNCTIONAL_ALIASES:
        pkt, ov = _FUNCTIONAL_ALIASES[full].split(".")
        return getattr(getattr(aten, pkt), ov)
    sig = Signature(op)
    if sig.out_args:
        # foo.out -> the overload of foo with the same non-out arguments
        pkt = getattr(aten, name, None)
        want = [(a.name, str(a.type)) for i, a in enumerate(sig.args) if i not in sig.out_args]
        if pkt is None:
            return None
        for ov in pkt.overloads():
            cand = getattr(pkt, ov)
            if cand is op:
                continue
            csig = cand._schema
            if any(a.alias_info is not None and a.alias_info.is_write for a in csig.arguments):
                continue
            if [(a.name, str(a.type)) for a in csig.arguments] == want:
                return cand
        return None
    if name.endswith("_"):
        # foo_.X -> the overload of foo with the same arguments (usually foo.X, but not
        # always: pow_.Scalar(Tensor self, Scalar exponent) is pow.Tensor_Scalar)
        pkt = getattr(aten, name[:-1], None)
        if pkt is None:
            return None
        want = [(a.name, str(a.type)) for a in sig.args]
        ovs = pkt.overloads()
        for ov in ([overload] if overload in ovs else []) + list(ovs):
            cand = getattr(pkt, ov)
            if [(a.name, str(a.type)) for a in cand._schema.arguments] == want:
                return cand
    return None


def plan_for(op):
    plan = _PLANS.get(op)
    if plan is None:
        plan = _PLANS[op] = _make_plan(op)
        _bind_kernel(plan)
    return plan


def _run_plan(op, args, kwargs):
    return plan_for(op)(args, kwargs)


_set_plan_runner(_run_plan)  # ops.run_plan (the ops layer does not import this one)


def _make_plan(op):
    from torchtpu import ops as _ops
    from torchtpu.eager import handlers
    from torchtpu.ops import linalg as _linalg

    table = _ops.table()
    h = handlers.HANDLERS.get(op)
    if h is not None:
        return HandlerPlan(op, h)
    sig = Signature(op)
    if op in table:
        if op._schema.name.endswith("_like") and "device" in sig.names:
            return _LikeOtherDevice(op, sig, LoweredPlan(op, sig, table[op]))
        if op in _linalg.CHECK_ERRORS:
            return _CheckErrors(LoweredPlan(op, sig, table[op]), sig,
                                *_linalg.CHECK_ERRORS[op])
        return LoweredPlan(op, sig, table[op])
    if sig.is_view and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CPU"):
        return ViewPlan(op)
    # (a Tensor[] out= argument is not written by LoweredPlan: those go the other ways)
    if sig.mutated and not any(i in sig.mutated_lists for i in sig.out_args):
        f = functional_variant(op)
        if f is not None and f in table:
            if f in _linalg.CHECK_ERRORS:  # the out= form: the same check
                return _CheckErrors(LoweredPlan(op, sig, table[f], Signature(f)), sig,
                                    *_linalg.CHECK_ERRORS[f])
            return LoweredPlan(op, sig, table[f], Signature(f))
    d = _decomposition(op)
    if d is not None:
        return DecompPlan(op, _out_names_adapted(op, sig, d))
    if sig.mutated:
        f = functional_variant(op)
        if f is not None and (f in table or _decomposition(f) is not None):
            return _MutableViaFunctional(op, sig, f)
    return UnsupportedPlan(op)


class _CheckErrors:
    """A linear-algebra op whose ``check_errors=True`` makes PyTorch raise from its
    ``info`` output (``ops.linalg.CHECK_ERRORS``: ``linalg_inv_ex``, ``linalg_cholesky_ex``,
    ``linalg_lu_factor_ex``, and their ``out=`` forms).  The lowering computes ``info``;
    with ``check_errors=True`` the op runs with it off, then PyTorch's
    ``_linalg_check_errors(info, api, is_matrix=A.dim() == 2)`` reads ``info`` (a sync
    point, as eager ``linalg.inv`` reads it) and raises CPU's exact error, naming the
    batch element.  With ``check_errors=False`` it is the plain plan."""

    def __init__(self, plan, sig, api: str, info_pos: int):
        self.plan, self.api, self.info_pos = plan, api, info_pos
        self.pos = sig.names.index("check_errors")

    def __call__(self, args, kwargs):
        pos = self.pos
        if "check_errors" in kwargs:
            check = kwargs["check_errors"]
            if check:
                kwargs = dict(kwargs, check_errors=False)
        else:
            check = len(args) > pos and args[pos]
            if check:
                args = args[:pos] + (False,) + args[pos + 1:]
        out = self.plan(args, kwargs)
        if check:
            M.sync("linalg_check_errors")
            torch.ops.aten._linalg_check_errors(out[self.info_pos], self.api,
                                                is_matrix=args[0].dim() == 2)
        return out


class _LikeOtherDevice:
    """``zeros_like(x_tpu, device="cpu")`` and the other lowered ``*_like`` factories:
    the result goes to the ``device`` argument, as on CPU/CUDA.  Those ops read only
    ``x``'s size, strides and dtype, so another device's op runs on an uninitialized
    stand-in with ``x``'s size and strides (no transfer)."""

    def __init__(self, op, sig, lowered):
        self.op = op
        self.sig = sig
        self.lowered = lowered
        self.at = sig.names.index("device")

    def __call__(self, args, kwargs):
        vals = self.sig.normalize(args, kwargs)
        dev = vals[self.at]
        if dev is None or torch.device(dev).type == "tpu":
            return self.lowered(args, kwargs)
        x = vals[0]
        stand_in = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=dev)
        return call_op(self.sig, self.op, [stand_in] + list(vals[1:]))


class _MutableViaFunctional:
    """A mutable op whose functional twin is decomposed: run it, then copy back."""

    def __init__(self, op, sig, f):
        self.op = op
        self.sig = sig
        self.f = f
        self.fsig = Signature(f)
        # a structured functional op comes back to this backend as its out= overload
        # (``logit_backward`` -> ``logit_backward.grad_input``, this plan): run its
        # decomposition directly, not the op
        from torchtpu import ops as _ops

        self.decomp = None if f in _ops.table() else _decomposition(f)

    def __call__(self, args, kwargs):
        vals = self.sig.normalize(args, kwargs)
        _overlap.check_writes(self.op, self.sig.mutated, self.sig.out_args, vals)
        fvals = [v for i, v in enumerate(vals) if i not in self.sig.out_args]
        fvals = fvals[: len(self.fsig.args)]
        if self.decomp is not None:
            kw = {n: v for n, v, k in zip(self.fsig.names, fvals, self.fsig.kwarg_only) if k}
            res = self.decomp(*[v for v, k in zip(fvals, self.fsig.kwarg_only) if not k], **kw)
        else:
            res = call_op(self.fsig, self.f, fvals)
        if isinstance(res, torch.Tensor):
            res = (res,)
        targets = _flatten([vals[i] for i in self.sig.mutated])
        res = _flatten(res)
        if len(targets) != len(res):
            raise NotImplementedError(
                f"torchtpu: {self.op}: {self.f} returned {len(res)} tensors for "
                f"{len(targets)} mutated ones")
        for o, r in zip(targets, res):
            if self.sig.out_args and tuple(o.shape) != tuple(r.shape):
                o.resize_(r.shape)
            o.copy_(r)
        ret = self.sig.mutated_returns
        if len(ret) == 1:
            return vals[ret[0]]
        return tuple(vals[i] for i in ret) if ret else None


def _out_names_adapted(op, sig, fn):
    """``fn`` (a decomposition of ``op``) called with ``op``'s out argument names.

    ``torch._decomp``'s ``out_wrapper("grad_input")`` functions take ``out=``; PyTorch
    renames it to the schema's name only for the first of several overloads registered
    with one function (``reflection_pad1d_backward.grad_input`` then gets an unexpected
    ``grad_input`` keyword).  Some decompositions of ``.out``/``.grad_input`` overloads
    take no out argument at all: their result is copied into the given outputs.
    """
    import inspect

    outs = [sig.names[i] for i in sig.out_args]
    if not outs:
        return fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return _written_back(fn, outs)
    if all(o in params for o in outs) or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return _written_back(fn, outs)
    if len(outs) == 1 and "out" in params:
        name = outs[0]

        def renamed(*args, **kwargs):
            if name in kwargs:
                kwargs["out"] = kwargs.pop(name)
            return fn(*args, **kwargs)

        return _written_back(renamed, outs)
    if "out" in params:
        return _written_back(fn, outs)

    def copied(*args, **kwargs):
        targets = [kwargs.pop(o, None) for o in outs]
        res = fn(*args, **kwargs)
        if res is NotImplemented or any(t is None for t in targets):
            return res
        single = isinstance(res, torch.Tensor)
        for t, r in zip(targets, (res,) if single else res):
            if tuple(t.shape) != tuple(r.shape):
                t.resize_(r.shape)
            t.copy_(r)
        return targets[0] if single else tuple(targets)

    return copied


def _written_back(fn, outs):
    """``fn`` (a decomposition taking ``op``'s out arguments ``outs``), made to leave its
    results in the given out tensors.  Some write into something else and return that:
    ``smooth_l1_loss_backward.grad_input``'s is wrapped in ``pw_cast_for_opmath``, which
    hands it a float32 copy of a bfloat16 ``grad_input`` (PyTorch's CPU kernel, never
    this decomposition, computes the op there); its result is then copied into the out
    tensor, as ``out=`` does."""

    def written_back(*args, **kwargs):
        targets = [kwargs.get(o) for o in outs]
        res = fn(*args, **kwargs)
        if res is NotImplemented or not isinstance(res, (torch.Tensor, tuple, list)):
            return res
        single = isinstance(res, torch.Tensor)
        results = (res,) if single else tuple(res)
        if len(results) != len(targets) or all(
                t is None or _same_view(r, t) for t, r in zip(targets, results)):
            return res
        for t, r in zip(targets, results):
            if t is not None and isinstance(r, torch.Tensor) and not _same_view(r, t):
                if tuple(t.shape) != tuple(r.shape):
                    t.resize_(r.shape)
                t.copy_(r)
        return (targets[0] if targets[0] is not None else res) if single else tuple(
            t if t is not None else r for t, r in zip(targets, results))

    return written_back


def _same_view(a, b) -> bool:
    """Whether tensors ``a`` and ``b`` are the same elements of the same storage."""
    return a is b or (isinstance(a, torch.Tensor) and a.shape == b.shape
                      and a.stride() == b.stride()
                      and a.storage_offset() == b.storage_offset()
                      and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


_DECOMPS = None


def _decomposition(op):
    global _DECOMPS
    if _DECOMPS is None:
        from torchtpu.ops import decomp_overrides

        _DECOMPS = decomp_overrides.decompositions()
    return _DECOMPS.get(op)


def dispatch(keyset, op, *args, **kwargs):
    """The PrivateUse1 boxed fallback kernel: run ``op`` on tpu tensors."""
    M.ops_dispatched += 1
    plan = _PLANS.get(op)
    if plan is None:
        plan = plan_for(op)
    return plan(args, kwargs)


# the C++ helper, when an earlier process built it (~1 ms): C++ view kernels, result
# tensors made in one C++ call (storage.new_tensor) and the C++ hot path; otherwise all
# three come when the helper is first built (native.module(), e.g. at the first backward)
_native.ON_LOAD.append(_on_native_load)
_native.view_kernels_if_built()
