"""Factory lowerings: arange, full, zeros/ones, eye, linspace/logspace, tril/triu_indices.

In eager mode most PyTorch factories are CompositeExplicit: ``torch.zeros(3)`` reaches the
backend as ``empty`` + ``zero_``, ``torch.arange(10)`` as ``empty`` + ``arange.start_out``.
The functional overloads are lowered for the graph executors; the ``out=`` overloads that
eager mode sends are decomposed (``_out_factory``) into a direct call of the functional
lowering plus a write into ``out`` (the executor cannot pair ``arange.start_out`` with
``arange.start_step`` on its own: their argument names differ by dtype/device).

Values follow PyTorch's CPU kernels: arange is ``start + i*step`` computed in the
accumulate type (double for float32/64, float for half/bfloat16, int64 for integers) and
its length is PyTorch's rule; linspace/logspace use the two-sided "halfway" formula.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from torchtpu.ops import aten, lower, run_plan
from torchtpu.ops import decomp_overrides
from torchtpu.ops._scalar import Scalar, check_converts, fits, scalar_check
from torchtpu.ops._schema import Signature
from torchtpu.ops._util import cast, jnp, npdt, scalar_type_name, tdtype


def _num(x):
    """A static Python number from a static Scalar argument (or a number)."""
    if isinstance(x, Scalar):  # pragma: no cover - static_scalars gives numbers
        raise NotImplementedError("torchtpu: factory lowering needs a static Scalar")
    if isinstance(x, torch.Tensor):
        return x.item()
    return x


def _infer_dtype(*vals) -> torch.dtype:
    if any(isinstance(v, complex) for v in vals):
        return torch.complex64 if torch.get_default_dtype() is torch.float32 else torch.complex128
    if any(isinstance(v, float) for v in vals):
        return torch.get_default_dtype()
    if all(isinstance(v, bool) for v in vals):
        return torch.bool
    return torch.int64


def _acc(dtype: torch.dtype) -> torch.dtype:
    """PyTorch's CPU accumulate type (``acc_type<T, false>``)."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if dtype.is_floating_point:
        return torch.float64
    if dtype.is_complex:
        return torch.complex128
    return torch.int64


# ------------------------------------------------------------------------ arange


def arange_size(start, end, step, dtype: torch.dtype) -> int:
    """PyTorch's arange length (``compute_arange_size``), with its argument checks and
    CPU's dtype checks (no bool or complex kernel; complex bounds do not convert to
    double)."""
    if any(isinstance(v, complex) for v in (start, end, step)):
        raise RuntimeError("value cannot be converted to type double without overflow")
    if dtype is torch.bool or dtype.is_complex:
        raise NotImplementedError(
            f'"arange_cpu" not implemented for \'{scalar_type_name(dtype)}\'')
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if dtype is torch.int64:
        xs, xe, xst = int(start), int(end), int(step)
        sgn = (xst > 0) - (xst < 0)
        num = xe - xs + xst - sgn
        q = abs(num) // abs(xst)
        size_d = q if (num >= 0) == (xst > 0) else -q  # C++ truncating division
    else:
        size_d = math.ceil((float(end) - float(start)) / float(step))
    if not math.isfinite(size_d):
        raise RuntimeError(f"unsupported range: {start} -> {end}")
    if (step > 0 and start > end) or (step < 0 and start < end):
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    return max(int(size_d), 0)


@lower(aten.arange.start_step, static_scalars=True)
def arange_start_step(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    start, end, step = _num(start), _num(end), _num(step)
    dtype = dtype or _infer_dtype(start, end, step)
    n = arange_size(start, end, step, dtype)
    acc = _acc(dtype)
    j = jnp()
    i = j.arange(n, dtype=npdt(torch.int64 if not acc.is_floating_point else acc))
    if acc.is_floating_point:
        return (j.asarray(start, npdt(acc)) + j.asarray(step, npdt(acc)) * i).astype(npdt(dtype))
    return (int(start) + int(step) * i).astype(npdt(dtype))


@lower(aten.arange.start, static_scalars=True)
def arange_start(start, end, dtype=None, layout=None, device=None, pin_memory=None):
    return arange_start_step(start, end, 1, dtype)


@lower(aten.arange.default, static_scalars=True)
def arange_default(end, dtype=None, layout=None, device=None, pin_memory=None):
    return arange_start_step(0, end, 1, dtype)


# ----------------------------------------------------------------- full / zeros / ones


_SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64,
                 5: torch.float16, 6: torch.float32, 7: torch.float64, 9: torch.complex64,
                 10: torch.complex128, 11: torch.bool, 15: torch.bfloat16}


def as_dtype(dtype):
    """A schema dtype argument (a dtype, None, or a ScalarType default as int)."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return _SCALAR_TYPES[dtype]
    return dtype


def _dt(dtype):
    return as_dtype(dtype) or torch.get_default_dtype()


def _default_dtype_of(value) -> torch.dtype:
    """The dtype ``torch.full``/``scalar_tensor`` infer from a Python fill value."""
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    if isinstance(value, complex):
        return torch.complex128 if torch.get_default_dtype() is torch.float64 else torch.complex64
    return torch.get_default_dtype()


@scalar_check
def _full_fits(vals):
    """``torch.full((2,), 300, dtype=torch.int8)`` raises as on CPU."""
    vals[1] = check_converts(vals[1], vals[2] or _default_dtype_of(vals[1]), math.prod(vals[0]))
    return vals


@scalar_check
def _full_like_fits(vals):
    vals[1] = check_converts(vals[1], vals[2] or vals[0].dtype, vals[0].numel())
    return vals


@scalar_check
def _scalar_tensor_fits(vals):
    vals[0] = check_converts(vals[0], vals[1] or torch.get_default_dtype(), 1)
    return vals


@lower(aten.full.default, prepare=_full_fits)
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    dt = dtype or (torch.get_default_dtype() if fill_value.kind is float else tdtype(fill_value))
    return jnp().full(tuple(size), cast(fill_value, dt), npdt(dt))


@lower(aten.full_like.default, prepare=_full_like_fits)
def full_like(x, fill_value, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    dt = dtype or tdtype(x)
    return jnp().full(x.shape, cast(fill_value, dt), npdt(dt))


@lower(aten.scalar_tensor.default, prepare=_scalar_tensor_fits)
def scalar_tensor(s, dtype=None, layout=None, device=None, pin_memory=None):
    return cast(s, _dt(dtype))


@lower(aten.zeros.default)
def zeros(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp().zeros(tuple(size), npdt(_dt(dtype)))


@lower(aten.ones.default)
def ones(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp().ones(tuple(size), npdt(_dt(dtype)))


@lower(aten.zeros_like.default)
def zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp().zeros(x.shape, npdt(dtype or tdtype(x)))


@lower(aten.ones_like.default)
def ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp().ones(x.shape, npdt(dtype or tdtype(x)))


# ----------------------------------------------------------------------------- eye


@lower(aten.eye.default)
def eye(n, dtype=None, layout=None, device=None, pin_memory=None):
    return eye_m(n, n, dtype)


@lower(aten.eye.m)
def eye_m(n, m, dtype=None, layout=None, device=None, pin_memory=None):
    if n < 0 or m < 0:
        raise RuntimeError(f"n must be greater or equal to 0, got {min(n, m)}")
    return jnp().eye(n, m, dtype=npdt(_dt(dtype)))


# ---------------------------------------------------------------- linspace / logspace


def _halfway(start, end, steps, ct):
    """PyTorch's linspace values in compute dtype ``ct`` (numpy dtype)."""
    j = jnp()
    if steps == 0:
        return j.zeros((0,), ct)
    if steps == 1:
        return j.full((1,), start, ct)
    s = j.asarray(start, ct)
    e = j.asarray(end, ct)
    step = (e - s) / (steps - 1)
    idx = j.arange(steps).astype(ct)
    halfway = steps // 2
    return j.where(j.arange(steps) < halfway, s + step * idx, e - step * (steps - 1 - idx))


def _space_ends(start, end, dtype):
    """linspace/logspace end points as CPU and CUDA read them: ``Scalar::to<scalar_t>()``,
    so an integer dtype truncates them and float16/bfloat16 round them
    (``linspace(4.3, -3, 50, dtype=bfloat16)`` starts at 4.3125)."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return int(start), int(end)
    if dtype in (torch.float16, torch.bfloat16):
        return tuple(v if isinstance(v, complex) else float(torch.tensor(float(v), dtype=dtype))
                     for v in (start, end))
    return start, end


def _space_ct(dtype):
    if dtype.is_complex:
        return npdt(dtype)
    if dtype in (torch.float16, torch.bfloat16):
        return npdt(torch.float32)
    if dtype.is_floating_point:
        return npdt(dtype)
    return npdt(torch.float64)


def _to_int_trunc(v, dtype):
    if not (dtype.is_floating_point or dtype.is_complex):
        v = jnp().trunc(v)
    return v.astype(npdt(dtype))


def _space_dtype(pos):
    """The result dtype of linspace/logspace (``dtype`` argument at ``pos``, else the
    default dtype, complex when an end point is complex)."""

    def dtype(vals):
        dt = as_dtype(vals[pos])
        if dt is not None:
            return dt
        if any(isinstance(v, complex) for v in vals[:2]):
            return _default_dtype_of(1j)
        return torch.get_default_dtype()

    return dtype


# start/end: CPU's checked Scalar::to<T>() (linspace(0, 300, dtype=int8) raises)
@lower(aten.linspace.default, static_scalars=True, prepare=fits(0, 1, dtype=_space_dtype(3)))
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    dtype = _dt(dtype)
    start, end = _space_ends(_num(start), _num(end), dtype)
    ct = _space_ct(dtype)
    return _to_int_trunc(_halfway(start, end, steps, ct), dtype)


@lower(aten.logspace.default, static_scalars=True, prepare=fits(0, 1, dtype=_space_dtype(4)))
def logspace(start, end, steps, base=10.0, dtype=None, layout=None, device=None,
             pin_memory=None):
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    dtype = _dt(dtype)
    start, end = _space_ends(_num(start), _num(end), dtype)
    ct = _space_ct(dtype)
    exps = _halfway(start, end, steps, ct)
    return _to_int_trunc(jnp().power(jnp().asarray(base, ct), exps), dtype)


# ------------------------------------------------------------- tril / triu indices


def _tri_indices(row, col, offset, dtype, upper):
    if row < 0 or col < 0:
        raise RuntimeError(f"row and col must be non-negative, got {row}, {col}")
    mask = np.tri(row, col, offset, dtype=bool)
    if upper:
        mask = ~np.tri(row, col, offset - 1, dtype=bool)
    r, c = np.nonzero(mask)
    return jnp().asarray(np.stack([r, c]).astype(npdt(as_dtype(dtype) or torch.int64)).reshape(2, -1))


@lower(aten.tril_indices.default)
def tril_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(row, col, offset, dtype, False)


@lower(aten.triu_indices.default)
def triu_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(row, col, offset, dtype, True)


# ------------------------------------------------------------- eager out= factories


def _run_functional(op, args, kwargs):
    """Run ``op``'s lowering directly (not through the dispatcher: the functional
    factories are CompositeExplicit and would come straight back to the out= op)."""
    return run_plan(op, args, kwargs)


def write_out(out: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Write result ``r`` into ``out`` (resizing it as PyTorch's out= ops do)."""
    from torchtpu._tensor import storage as _st

    if tuple(out.shape) != tuple(r.shape):
        out.resize_(r.shape)
    sd = _st.data(out)
    rsd = _st.data(r)
    if (out.dtype == r.dtype and len(_st.view_spec(out, sd)) == 2
            and len(_st.view_spec(r, rsd)) == 2):
        # each is its whole storage: swap the array, no copy (a padded array as it is:
        # eager.padded's arange)
        sd.arr = rsd.arr if rsd.arr.__class__ is _st.Grown else rsd.get()
        return out
    out.copy_(r)
    return out


def _out_factory(out_op, func_op):
    """Register the decomposition of factory ``out_op`` into ``func_op`` + ``write_out``."""
    sig = Signature(out_op)

    def fn(*args, **kwargs):
        vals = sig.normalize(args, kwargs)
        (o,) = sig.out_args
        out = vals[o]
        kw = {n: v for i, (n, v) in enumerate(zip(sig.names, vals)) if i != o}
        kw["dtype"] = out.dtype
        kw["device"] = out.device
        r = _run_functional(func_op, (), kw)
        return write_out(out, r)

    decomp_overrides.decomp(out_op)(fn)
    return fn


_out_factory(aten.arange.start_out, aten.arange.start_step)
_out_factory(aten.arange.out, aten.arange.default)
_out_factory(aten.eye.out, aten.eye.default)
_out_factory(aten.eye.m_out, aten.eye.m)
_out_factory(aten.linspace.out, aten.linspace.default)
_out_factory(aten.logspace.out, aten.logspace.default)
_out_factory(aten.randperm.generator_out, aten.randperm.generator)
_out_factory(aten.randperm.out, aten.randperm.default)


@lower(aten._efficientzerotensor.default)
def _efficientzerotensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    """The zero tensor autograd and ``torch.func`` use for gradients known to be zero
    (``torch.func.hessian``...): a plain zero-filled tensor of ``size``/``dtype`` (CPU's
    is a ZeroTensor that shares no storage; as values they are the same)."""
    return jnp().zeros(tuple(size), npdt(_dt(dtype)))
