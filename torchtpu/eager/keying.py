"""Signature keying: what one op call's cache key and runtime inputs are.

:func:`gather` walks a call's normalized arguments (``ops._schema.Signature.normalize``)
and returns a :class:`Call`: the key of the executable that computes it (op, per tensor
its storage slot and view spec (``storage.view_spec`` / ``dynamic_view_spec``), dtypes,
static arguments, Python-number kinds, device index, default dtype, float32 matmul
precision where the lowering reads it) and the values passed at run time (one array per
distinct storage, the numbers that are runtime scalars, the RNG key, the views' storage
offsets).  Two calls with equal keys run the same executable; everything an executable
compiles in is in its key.  The executor (``eager.executor``) plans and runs; the hot
path (``eager.hotpath`` and the C++ helper) keys hot calls its own shorter way and falls
back to this one.
"""

from __future__ import annotations

import numpy as np
import torch

from torchtpu import _metrics
from torchtpu._device import runtime, state
from torchtpu._tensor import storage as _st
from torchtpu.eager.modes import CONFIG
from torchtpu.ops._schema import GEN, OPT_SCALAR, OPT_T, OPT_T_LIST, SCALAR, SCALAR_LIST, T, T_LIST

M = _metrics.METRICS

SCALAR_NP = {bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}
_matmul_precision = torch._C._get_float32_matmul_precision


def device_mismatch(op, a: torch.device, b: torch.device):
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{a} and {b}!"
    )


class Call:
    """Gathers the dynamic inputs and the cache key of one op call."""

    __slots__ = ("arrays", "slots", "sdatas", "dyn", "key", "index", "first_dev", "offs",
                 "padded", "grow_ok", "regather", "pending", "stitched")

    def __init__(self, dynamic_offsets=True):
        self.arrays = []
        self.slots = {}
        self.sdatas = []
        self.dyn = []
        self.key = []
        self.index = None
        self.first_dev = None
        # views' storage offsets, passed at run time (storage.dynamic_view_spec); None:
        # compiled in (ops writing tensor lists check their views for overlap when built)
        self.offs = [] if dynamic_offsets else None
        self.padded = False  # an input array is eager.buckets' Padded (see unpad)
        # window views of a Grown storage (eager.growth) may read its capacity array: a
        # call that writes no argument, outside DeferAndFuse (set by gather)
        self.grow_ok = False
        self.regather = False  # a Grown storage was cut after its slot was taken
        # an input array is a pending first call's value (eager.async_compile)
        self.pending = False
        # (STRICT) an input is a pending value of a segment of stitched compiled graphs
        # that this op reads for its shape only: the op is recorded into that segment
        self.stitched = False

    def unpad(self):
        """Replace bucket-padded input arrays by their storages' own arrays (a call
        that is not bucketed)."""
        for j, a in enumerate(self.arrays):
            if a.__class__ is _st.Padded:
                self.arrays[j] = self.sdatas[j].get()

    def tensor(self, op, t, writeonly=False):
        st = t.untyped_storage()
        sd = getattr(st, "_tpu", None)
        if sd is None:  # not a tpu tensor
            dev = t.device
            if dev.type == "cpu" and t.dim() == 0:  # CPU scalars are allowed, as for CUDA
                self.dyn.append(host_scalar(t))
                self.key.append(("cpu0", t.dtype))
                return
            if dev.type == "tpu":  # reports tpu but has no tpu storage (a FakeTensor)
                raise RuntimeError(
                    f"torchtpu: {op} got a tensor that reports device {dev} but has no tpu "
                    f"storage ({type(t).__name__}, e.g. a fake tensor of torch.compile's "
                    f"shape propagation); only real tpu tensors can run on tpu")
            other = self.first_dev or torch.device("tpu", state.current_device)
            raise device_mismatch(op, other, dev)
        if self.index is None:
            self.index = sd.index
            self.first_dev = t.device
        elif sd.index != self.index:
            raise device_mismatch(op, self.first_dev, t.device)
        cid = st._cdata
        j = self.slots.get(cid)
        g = sd.arr
        if g.__class__ is _st.Grown:
            # a storage with spare capacity (eager.growth): a window view reads the
            # capacity array at runtime starts (one executable for every length);
            # anything else reads the exact array, cut on the device
            spec = (_st.grown_view_spec(t, sd, g, self.offs)
                    if self.grow_ok and not writeonly else None)
            if spec is not None:
                if j is None:
                    j = self.slots[cid] = len(self.arrays)
                    self.sdatas.append(sd)
                    self.arrays.append(g.arr)
                self.key.append((j, spec))
                return
            if g.chain is None:  # (eager.padded's storages: the ops without a rule)
                M.padded["cut_ops"][str(op)] += 1
            sd.get()
            if j is not None:  # its slot holds the capacity array: gather again
                self.regather = True
        if j is None:
            j = len(self.arrays)
            self.slots[cid] = j
            self.sdatas.append(sd)
            a = input_array(sd, writeonly, op in SHAPE_ONLY)
            if a.__class__ is _st.Padded:
                self.padded = True
            elif a.__class__ is _st.Lazy:
                if a.node is _st.ASYNC:
                    self.pending = True
                elif not CONFIG.defer:
                    self.stitched = True
            self.arrays.append(a)
        elif self.arrays[j] is None and not writeonly:
            a = self.arrays[j] = input_array(sd, False)
            if a.__class__ is _st.Padded:
                self.padded = True
            elif a.__class__ is _st.Lazy:
                self.pending = True
        offs = self.offs
        spec = _st.view_spec(t, sd) if offs is None else _st.dynamic_view_spec(t, sd, offs)
        if sd.arr is None:
            # an uninitialized storage (torch.empty): read, the executable reads zeros made
            # inside it, not a zeros array compiled per shape beforehand; written only
            # (out=), it is passed as None, which the key must tell from an array
            self.key.append((j, spec, "uninit_out" if writeonly else "uninit"))
        else:
            self.key.append((j, spec))


# Ops whose results depend on an input's shape, dtype and device only (autograd's loss
# seed ``ones_like(loss)``): in STRICT, such an op reading a pending value of a segment of
# stitched compiled graphs (``torchtpu.compile.graph``'s STITCH) is recorded into that
# segment instead of running it first, so a training step's forward graph, loss seed,
# backward graph and update stay one program.
SHAPE_ONLY = frozenset(
    getattr(torch.ops.aten, name).default
    for name in ("ones_like", "zeros_like", "empty_like", "full_like"))


def input_array(sd, writeonly, shape_only=False):
    """The storage array to pass to an executable: concrete, or a pending ``Lazy`` value
    (DeferAndFuse's, in STRICT an asynchronous first call's, or a stitched segment's
    that a ``shape_only`` op reads); ``None`` for an uninitialized storage
    (``torch.empty``)."""
    a = sd.arr
    if a is None:  # uninitialized: the executable makes the zeros it reads, if any
        return None
    if a.__class__ is _st.Lazy:
        if a.value is not None:
            sd.resolve(a.value)
            a = sd.arr
        elif a.node is _st.ASYNC:
            # a pending first call's result (eager.async_compile): passed on as it is (a
            # first call lowers on its shape; a run waits for it on a worker); DEBUG and
            # DeferAndFuse take arrays
            if CONFIG.defer or CONFIG.debug_sync:
                a = sd.get()
        elif not CONFIG.defer and not (shape_only and a.seg is not None and a.seg.graphs
                                       and not CONFIG.debug_sync):
            a = sd.get()
    # (an eager.buckets Padded array is returned as is: kept for a bucketed call, cut to
    # the storage's own array otherwise, see Call.unpad)
    return a


def host_scalar(t):
    if t.dtype == torch.bfloat16:
        return np.asarray(t.float().item(), dtype=runtime.to_np_dtype(torch.bfloat16))
    return np.asarray(t.item(), dtype=runtime.to_np_dtype(t.dtype))


_default_dtype = torch.get_default_dtype


def float_key(v: float):
    """A constant float argument as the cache key holds it where ``==`` misleads: -0.0
    equals 0.0 (an executable built for one returned the other's sign) and NaN equals
    nothing (every call compiled again)."""
    return ("float", repr(v))


def key_float(k):
    """The constant a key item holds: the float back from :func:`float_key`'s form."""
    if k.__class__ is tuple and len(k) == 2 and k[0] == "float":
        return float(k[1])
    return k


_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def _uint64(v: int) -> np.ndarray:
    """A Python int in [2**63, 2**64) as PyTorch holds it (an unsigned 64-bit Scalar:
    ``x * 2**63`` is 9.2234e18 for a float ``x`` and wraps to -2**63 for an int64 one);
    the lowering converts it to the result dtype as it does any Scalar.  (Python ints
    outside [-2**63, 2**64) never get here: PyTorch's argument parser refuses them.)"""
    return np.asarray(v, dtype=np.uint64)


# Scalar arguments that take part in the result's type promotion (``b == 2**63``,
# ``remainder``, ``clamp``); a fill ``value`` or an ``alpha`` does not
_PROMOTED_SCALARS = frozenset({"other", "min", "max", "exponent"})


def _runtime_number(c, v, kind, promoted: bool, vals, kinds) -> None:
    """Key item and runtime input of Python number ``v`` (of ``kind``): an int in
    [2**63, 2**64) goes as uint64 (``promoted``: it takes part in the result's type
    promotion, checked as PyTorch does: :func:`_check_unsigned_wrapped`)."""
    if kind is int and not _INT64_MIN <= v <= _INT64_MAX:
        if promoted:
            _check_unsigned_wrapped(vals, kinds)
        c.key.append(("S", int, "u64"))
        c.dyn.append(_uint64(v))
    else:
        c.key.append(("S", kind))
        c.dyn.append(np.asarray(v, dtype=SCALAR_NP[kind]))


def _check_unsigned_wrapped(vals, kinds) -> None:
    """PyTorch's type promotion for a Python int in [2**63, 2**64) (a UInt64 Scalar):
    with only bool tensors beside it, the result type would promote Bool and UInt64,
    which PyTorch refuses (``torch.ones(2, dtype=torch.bool) * 2**63``, ``b == 2**63``).
    (A few such calls CPU does compute, ``b.masked_fill(b, 2**63)``, raise here too: a
    clear error rather than a value this path cannot promise.)

    Raises:
        RuntimeError: PyTorch's "Promotion for uint16, uint32, uint64 types is not
            supported, attempted to promote Bool and UInt64"."""
    dtypes = [v.dtype for v, k in zip(vals, kinds)
              if (k == T or k == OPT_T) and isinstance(v, torch.Tensor)]
    if dtypes and all(d is torch.bool for d in dtypes):
        raise RuntimeError("Promotion for uint16, uint32, uint64 types is not supported, "
                           "attempted to promote Bool and UInt64")


def numbers(v) -> bool:
    """Whether ``v`` is a list of Python numbers (bool, int, float, complex)."""
    return isinstance(v, (list, tuple)) and all(
        x.__class__ in SCALAR_NP and (x.__class__ is not int or _INT64_MIN <= x <= _INT64_MAX)
        for x in v)


def gather(plan, vals):
    """Walk the normalized arguments: build the cache key and the dynamic inputs."""
    c = Call(not plan.sig.mutated_lists)
    c.grow_ok = not plan.sig.mutated and not CONFIG.defer
    op = plan.op
    key = c.key
    key.append(op)
    kinds = plan.sig.kinds
    defaults = plan.sig.defaults
    for i, v in enumerate(vals):
        k = kinds[i]
        if k == T or k == OPT_T:
            if v is None:
                key.append(None)
            elif isinstance(v, torch.Tensor):
                c.tensor(op, v, writeonly=i in plan.writeonly)
            else:  # a wrapped number (Python scalar promoted to a 0-d tensor by PyTorch)
                kind = bool if isinstance(v, bool) else int if isinstance(v, int) else (
                    float if isinstance(v, float) else complex)
                _runtime_number(c, v, kind, True, vals, kinds)
        elif k == T_LIST or k == OPT_T_LIST:
            key.append(("list", len(v)))
            for x in v:
                if x is None:
                    key.append(None)
                else:
                    c.tensor(op, x)
        elif k == SCALAR or k == OPT_SCALAR:
            if v is None:
                key.append(None)
            elif plan.lowering.static_scalars or v is defaults[i]:
                # static: compiled in as a constant (schema defaults such as alpha=1
                # never change, so passing them as device scalars would only cost)
                if v.__class__ is float and (v == 0 or v != v):
                    v = float_key(v)
                key.append(("s", type(v), v))
            else:
                if isinstance(v, torch.Tensor):  # a Scalar passed as 0-d tensor
                    v = v.item()
                kind = type(v) if type(v) in SCALAR_NP else (
                    bool if isinstance(v, bool) else int if isinstance(v, int) else
                    float if isinstance(v, float) else complex)
                _runtime_number(c, v, kind, plan.sig.names[i] in _PROMOTED_SCALARS, vals,
                                kinds)
        elif k == GEN:
            key.append("gen")
        elif k == SCALAR_LIST and not plan.lowering.static_scalars and numbers(v):
            # a Scalar[] of Python numbers: runtime inputs, as Scalar arguments are (an
            # optimizer's per-step bias corrections must not compile an executable each)
            key.append(("SL", tuple(x.__class__ for x in v)))
            c.dyn.extend(np.asarray(x, dtype=SCALAR_NP[x.__class__]) for x in v)
        else:
            if isinstance(v, list):
                v = tuple(v)
            elif v.__class__ is float and (v == 0 or v != v):
                v = float_key(v)
            key.append(v)
    if c.index is None:
        # factory-like call: the device comes from a static `device` argument
        dev = None
        for i, n in enumerate(plan.sig.names):
            if n == "device" and vals[i] is not None:
                dev = torch.device(vals[i])
        c.index = dev.index if dev is not None and dev.index is not None else state.current_device
    key.append(c.index)
    # the default dtype decides result dtypes the arguments do not show (an int or bool
    # tensor with a Python float, integer true division, factories without dtype=): an
    # executable built under torch.set_default_dtype(torch.float64) is not float32's
    key.append(_default_dtype())
    if plan.lowering.precision:  # torch.set_float32_matmul_precision, read at each call
        key.append(_matmul_precision())
    if plan.lowering.random:
        gen = None
        for i, k in enumerate(kinds):
            if k == GEN:
                gen = vals[i]
        rs = state.rng(c.index) if gen is None else generator_state(gen, c.index)
        c.dyn.append(rs.next_key_data())
    if c.offs:  # the views' storage offsets: one int32 array, always last
        c.dyn.append(np.asarray(c.offs, dtype=np.int32))
    if c.regather:  # a Grown storage was cut to its exact array midway
        return gather(plan, vals)
    return c


def generator_state(gen, index):
    from torchtpu._device import generator as _gen

    return _gen.state_of(gen, index)
