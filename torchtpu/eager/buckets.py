"""Shape buckets: an op that keeps meeting new shapes runs executables shared by a bucket
of sizes instead of compiling one per shape.

Why: a per-op executable is compiled for exact shapes, so a loop over 500 lengths
(``for i in range(1, 512): torch.randn(i, device="tpu").abs()...``) compiles an executable
per length and op: ~0.1-0.3 s each on XLA:CPU, against microseconds for the op itself.

What: once an op overload has compiled ``after`` exact signatures (default 4,
``TORCHTPU_SHAPE_BUCKETS_AFTER``) it is *churning*, and its next new signatures run
*bucketed* when the call fits one of the rules below: each tensor is flattened and padded
to a bucket length (the next power of two, at least 512 elements), and the op runs through
the ordinary executable cache on the padded arrays (one executable per bucket, reused by
every length in it).  Results stay padded on the device (``storage.Padded``), so a chain
of bucketed ops never goes through the host.  No padding or cutting goes through the host
either (no host sync):

* an input that is not padded yet is padded on the host when the host knows its values
  (it came from a host transfer, ``storage.host_copy``, or is uninitialized):
  ``host_pads``; else on the device when another input of the call is padded already (one
  small executable per length): ``device_pads``; else the call runs exact
  (``not_padded``): padding it would cost a sync or a compile per length, as the exact
  executable does;
* ``zeros`` / ``ones`` / ``full`` of a churning size are made padded on the host
  (``factory_runs``), so loops over ``torch.ones(n, device="tpu")`` start padded chains;
* anything else that reads a padded storage gets its exact array cut on the device
  (``device_cuts``: one small executable per bucket, length and shape);
  ``.cpu()``/``.tolist()`` read the padded array's front directly.

When a bucketed signature gets its exact executable: a signature that *recurs* is not
churn.  While an op has run at most ``recur`` (default 32,
``TORCHTPU_SHAPE_BUCKETS_RECUR``) distinct signatures bucketed, a bucketed signature met
again compiles its exact executable on that second call (an optimizer's per-parameter ops -- AdamW's ``mul``,
``add``, ``sqrt``, ``div``, ``addcdiv``, ``lerp`` see one shape per parameter -- run
bucketed in the first step only, then exact).  An op that has met more distinct shapes
than that (a loop over hundreds of lengths, a growing sequence) keeps bucketing its
signatures until one has run bucketed ``HOT`` (128, ``TORCHTPU_SHAPE_BUCKETS_HOT``)
times: that one compiles its exact executable on its next call, so steady loops
(training, decoding) end up on the exact executables either way.  Both decisions are
per op for the whole process (``set_policy`` forgets them).

Rules (the padding never changes a value: the result is the one the exact executable
gives, bit for bit, which ``tests/test_shape_buckets.py`` checks against both the exact
path and CPU):

* pointwise ops (``torch.Tag.pointwise``, not random) and dtype casts (``_to_copy``) on
  whole, contiguous storages of one shape (0-d operands and Python scalars allowed):
  padded with copies of the last element, so padding can trip no device-side check a real
  element does not;
* ``all()`` / ``any()`` and integer ``max()`` / ``min()`` of a whole tensor: the same
  padding leaves the set of values as it was;
* ``index_put(..., accumulate=True)`` (and ``index_put_``) of a 1-D tensor with one 1-D
  integer index: the index is range-checked and wrapped where it is padded (on the host:
  an out-of-range index takes the exact path and its error; on the device: the exact
  lowering's device-side check, raised at the next sync point), the padding adds ``-0.0``
  (``0``/``False``), IEEE's exact additive identity;
* on platforms where a prefix of a longer draw was checked to equal the shorter draw
  (``_PREFIX_PLATFORMS``: ``cpu``): ``uniform_``, ``normal_`` and 1-D ``cumsum``.  Random
  ops reuse the generator offset the exact call would have used, so a seeded program gives
  the same numbers whichever path a call takes.

Not bucketed: DeferAndFuse, DEBUG mode (its checks read every output, padding
included), views (non-contiguous, offset, conj/neg bits), tensors over ``MAX_NUMEL``
elements, copies into another memory format, ``out=`` tensors of the wrong shape, ops
returning tensor lists, float ``max``/``min`` (which zero they return depends on the
order), ``index_put`` with a 0-d value, and calls where one storage would be padded two
ways or is also read through another view (``x / x[0]``).

Counters (``torchtpu.metrics()["shape_buckets"]``): ``runs`` (calls run bucketed; a
call of a bucket's existing executable also counts as a cache hit),
``hot_signatures`` (signatures that got their exact executable after ``HOT`` bucketed
runs), ``recurring_signatures`` (signatures that got it on their second call, by the
``recur`` rule), ``churning_ops``, and the pads and cuts above (``host_pads``,
``device_pads``, ``not_padded``, ``factory_runs``, ``device_cuts``).  ``TORCHTPU_SHAPE_BUCKETS=0`` switches buckets off.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from torchtpu import _metrics
from torchtpu._device import executable_limit as _executable_limit
from torchtpu._device import runtime
from torchtpu._tensor import storage as _st
from torchtpu.eager import async_compile as _async
from torchtpu.eager import executables as _executables
from torchtpu.eager import inflight
from torchtpu.eager.modes import CONFIG
from torchtpu.ops._schema import GEN, OPT_T, OPT_T_LIST, T, T_LIST

M = _metrics.METRICS
aten = torch.ops.aten

def _env_count(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"torchtpu: {name} must be a whole number >= 0, got {raw!r}")
    return value


# bucketed runs of one signature before it compiles its exact executable: a compile costs
# ~30-300 ms, a bucketed run ~0.1-0.4 ms more than an exact one (CPU platform)
HOT = _env_count("TORCHTPU_SHAPE_BUCKETS_HOT", 128)
# distinct bucketed signatures of one op up to which a signature met again compiles its
# exact executable at once (0: never; a signature then waits for HOT bucketed runs)
DEFAULT_RECUR = _env_count("TORCHTPU_SHAPE_BUCKETS_RECUR", 32)
MIN_BUCKET = 512  # elements
MAX_NUMEL = 1 << 16  # larger tensors always compile exact executables
_PREFIX_PLATFORMS = frozenset({"cpu"})  # see the module docstring

NO = object()  # run() result: not bucketed, take the exact path

_EDGE, _ANY, _NEG0, _INDEX = "edge", "any", "neg0", "index"

DEFAULT_ON = os.environ.get("TORCHTPU_SHAPE_BUCKETS", "1") not in ("0", "")
DEFAULT_AFTER = _env_count("TORCHTPU_SHAPE_BUCKETS_AFTER", 4)
ON = [DEFAULT_ON]  # switched on
_after = DEFAULT_AFTER
_recur = DEFAULT_RECUR
_churn: dict = {}  # op -> misses of calls a rule fits
_uses: dict = {}  # exact signature -> bucketed runs (HOT: it compiles exact)
_distinct: dict = {}  # op -> distinct signatures run bucketed
_active = [False]  # inside a bucketed run: its own misses compile normally
_RULES: dict = {}


def set_policy(enabled: bool | None = None, after: int | None = None,
               recur: int | None = None) -> None:
    """Switch buckets on or off, set after how many exact compiles of an op its new
    shapes are bucketed (0: from the first call), and up to how many distinct bucketed
    signatures of an op a signature met again compiles its exact executable at once
    (``recur``; 0: never, each waits for ``HOT`` bucketed runs).  Forgets the ops and
    signatures seen so far.  ``set_policy(DEFAULT_ON, DEFAULT_AFTER, DEFAULT_RECUR)``
    restores the start-up policy.

    Raises ``ValueError`` for a negative ``after`` or ``recur``."""
    global _after, _recur
    if after is not None and after < 0:
        raise ValueError(f"shape buckets: after must be >= 0, got {after}")
    if recur is not None and recur < 0:
        raise ValueError(f"shape buckets: recur must be >= 0, got {recur}")
    if enabled is not None:
        ON[0] = bool(enabled)
    if after is not None:
        _after = int(after)
    if recur is not None:
        _recur = int(recur)
    _churn.clear()
    _uses.clear()
    _distinct.clear()


def enabled() -> bool:
    """Whether shape buckets are switched on (``TORCHTPU_SHAPE_BUCKETS``)."""
    return ON[0]


def bucket(n: int) -> int:
    """The bucket length (elements) a tensor of ``n >= 1`` elements is padded to."""
    return max(MIN_BUCKET, 1 << (n - 1).bit_length())


# ------------------------------------------------------------------ rules


def whole(t) -> bool:
    """``t`` is a tpu tensor reading its whole storage array (``storage.view_spec``'s
    whole-storage case: contiguous, in the array's shape and dtype, no conj/neg bit) with
    standard strides and no pending DeferAndFuse value (a pending first call's value,
    ``eager.async_compile``, is waited for when the call is bucketed)."""
    if t.device.type != "tpu":
        return False
    sd = t.untyped_storage()._tpu
    a = sd.arr
    return (len(_st.view_spec(t, sd)) == 2 and t.stride() == _st.contiguous_strides(sd.shape)
            and (a.__class__ is not _st.Lazy or a.node is _st.ASYNC))


def _small(t) -> bool:
    return 1 <= t.numel() <= MAX_NUMEL


_KEEP_LAYOUT = (None, torch.preserve_format, torch.contiguous_format)


def _pointwise(plan, vals):
    kinds = plan.sig.kinds
    for name, v in zip(plan.sig.names, vals):
        if name == "memory_format" and v not in _KEEP_LAYOUT:
            return None  # (channels_last results have other strides than the input)
    shape, pads = None, []
    for v, k in zip(vals, kinds):
        if k in (T_LIST, OPT_T_LIST) and v:
            return None
        if (k == T or k == OPT_T) and isinstance(v, torch.Tensor):
            if v.dim() == 0:
                continue
            if not whole(v):
                return None
            if shape is None:
                shape = v.shape
            elif v.shape != shape:
                return None
            pads.append((v, _EDGE))
    if not pads or not _small(pads[0][0]):
        return None
    return pads


def _one_whole(plan, vals, mode, dim1=False):
    if plan.sig.out_args:
        return None
    x = vals[0]
    if not isinstance(x, torch.Tensor) or not whole(x) or not _small(x):
        return None
    if dim1 and x.dim() != 1:
        return None
    return [(x, mode)]


def _random_fill(plan, vals):
    return _one_whole(plan, vals, _ANY) if runtime.platform() in _PREFIX_PLATFORMS else None


def _cumsum_1d(plan, vals):
    if runtime.platform() not in _PREFIX_PLATFORMS:
        return None
    return _one_whole(plan, vals, _ANY, dim1=True)  # a prefix op: padding never read


def _full_reduction(plan, vals):
    x = vals[0]
    if plan.op in (aten.max.default, aten.min.default) and isinstance(x, torch.Tensor) and (
            x.dtype.is_floating_point or x.dtype.is_complex):
        return None  # which of +0.0 / -0.0 a float min/max returns depends on the order
    return _one_whole(plan, vals, _EDGE)


def _index_put_accumulate(plan, vals):
    if plan.sig.out_args:
        return None
    x, indices, values, accumulate = vals[:4]
    if accumulate is not True or len(indices) != 1 or indices[0] is None:
        return None
    idx = indices[0]
    if not (whole(x) and x.dim() == 1 and _small(x)):
        return None
    if not (idx.dtype in (torch.int64, torch.int32) and whole(idx) and idx.dim() == 1
            and _small(idx)):
        return None
    if not isinstance(values, torch.Tensor) or values.dtype != x.dtype:
        return None
    if values.dim() == 0:
        return None  # (a 0-d value would be added at every padding index too)
    if not (whole(values) and values.shape == idx.shape):
        return None
    return [(x, _ANY), (idx, _INDEX), (values, _NEG0)]


_FACTORY_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                             torch.int64, torch.float16, torch.bfloat16, torch.float32,
                             torch.float64})


def _factory(plan, vals):
    """``zeros`` / ``ones`` / ``full`` of a small strided size: no tensor to pad, the result
    is made padded on the host (no compile, no sync)."""
    args = dict(zip(plan.sig.names, vals))
    size = args.get("size")
    if plan.sig.out_args or not isinstance(size, (list, tuple)) or not all(
            isinstance(k, int) for k in size):
        return None
    if args.get("layout") not in (None, torch.strided) or args.get("pin_memory"):
        return None
    if not 1 <= math.prod(size) <= MAX_NUMEL:
        return None
    v = args.get("fill_value", 1 if plan.op is aten.ones.default else 0)
    if not isinstance(v, (bool, int, float)):
        return None
    return []


def _run_factory(plan, vals, index):
    """The factory call's result, padded to its bucket length on the host (edge padding),
    or :data:`NO` (a dtype or value CPU PyTorch refuses: the exact path raises as CPU)."""
    args = dict(zip(plan.sig.names, vals))
    size = tuple(args["size"])
    v = args.get("fill_value", 1 if plan.op is aten.ones.default else 0)
    dtype = args.get("dtype")
    if dtype is None and plan.op is not aten.full.default:
        dtype = torch.get_default_dtype()
    try:  # PyTorch's own dtype inference and rounding of the fill value
        one = torch.full((1,), v, dtype=dtype)
    except (RuntimeError, TypeError):
        return NO
    if one.dtype not in _FACTORY_DTYPES:
        return NO
    from torchtpu.eager import handlers  # (handlers imports the executor, which imports us)

    host = handlers.host_array(one)
    n = math.prod(size)
    arr = runtime.put_host(np.repeat(host, bucket(n)), index)
    M.shape_buckets["factory_runs"] += 1
    return _padded_tensor(arr, size, n, True, index, one.dtype)


def _consistent(plan, vals, pads) -> bool:
    """Every storage the call reads is padded one way only, and no other tensor of the
    call (a 0-d view ``x[0]`` in ``x / x[0]``, ``x`` passed as both ``index_put``'s self
    and its values) reads a storage being padded."""
    modes, ids = {}, set()
    for t, mode in pads:
        cid = t.untyped_storage()._cdata
        if modes.setdefault(cid, mode) != mode:
            return False
        ids.add(id(t))
    for v, k in zip(vals, plan.sig.kinds):
        if k == T or k == OPT_T:
            group = (v,)
        elif (k == T_LIST or k == OPT_T_LIST) and v:
            group = v
        else:
            continue
        for x in group:
            if (isinstance(x, torch.Tensor) and id(x) not in ids and x.device.type == "tpu"
                    and x.untyped_storage()._cdata in modes):
                return False
    return True


def rule_for(op):
    """The bucketing rule of ``op`` (see the module docstring), or None."""
    r = _RULES.get(op, NO)
    if r is NO:
        if op in (aten.uniform_.default, aten.normal_.default):
            r = _random_fill
        elif op is aten.cumsum.default:
            r = _cumsum_1d
        elif op in (aten.max.default, aten.min.default, aten.all.default, aten.any.default):
            r = _full_reduction
        elif op in (aten.index_put.default, aten.index_put_.default,
                    aten._index_put_impl_.default):
            r = _index_put_accumulate
        elif op in (aten.zeros.default, aten.ones.default, aten.full.default):
            r = _factory
        elif op is aten._to_copy.default:
            r = _pointwise
        elif (torch.Tag.pointwise in op.tags
              and torch.Tag.nondeterministic_seeded not in op.tags):
            r = _pointwise
        else:
            r = None
        _RULES[op] = r
    return r


# ------------------------------------------------------------------ running


def _fill_value(dt):
    """IEEE's exact additive identity for numpy dtype ``dt``: -0.0 (complex: -0.0-0.0j),
    0 for integers, False for bool."""
    if dt == np.bool_ or np.issubdtype(dt, np.integer):
        return np.zeros((), dt)
    if np.issubdtype(dt, np.complexfloating):
        return np.asarray(complex(-0.0, -0.0), dt)
    return np.asarray(-0.0, dt)


def _pad_host(flat: np.ndarray, mode: str, n_x: int):
    """``flat`` padded on the host to its bucket length, or None when the call must take
    the exact path (an index out of range of the indexed length ``n_x``)."""
    n = flat.shape[0]
    extra = bucket(n) - n
    if mode == _INDEX:
        if flat.min() < -n_x or flat.max() >= n_x:
            return None  # the exact executable raises the device-side index error
        flat = np.where(flat < 0, flat + n_x, flat).astype(flat.dtype)
        mode = _EDGE
    if mode == _NEG0:
        return np.concatenate([flat, np.full(extra, _fill_value(flat.dtype), flat.dtype)])
    return np.pad(flat, (0, extra), mode="edge")


_REPADS = _executable_limit.LRUCache(share=0.125)  # (mode, B, dtype, index) -> jitted


def _repad(p, mode: str, index: int, n_x: int, op):
    """A :class:`Padded` array whose padding suits ``mode``, on the device (no sync): one
    executable per bucket length and dtype, the true length passed at run time."""
    arr = p.arr
    key = (mode, arr.shape[0], arr.dtype, index)
    f = _REPADS.get(key)
    if f is None:
        f = _REPADS.put(key, _repad_fn(mode, arr.dtype))
    if mode == _INDEX:
        out, bad = f(arr, np.int64(p.n), np.int64(n_x))
        # the exact lowering's check (ops._checks.index_in_range), against the true size
        inflight.add_check(
            bad, [(IndexError, f"index out of bounds for dimension 0 with size {n_x}")], op)
        return out
    return f(arr, np.int64(p.n))


def _device_pad(a, mode: str, index: int, n_x: int, op):
    """The exact array ``a`` flattened and padded to its bucket length as ``mode`` asks,
    on the device (no sync): one executable per length, bucket and dtype."""
    n = math.prod(a.shape)
    key = ("pad", mode, tuple(a.shape), a.dtype, index)
    f = _REPADS.get(key)
    if f is None:
        f = _REPADS.put(key, _pad_fn(mode, a.dtype, n, bucket(n)))
    if mode == _INDEX:
        out, bad = f(a, np.int64(n_x))
        inflight.add_check(
            bad, [(IndexError, f"index out of bounds for dimension 0 with size {n_x}")], op)
        return out
    return f(a)


def _pad_fn(mode, dtype, n, b):
    jax = runtime.jax()
    jnp = jax.numpy
    extra = b - n
    if mode == _NEG0:
        fill = _fill_value(np.dtype(dtype))
        return jax.jit(lambda x: jnp.concatenate(
            [x.reshape(-1), jnp.full((extra,), fill, x.dtype)]))
    if mode != _INDEX:
        return jax.jit(lambda x: jnp.pad(x.reshape(-1), (0, extra), mode="edge"))

    def index(x, m):  # in range, negatives wrapped, padding repeats the last index
        x = x.reshape(-1)
        bad = jnp.any((x < -m) | (x >= m))
        x = jnp.where(x < 0, x + m, x).astype(x.dtype)
        return jnp.pad(x, (0, extra), mode="edge"), bad.reshape(1)

    return jax.jit(index)


def _repad_fn(mode, dtype):
    jax = runtime.jax()
    jnp = jax.numpy

    def live(x, n):
        return jax.lax.iota(np.int64, x.shape[0]) < n

    if mode == _EDGE:
        return jax.jit(lambda x, n: jnp.where(live(x, n), x, x[n - 1]))
    if mode == _NEG0:
        fill = _fill_value(np.dtype(dtype))
        return jax.jit(lambda x, n: jnp.where(live(x, n), x, fill))

    def index(x, k, m):  # in range, negatives wrapped, padding repeats the last index
        keep = live(x, k)
        bad = jnp.any(keep & ((x < -m) | (x >= m)))
        x = jnp.where(keep, x, x[k - 1])
        return jnp.where(x < 0, x + m, x).astype(x.dtype), bad.reshape(1)

    return jax.jit(index)


def _outs_fit(plan, vals) -> bool:
    """Whether every ``out=`` tensor of the call has the shape of its largest tensor
    input (an in-place op arriving as ``mul.out(x, y, out=x)``, an element-wise ``out=``):
    other out tensors run exact, as PyTorch resizes them to the exact result's shape,
    which the padded run does not know."""
    ins = [vals[j] for j in plan.sig.tensor_idx if j not in plan.sig.out_args
           and isinstance(vals[j], torch.Tensor)]
    if not ins:
        return False
    shape = tuple(max(ins, key=lambda t: t.numel()).shape)
    return all(isinstance(vals[i], torch.Tensor) and tuple(vals[i].shape) == shape
               for i in plan.sig.out_args)


def run(plan, vals, c):
    """Run ``plan`` (a ``LoweredPlan``) on ``vals`` bucketed, or return :data:`NO`.

    Called on a miss of the executable cache with the call's normalized (and prepared)
    arguments and what ``keying.gather`` made of them (``c``: the signature ``c.key``,
    the storages, the dynamic inputs, the tpu index).  Returns the
    op's result as the exact path would (in-place and ``out=`` ops: their written tensors
    updated), its tensors holding :class:`~torchtpu._tensor.storage.Padded` arrays.
    """
    if _active[0]:
        return NO
    key = tuple(c.key)
    index = c.index
    rule = rule_for(plan.op)
    if rule is None or (plan.sig.out_args and not _outs_fit(plan, vals)):
        return NO
    pads = rule(plan, vals)
    if pads is None or not _consistent(plan, vals, pads):
        return NO
    if CONFIG.debug_sync:
        return NO  # DEBUG checks every output, padding included (an overflowing cumsum)
    seen = _churn.get(plan.op, 0)
    _churn[plan.op] = seen + 1
    if seen < _after:
        return NO
    used = _uses.get(key, 0)
    if used >= HOT:
        return NO
    if used and _distinct.get(plan.op, 0) <= _recur:
        # a signature met again, among few: not churn, it gets its exact executable
        _uses[key] = HOT
        M.shape_buckets["recurring_signatures"] += 1
        return NO
    if rule is _factory:
        res = _run_factory(plan, vals, index)
        if res is not NO:
            _counted_run(key, used, seen, plan.op)
        return res
    # padded arrays, one per storage (x.add_(x) stays aliased)
    n_x = pads[0][0].numel()
    # out= storages no input reads (x.mul_(y) arrives as mul.out(x, y, out=x): read)
    outs = plan.sig.out_args
    writeonly = set()
    if outs:
        writeonly = {vals[i].untyped_storage()._cdata for i in outs}
        writeonly -= {v.untyped_storage()._cdata for i, v in enumerate(vals)
                      if i not in outs and isinstance(v, torch.Tensor)
                      and v.device.type == "tpu"}
    # an input that is not padded yet is padded without a host sync: on the host from
    # values the host knows (the host transfer that made its array, an uninitialized
    # storage's zeros), else on the device when another input of the call is padded
    # already (one small executable per length); a call none of whose inputs is padded
    # or known runs exact (padding it would cost a sync or a compile per length anyway)
    _async.settle_list(c.arrays)  # pending first calls' values (eager.async_compile)
    plan_in = []
    any_padded = False
    for t, mode in pads:
        sd = t.untyped_storage()._tpu
        a = sd.arr
        if a.__class__ is _st.Lazy:
            a = sd.get()
        if a.__class__ is _st.Padded:
            any_padded = True
            host = None
        elif a is None:
            host = np.zeros(math.prod(sd.shape), runtime.to_np_dtype(sd.dtype))
        else:
            host = _st.host_copy(a)
        plan_in.append((t, mode, sd, a, host))
    by_storage = {}
    by_sd = {}  # id(StorageData) -> padded array
    for t, mode, sd, a, host in plan_in:
        cid = t.untyped_storage()._cdata
        if cid in by_storage:
            continue
        if a.__class__ is _st.Padded:
            if mode == _ANY or cid in writeonly or (mode == _EDGE and a.edge):
                arr = a.arr
            else:
                arr = _repad(a, mode, index, n_x, plan.op)
        elif cid in writeonly:  # an out= tensor: its old values are never read
            arr = runtime.put_host(np.zeros(bucket(t.numel()), runtime.to_np_dtype(t.dtype)),
                                   index)
        elif host is not None:
            h = _pad_host(host.reshape(-1), mode, n_x)
            if h is None:
                return NO
            arr = runtime.put_host(h, index)
            M.shape_buckets["host_pads"] += 1
        elif any_padded:
            arr = _device_pad(a, mode, index, n_x, plan.op)
            M.shape_buckets["device_pads"] += 1
        else:
            M.shape_buckets["not_padded"] += 1
            return NO
        by_storage[cid] = (t, arr)
        by_sd[id(sd)] = arr
    _counted_run(key, used, seen, plan.op)
    edge = rule is _pointwise  # edge-padded inputs give edge-padded results
    shape = tuple(pads[0][0].shape)  # every rule's results: this shape, or 0-d
    ex = _executables.CACHE.get(_padded_key(plan, vals, c, by_sd))
    if ex is not None and ex.compiled and ex.resize is None and not CONFIG.debug_sync:
        _executables.CACHE.move_to_end(ex.key)
        return _run_known(plan, vals, c, ex, by_sd, shape, n_x, edge)
    # first run of this signature: through the executor on padded tensors
    padded = {cid: _st.wrap(arr, index, t.dtype) for cid, (t, arr) in by_storage.items()}

    def sub(v):
        if isinstance(v, torch.Tensor) and v.device.type == "tpu":
            return padded.get(v.untyped_storage()._cdata, v)
        return v

    pvals = []
    for v, k in zip(vals, plan.sig.kinds):
        if k == T or k == OPT_T:
            v = sub(v)
        elif (k == T_LIST or k == OPT_T_LIST) and v is not None:
            v = [sub(x) for x in v]
        pvals.append(v)
    if plan.lowering.random:  # draw with the key the exact call drew (gather took it)
        _unwind_rng(plan, vals, index)
    _active[0] = True
    try:
        res = plan._run(pvals)
    finally:
        _active[0] = False
    if plan.sig.mutated:
        for i in plan.sig.mutated:
            t = vals[i]
            cid = t.untyped_storage()._cdata
            if cid in padded:
                t.untyped_storage()._tpu.arr = _st.Padded(
                    _st.data(padded[cid]).get(), t.numel(), edge)
        return _mutated_result(plan, vals)
    outs = [res] if plan.sig.nret == 1 else list(res)
    cut = []
    for r in outs:
        if r.dim() != 0:
            r = _padded_tensor(_st.data(r).get(), shape, n_x, edge, index, r.dtype)
        cut.append(r)
    return cut[0] if plan.sig.nret == 1 else tuple(cut)


def _counted_run(key, used, seen, op):
    """Record a bucketed run of signature ``key`` (``used`` runs before) of ``op``
    (``seen`` churning misses before)."""
    if len(_uses) > 100_000:
        _uses.clear()
    _uses[key] = used + 1
    if not used:
        _distinct[op] = _distinct.get(op, 0) + 1
    if used + 1 == HOT:
        M.shape_buckets["hot_signatures"] += 1
    if seen == _after:
        M.shape_buckets["churning_ops"] += 1
    M.shape_buckets["runs"] += 1


def _padded_tensor(arr, shape, n, edge, index, dtype):
    st = _st.new_storage(shape, dtype, index, _st.Padded(arr, n, edge))
    return _st.tensor_on(st, shape, _st.contiguous_strides(shape), 0, dtype)


def _mutated_result(plan, vals):
    ret = plan.sig.mutated_returns
    if len(ret) == 1:
        return vals[ret[0]]
    return tuple(vals[i] for i in ret) if ret else None


def _padded_key(plan, vals, c, by_sd):
    """The signature the call gets with its padded tensors (``keying.gather``'s key,
    with each padded storage's item that of a whole ``(B,)`` tensor)."""
    key = list(c.key)
    pos = 1  # gather's layout: the op, then one item per argument (a list: its length,
    tpos = []  # then one per element), then the device index and the default dtype
    for v, k in zip(vals, plan.sig.kinds):
        if k == T or k == OPT_T:
            if isinstance(v, torch.Tensor) and v.device.type == "tpu":
                tpos.append(pos)
            pos += 1
        elif k == T_LIST or k == OPT_T_LIST:
            pos += 1
            for x in v:
                if x is not None and x.device.type == "tpu":
                    tpos.append(pos)
                pos += 1
        else:
            pos += 1
    for p in tpos:
        item = key[p]
        j = item[0]
        arr = by_sd.get(id(c.sdatas[j]))
        if arr is not None:
            key[p] = (j, (tuple(arr.shape), item[1][1]))
    return tuple(key)


def _run_known(plan, vals, c, ex, by_sd, shape, n_x, edge):
    """A bucket whose padded executable ``ex`` exists: call it directly on the padded
    arrays, in the slots and with the dynamic inputs (random key included) the exact
    call gathered (``c``): no padded tensors, no second gather."""
    arrays = []
    for sd, a in zip(c.sdatas, c.arrays):
        p = by_sd.get(id(sd))
        if p is None and a.__class__ is _st.Padded:
            p = sd.get()  # another bucketed result read through a view (w[3]): cut
        arrays.append(a if p is None else p)
    outs = _async.concrete(ex.call(arrays, c.dyn))  # (a Padded holds arrays only)
    M.cache_hits += 1  # (the bucket's executable)
    inflight.dispatched(outs)
    if ex.check_info:
        inflight.add_check(outs[-1], ex.check_info, plan.op)
        outs = outs[:-1]
    nw = len(ex.writes)
    for j, arr in zip(ex.writes, outs[:nw]):
        sd = c.sdatas[j]
        sd.arr = _st.Padded(arr, math.prod(sd.shape), edge)
    if plan.sig.mutated:
        return _mutated_result(plan, vals)
    results = []
    for (size, _, dtype, _), arr in zip(ex.out_meta, outs[nw:]):
        if len(size) == 0:
            results.append(_st.wrap(arr, c.index, dtype))
        else:
            results.append(_padded_tensor(arr, shape, n_x, edge, c.index, dtype))
    return results[0] if plan.sig.nret == 1 else tuple(results)


def _executor():
    """``torchtpu.eager.executor`` (it imports this module: looked up at run time)."""
    global _EX
    if _EX is None:
        from torchtpu.eager import executor

        _EX = executor
    return _EX


_EX = None


def _unwind_rng(plan, vals, index):
    from torchtpu._device import generator as _gen
    from torchtpu._device import state

    gen = None
    for v, k in zip(vals, plan.sig.kinds):
        if k == GEN:
            gen = v
    if gen is None:
        state.rng(index).offset -= 1
    else:  # (a generator's seed draw is undone: before, a second seed was drawn, so a
        # seeded op gave other values once bucketed and the generator advanced twice)
        _gen.undo_draw(gen)
