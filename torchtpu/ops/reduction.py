"""Reduction lowerings: sum/mean/prod, min/max families, any/all, var/std, cumulative ops,
logsumexp, vector norms, sort and topk.

Dtype rules follow PyTorch: integer and bool sums/products accumulate in int64;
half/bfloat16 reductions accumulate in float32 (``opmath``) and round once; an explicit
``dtype=`` casts the input before reducing.  ``dim=None`` or ``dim=[]`` means every
dimension.  Max/min/argmax/argmin propagate NaN (the first NaN wins for the indices), and
sort/topk order NaN above every number, like PyTorch's CPU kernels.  Index outputs are
int64.  The executor casts each result to the dtype of PyTorch's meta kernel.
"""

from __future__ import annotations

import math
import warnings

import torch

from torchtpu import _compat
from torchtpu.ops import aten, lower
from torchtpu.ops._scalar import fits, scalar_check
from torchtpu.ops._util import (cast, ieee_div, jnp, lax, npdt, opmath, scalar_type_name,
                                tdtype)


# ------------------------------------------------------------------ helpers


def _dims(ndim: int, dim) -> tuple:
    """Normalized reduction dims; ``None``/``[]`` mean all dims (0-d: nothing)."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(ndim))
    n = max(ndim, 1)
    out = []
    for d in dim:
        d = d + n if d < 0 else d
        if ndim == 0:
            continue  # dim 0 / -1 of a 0-d tensor reduces nothing
        out.append(d)
    return tuple(sorted(set(out)))


def _one_dim(ndim: int, dim: int) -> int:
    return dim + max(ndim, 1) if dim < 0 else dim


def _out_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def _is_int_or_bool(dt: torch.dtype) -> bool:
    return not (dt.is_floating_point or dt.is_complex)


def _is_floatlike(x) -> bool:
    j = jnp()
    return j.issubdtype(x.dtype, j.floating) or j.issubdtype(x.dtype, j.complexfloating)


def _accum_dtype(x, dtype) -> torch.dtype:
    """Result dtype of sum/prod/cumsum: ``dtype`` if given, int64 for ints/bool."""
    if dtype is not None:
        return dtype
    dt = tdtype(x)
    return torch.int64 if _is_int_or_bool(dt) else dt


def _empty_guard(x, dims, keepdim, fill, dtype=None):
    """Result for a reduction whose output has no elements (avoids jnp's empty checks)."""
    shape = _out_shape(x.shape, dims, keepdim)
    if math.prod(shape) == 0:
        return jnp().full(shape, fill, dtype or x.dtype)
    return None


def _max_nan(x, dims, keepdim, is_max: bool):
    """amax/amin over ``dims`` with NaN propagation (XLA's max/min already propagate
    NaN, but we make it explicit so it does not depend on the backend)."""
    j = jnp()
    if x.dtype == j.bool_:
        return (j.any if is_max else j.all)(x, axis=dims, keepdims=keepdim)
    r = (j.max if is_max else j.min)(x, axis=dims, keepdims=keepdim)
    if j.issubdtype(x.dtype, j.floating):
        nan = j.any(j.isnan(x), axis=dims, keepdims=keepdim)
        r = j.where(nan, j.asarray(j.nan, x.dtype), r)
    return r


def _reduce_raise(name, x, dims):
    if any(x.shape[d] == 0 for d in dims) or (not dims and x.ndim > 0 and x.size == 0):
        raise RuntimeError(
            f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
            f"Specify the reduction dim with the 'dim' argument."
        )


# ------------------------------------------------------------------ sum / mean / prod


@lower(aten.sum.dim_IntList)
def sum_dim(x, dim=None, keepdim=False, dtype=None):
    out = _accum_dtype(x, dtype)
    dims = _dims(x.ndim, dim)
    xc = cast(x, opmath(out))
    return jnp().sum(xc, axis=dims, keepdims=keepdim)


@lower(aten.sum.default)
def sum_default(x, dtype=None):
    return sum_dim(x, None, False, dtype)


@lower(aten.mean.dim)
def mean_dim(x, dim=None, keepdim=False, dtype=None):
    out = dtype if dtype is not None else tdtype(x)
    if _is_int_or_bool(out):
        raise RuntimeError(
            "mean(): could not infer output dtype. Input dtype must be either a floating "
            f"point or complex dtype. Got: {out}"
        )
    dims = _dims(x.ndim, dim)
    xc = cast(x, opmath(out))
    n = math.prod(x.shape[d] for d in dims)
    s = jnp().sum(xc, axis=dims, keepdims=keepdim)
    if not n:
        return s * jnp().asarray(jnp().nan, s.dtype)
    return ieee_div(s, jnp().asarray(n, s.dtype))


@lower(aten.mean.default)
def mean_default(x, dtype=None):
    return mean_dim(x, None, False, dtype)


@lower(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, dtype=None):
    out = _accum_dtype(x, dtype)
    dims = _dims(x.ndim, [dim])
    return jnp().prod(cast(x, opmath(out)), axis=dims, keepdims=keepdim)


@lower(aten.prod.default)
def prod_default(x, dtype=None):
    out = _accum_dtype(x, dtype)
    return jnp().prod(cast(x, opmath(out)))


@lower(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, dtype=None):
    if dim and x.ndim > 64:  # CPU's dim bitset (PyTorch's meta kernel skips the check)
        raise RuntimeError("only tensors with up to 64 dims are supported")
    out = _accum_dtype(x, dtype)
    dims = _dims(x.ndim, dim)
    xc = cast(x, opmath(out))
    if _is_floatlike(xc):
        xc = jnp().where(jnp().isnan(xc), jnp().zeros_like(xc), xc)
    return jnp().sum(xc, axis=dims, keepdims=keepdim)


@lower(aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim):
    dims = _dims(x.ndim, dim)
    return jnp().sum((x != 0).astype(npdt(torch.int64)), axis=dims)


@lower(aten.count_nonzero.default)
def count_nonzero_default(x, dim=None):
    dims = _dims(x.ndim, dim)
    return jnp().sum((x != 0).astype(npdt(torch.int64)), axis=dims)


# ------------------------------------------------------------------ amax / amin / any / all


@lower(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    dims = _dims(x.ndim, dim)
    _reduce_raise("amax", x, dims)
    e = _empty_guard(x, dims, keepdim, 0)
    return e if e is not None else _max_nan(x, dims, keepdim, True)


@lower(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    dims = _dims(x.ndim, dim)
    _reduce_raise("amin", x, dims)
    e = _empty_guard(x, dims, keepdim, 0)
    return e if e is not None else _max_nan(x, dims, keepdim, False)


@scalar_check
def _aminmax_real(vals):
    """CPU's kernel has no complex case (0-d inputs included): torch 2.15 raises
    TypeError, 2.13-2.14 RuntimeError (a host-side check: a TypeError raised while
    tracing would read as a lowering failure)."""
    if vals[0].dtype.is_complex:
        exc = _compat.error_since(2, 15, TypeError)
        raise exc(f"aminmax not implemented for {scalar_type_name(vals[0].dtype)}")
    return vals


@lower(aten.aminmax.default, prepare=_aminmax_real)
def aminmax(x, dim=None, keepdim=False):
    if dim is None and x.size == 0:
        raise RuntimeError(
            "aminmax(): cannot compute aminmax over an empty dimension as the operation "
            "has no identity."
        )
    dims = _dims(x.ndim, None if dim is None else [dim])
    if dim is not None and x.ndim > 0 and x.shape[dims[0]] == 0:
        raise RuntimeError(
            "aminmax(): Expected reduction dim 0 to have non-zero size."
        )
    e = _empty_guard(x, dims, keepdim, 0)
    if e is not None:
        return e, e
    return _max_nan(x, dims, keepdim, False), _max_nan(x, dims, keepdim, True)


def _to_bool(x):
    return x if x.dtype == jnp().bool_ else (x != 0)


def _bool_reduction(name, pkt):
    """Register ``any``/``all`` (.default, .dim, .dims) as one jnp reduction on bools."""

    def default(x):
        return getattr(jnp(), name)(_to_bool(x))

    def one_dim(x, dim, keepdim=False):
        return getattr(jnp(), name)(_to_bool(x), axis=_dims(x.ndim, [dim]), keepdims=keepdim)

    def dims(x, dim=None, keepdim=False):
        if dim is not None and len(dim) == 0:  # all/any over dim=[] reduce nothing (as CPU)
            return _to_bool(x)
        return getattr(jnp(), name)(_to_bool(x), axis=_dims(x.ndim, dim), keepdims=keepdim)

    def bytebool_out(vals, dts):
        """``out_dtypes`` hook (build time): CPU's ``allany_meta`` accepts only a bool or
        uint8 ``out=`` tensor; PyTorch's meta kernel (its Python reference) casts into any."""
        out = vals[-1] if len(vals) > 1 else None
        if isinstance(out, torch.Tensor) and out.dtype not in (torch.bool, torch.uint8):
            raise RuntimeError(f"{name} only supports bool tensor for result, got: "
                               f"{scalar_type_name(out.dtype)}")
        return dts

    lower(pkt.default, out_dtypes=bytebool_out)(default)
    lower(pkt.dim, out_dtypes=bytebool_out)(one_dim)
    lower(pkt.dims, out_dtypes=bytebool_out)(dims)


_bool_reduction("any", aten.any)
_bool_reduction("all", aten.all)


# ------------------------------------------------------------------ arg/max/min with indices


def _ext_with_index(x, axis: int, keepdim: bool, is_max: bool):
    """(values, first index) of the max/min along ``axis``; NaN wins (first NaN)."""
    j = jnp()
    if x.dtype == j.bool_:
        x = x.astype(j.uint8)
    n = x.shape[axis]
    m = _max_nan(x, (axis,), True, is_max)
    hit = x == m
    if j.issubdtype(x.dtype, j.floating):
        hit = hit | (j.isnan(x) & j.isnan(m))
    iota = lax().broadcasted_iota(npdt(torch.int64), x.shape, axis)
    idx = j.min(j.where(hit, iota, j.asarray(n, iota.dtype)), axis=axis, keepdims=True)
    if j.issubdtype(x.dtype, j.floating):
        # CPU returns the element at the first index: XLA's max of -0.0 and 0.0 is +0.0
        # whatever the order.  A zero extreme takes the sign of that element (a max over
        # it and infinities of the other sign: no tie left)
        low = j.asarray(-j.inf if is_max else j.inf, x.dtype)
        at = (j.max if is_max else j.min)(j.where(iota == idx, x, low), axis=axis,
                                          keepdims=True)
        m = j.where(m == 0, at, m)
    if not keepdim:
        m = j.squeeze(m, axis)
        idx = j.squeeze(idx, axis)
    return m, idx


def _arg(x, dim, keepdim, is_max, name):
    j = jnp()
    if x.dtype == j.bool_:
        exc = _compat.error_since(2, 15, NotImplementedError)
        raise exc(f"{name}(): does not support bool input")
    if dim is not None and x.ndim > 64:  # CPU's dim bitset (the meta kernel skips it)
        raise RuntimeError("only tensors with up to 64 dims are supported")
    if dim is None:
        if x.size == 0:
            raise IndexError(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0."
            )
        flat = x.reshape(-1)
        _, idx = _ext_with_index(flat, 0, False, is_max)
        if keepdim:
            idx = idx.reshape((1,) * x.ndim)
        return idx
    if x.ndim == 0:
        return j.zeros((), npdt(torch.int64))
    axis = _one_dim(x.ndim, dim)
    if x.shape[axis] == 0:
        raise IndexError(
            f"{name}(): Expected reduction dim {dim} to have non-zero size."
        )
    e = _empty_guard(x, (axis,), keepdim, 0, npdt(torch.int64))
    if e is not None:
        return e
    return _ext_with_index(x, axis, keepdim, is_max)[1]


@lower(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _arg(x, dim, keepdim, True, "argmax")


@lower(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _arg(x, dim, keepdim, False, "argmin")


def _ext_dim(x, dim, keepdim, is_max, name):
    j = jnp()
    if x.ndim == 0:
        return x, j.zeros((), npdt(torch.int64))
    axis = _one_dim(x.ndim, dim)
    if x.shape[axis] == 0:
        raise IndexError(
            f"{name}(): Expected reduction dim {dim} to have non-zero size."
        )
    shape = _out_shape(x.shape, (axis,), keepdim)
    if math.prod(shape) == 0:
        return j.zeros(shape, x.dtype), j.zeros(shape, npdt(torch.int64))
    m, idx = _ext_with_index(x, axis, keepdim, is_max)
    return m.astype(x.dtype), idx


@lower(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return _ext_dim(x, dim, keepdim, True, "max")


@lower(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return _ext_dim(x, dim, keepdim, False, "min")


@lower(aten.max.default)
def max_default(x):
    if x.size == 0:
        raise RuntimeError(
            "max(): Expected reduction dim to be specified for input.numel() == 0. "
            "Specify the reduction dim with the 'dim' argument."
        )
    return _max_nan(x, tuple(range(x.ndim)), False, True)


@lower(aten.min.default)
def min_default(x):
    if x.size == 0:
        raise RuntimeError(
            "min(): Expected reduction dim to be specified for input.numel() == 0. "
            "Specify the reduction dim with the 'dim' argument."
        )
    return _max_nan(x, tuple(range(x.ndim)), False, False)


# ------------------------------------------------------------------ var / std


def _var(x, dim, correction, keepdim):
    """(var, mean) in opmath: sum(|x - mean|^2) / max(0, N - correction)."""
    j = jnp()
    dt = tdtype(x)
    if _is_int_or_bool(dt):
        exc = _compat.error_since(2, 15, NotImplementedError)
        raise exc("std and var only support floating point and complex dtypes")
    ct = opmath(dt)
    xc = cast(x, ct)
    dims = _dims(x.ndim, dim)
    n = math.prod(x.shape[d] for d in dims)
    nan = j.asarray(j.nan, xc.dtype)
    if n:
        mean = ieee_div(j.sum(xc, axis=dims, keepdims=True), j.asarray(n, xc.dtype))
    else:
        mean = j.sum(xc, axis=dims, keepdims=True) * nan
    d = xc - mean
    if dt.is_complex:
        sq = j.real(d) ** 2 + j.imag(d) ** 2
    else:
        sq = d * d
    s = j.sum(sq, axis=dims, keepdims=keepdim)
    if correction is None:
        c = j.asarray(1.0, s.dtype)
    else:
        c = cast(correction, torch.float64).astype(s.dtype)
    denom = j.maximum(j.asarray(n, s.dtype) - c, j.asarray(0, s.dtype))
    # nothing reduced: NaN whatever the correction, as CPU (its mean is NaN; a negative
    # correction would otherwise give 0 / (0 - c) = 0)
    var = ieee_div(s, denom) if n else s * j.asarray(j.nan, s.dtype)
    if not keepdim:
        mean = j.squeeze(mean, dims) if dims else mean
    return var, mean


def _dof_check(name, unbiased=False):
    """``prepare`` of var/std(_mean): CPU warns "degrees of freedom is <= 0" when the
    correction is not below the number of elements reduced per output (host-side, per
    call: the executable is shared by every correction)."""

    def prepare(vals):
        x, dim, c = vals[0], vals[1], vals[2]
        if unbiased:
            c = 1.0 if c else 0.0
        elif c is None:
            c = 1.0
        elif not isinstance(c, (int, float)):
            return vals
        if x.numel() == 0:
            return vals
        dims = _dims(x.dim(), dim)
        n = math.prod(x.shape[d] for d in dims)
        if n - c <= 0:
            warnings.warn(
                f"{name}(): degrees of freedom is <= 0. Correction should be strictly less "
                f"than the reduction factor (input numel divided by output numel).",
                UserWarning, stacklevel=2)
        return vals

    return prepare


@lower(aten.var.correction, prepare=_dof_check("var"))
def var_correction(x, dim=None, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)[0]


@lower(aten.std.correction, prepare=_dof_check("std"))
def std_correction(x, dim=None, correction=None, keepdim=False):
    return jnp().sqrt(_var(x, dim, correction, keepdim)[0])


@lower(aten.var_mean.correction, prepare=_dof_check("var_mean"))
def var_mean_correction(x, dim=None, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)


@lower(aten.std_mean.correction, prepare=_dof_check("std_mean"))
def std_mean_correction(x, dim=None, correction=None, keepdim=False):
    v, m = _var(x, dim, correction, keepdim)
    return jnp().sqrt(v), m


@lower(aten.var.dim, prepare=_dof_check("var", unbiased=True))
def var_dim(x, dim=None, unbiased=True, keepdim=False):
    from torchtpu.ops._scalar import Scalar

    c = Scalar(jnp().asarray(1.0 if unbiased else 0.0), float)
    return _var(x, dim, c, keepdim)[0]


@lower(aten.std.dim, prepare=_dof_check("std", unbiased=True))
def std_dim(x, dim=None, unbiased=True, keepdim=False):
    return jnp().sqrt(var_dim(x, dim, unbiased, keepdim))


# ------------------------------------------------------------------ cumulative


def _cum(x, dim, dtype, fn):
    out = _accum_dtype(x, dtype)
    xc = cast(x, opmath(out))
    if xc.ndim == 0:
        return xc
    axis = _one_dim(x.ndim, dim)
    if xc.size == 0:
        return xc
    return fn(xc, axis=axis)


@lower(aten.cumsum.default)
def cumsum(x, dim, dtype=None):
    return _cum(x, dim, dtype, jnp().cumsum)


@lower(aten.cumprod.default)
def cumprod(x, dim, dtype=None):
    return _cum(x, dim, dtype, jnp().cumprod)


def _cum_ext(x, dim, is_max):
    """cummax/cummin: running extreme and the index of its last occurrence (PyTorch CPU
    uses ``>=``/``<=`` so ties move the index forward; NaN sticks)."""
    j = jnp()
    if x.ndim == 0:
        return x, j.zeros((), npdt(torch.int64))
    axis = _one_dim(x.ndim, dim)
    if x.size == 0:
        return x, j.zeros(x.shape, npdt(torch.int64))
    xv = x.astype(j.uint8) if x.dtype == j.bool_ else x
    is_f = j.issubdtype(xv.dtype, j.floating)
    iota = lax().broadcasted_iota(npdt(torch.int64), x.shape, axis)

    def combine(a, b):
        va, ia = a[0], a[1]
        vb, ib = b[0], b[1]
        take_b = (vb >= va) if is_max else (vb <= va)
        if is_f:
            take_b = (take_b & ~j.isnan(va)) | j.isnan(vb)
        return tuple(j.where(take_b, eb, ea) for ea, eb in zip(a, b))

    if not is_f:
        v, i = lax().associative_scan(combine, (xv, iota), axis=axis)
        return v.astype(x.dtype), i
    # the value is x at the index (CPU's): associative_scan interleaves its partial
    # results with pad + add, and -0.0 + 0.0 is +0.0; the sign rides along as an int
    v, i, neg = lax().associative_scan(combine, (xv, iota, j.signbit(xv).astype(j.int8)),
                                       axis=axis)
    v = j.where((v == 0) & (neg != 0), j.asarray(-0.0, v.dtype), v)
    return v.astype(x.dtype), i


@lower(aten.cummax.default)
def cummax(x, dim):
    return _cum_ext(x, dim, True)


@lower(aten.cummin.default)
def cummin(x, dim):
    return _cum_ext(x, dim, False)


@lower(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    """CPU accumulates in ``acc_type`` (double for float32) and rounds each prefix once;
    a float32 scan is off by an ulp at large magnitudes, which the backward (exp of
    differences of such values) turns into 1e-3 relative errors: float32 accumulates in
    float64 here too, half types in float32 (their CPU acc_type)."""
    dt = tdtype(x)
    if dt.is_complex:
        _raise("logcumsumexp", "complex input")
    acc = torch.float64 if dt in (torch.float32, torch.float64) else opmath(dt)
    xc = cast(x, acc)
    if xc.ndim == 0 or xc.size == 0:
        return cast(xc, opmath(dt))
    axis = _one_dim(x.ndim, dim)
    return cast(lax().cumlogsumexp(xc, axis=axis), opmath(dt))


def _raise(op, case):
    raise NotImplementedError(f"torchtpu: {op} does not support {case}")


# ------------------------------------------------------------------ logsumexp / norms


@lower(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    j = jnp()
    dt = tdtype(x)
    if _is_int_or_bool(dt):
        dt = torch.get_default_dtype()
    xc = cast(x, opmath(dt))
    dims = _dims(x.ndim, dim)
    if xc.size == 0:
        return j.log(j.sum(j.exp(xc), axis=dims, keepdims=keepdim))
    m = _max_nan(xc, dims, True, True)
    if dt.is_complex:
        _raise("logsumexp", "complex input")
    m = j.where(j.abs(m) == j.inf, j.zeros_like(m), m)
    s = j.sum(j.exp(xc - m), axis=dims, keepdims=True)
    r = j.log(s) + m
    if not keepdim:
        r = j.squeeze(r, dims) if dims else r
    return r


@lower(aten.linalg_vector_norm.default, static_scalars=True)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    j = jnp()
    src = dtype if dtype is not None else tdtype(x)
    if _is_int_or_bool(src):
        raise RuntimeError(
            "linalg.vector_norm: Expected a floating point or complex tensor as input. "
            f"Got {src}"
        )
    xc = cast(x, opmath(src))
    a = j.abs(xc)
    dims = _dims(x.ndim, dim)
    p = float(ord)
    e = _empty_guard(x, dims, keepdim, 0, a.dtype)
    if e is not None:
        return e
    if any(x.shape[d] == 0 for d in dims) or (x.size == 0 and not dims):
        if p == math.inf or p == -math.inf:
            raise RuntimeError(
                "linalg.vector_norm cannot compute the inf norm on an empty tensor because "
                "the operation does not have an identity"
            )
    if p == math.inf:
        return _max_nan(a, dims, keepdim, True)
    if p == -math.inf:
        return _max_nan(a, dims, keepdim, False)
    if p == 0:
        return j.sum((a != 0).astype(a.dtype), axis=dims, keepdims=keepdim)
    if p == 1:
        return j.sum(a, axis=dims, keepdims=keepdim)
    if p == 2:
        return j.sqrt(j.sum(a * a, axis=dims, keepdims=keepdim))
    pv = j.asarray(p, a.dtype)
    return j.sum(a ** pv, axis=dims, keepdims=keepdim) ** (j.asarray(1.0, a.dtype) / pv)


# ------------------------------------------------------------------ sort / topk


def _sort_key(x):
    """A sort key where NaNs (any sign) are the largest values and -0.0 == 0.0."""
    j = jnp()
    if x.dtype == j.bool_:
        return x.astype(j.uint8)
    if j.issubdtype(x.dtype, j.floating):
        k = j.where(x == 0, j.zeros_like(x), x)
        return j.where(j.isnan(x), j.asarray(j.nan, x.dtype), k)
    if j.issubdtype(x.dtype, j.complexfloating):
        _raise("sort", "complex input")
    return x


def _sort(x, axis: int, descending: bool):
    """Stable sort along ``axis``: (values, int64 indices); descending keeps ties in
    index order (sort the reversed array ascending, then reverse)."""
    j = jnp()
    n = x.shape[axis]
    iota = lax().broadcasted_iota(npdt(torch.int64), x.shape, axis)
    if descending:
        xr = j.flip(x, axis)
        _, v, i = lax().sort((_sort_key(xr), xr, iota), dimension=axis, is_stable=True, num_keys=1)
        return j.flip(v, axis), (n - 1) - j.flip(i, axis)
    _, v, i = lax().sort((_sort_key(x), x, iota), dimension=axis, is_stable=True, num_keys=1)
    return v, i


@lower(aten.sort.default)
def sort(x, dim=-1, descending=False):
    j = jnp()
    if x.ndim == 0:
        return x, j.zeros((), npdt(torch.int64))
    axis = _one_dim(x.ndim, dim)
    if x.size == 0:
        return x, j.zeros(x.shape, npdt(torch.int64))
    return _sort(x, axis, descending)


@lower(aten.sort.stable)
def sort_stable(x, stable=None, dim=-1, descending=False):
    return sort(x, dim, descending)


@lower(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    """Largest/smallest ``k`` along ``dim`` (ties: lowest index first; NaN largest).
    ``sorted=False`` also returns them sorted (PyTorch leaves the order unspecified).

    CPU's choice among equal values is libstdc++'s: ``std::partial_sort`` (a heap) when
    ``k * 64 <= n``, else ``std::nth_element`` (introselect) and a ``std::sort`` of the
    first ``k - 1``.  That is the lowest index first, as here, for ``n <= 3`` and for
    ``k == 1`` with ``n >= 64``; other ties come back in an order of those algorithms'
    making (not reproduced: the values agree, their indices among ties may not)."""
    j = jnp()
    if x.dtype == j.bool_:
        raise RuntimeError("topk does not support bool dtypes on CPU")
    if x.ndim == 0:
        return x, j.zeros((), npdt(torch.int64))
    axis = _one_dim(x.ndim, dim)
    shape = list(x.shape)
    shape[axis] = k
    if x.size == 0 or k == 0:
        return j.zeros(shape, x.dtype), j.zeros(shape, npdt(torch.int64))
    v, i = _sort(x, axis, largest)
    return lax().slice_in_dim(v, 0, k, axis=axis), lax().slice_in_dim(i, 0, k, axis=axis)


@lower(aten.argsort.stable)
def argsort_stable(x, stable=False, dim=-1, descending=False):
    return sort(x, dim, descending)[1]


@lower(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    j = jnp()
    if x.ndim == 0:
        return x, j.zeros((), npdt(torch.int64))
    axis = _one_dim(x.ndim, dim)
    n = x.shape[axis]
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue(): selected number k out of range for dimension {dim}")
    _not_for_bool(x, "kthvalue_tpu")  # CPU: "kthvalue_cpu"
    v, i = _sort(x, axis, False)
    v = lax().slice_in_dim(v, k - 1, k, axis=axis)
    i = lax().slice_in_dim(i, k - 1, k, axis=axis)
    if not keepdim:
        v, i = j.squeeze(v, axis), j.squeeze(i, axis)
    return v, i


@lower(aten.norm.Scalar, aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dtype,
       aten.norm.ScalarOpt_dim_dtype, static_scalars=True)
def norm(x, p=2, dim=None, keepdim=False, dtype=None):
    """Legacy ``torch.norm`` with a Scalar ``p``: a vector norm over ``dim`` (all dims
    when omitted); ``p=None`` means 2."""
    if isinstance(dim, torch.dtype):  # norm.ScalarOpt_dtype(self, p, *, dtype)
        dim, dtype = None, dim
    return linalg_vector_norm(x, 2 if p is None else p, dim, keepdim, dtype)


def _median(x, dim, keepdim, ignore_nan):
    """(values, int64 indices) of the lower median along ``dim`` from a stable sort.
    ``median`` returns the first NaN of a slice that has one; ``nanmedian`` skips NaNs
    (an all-NaN slice gives NaN and the index of its first NaN)."""
    j = jnp()
    i64 = npdt(torch.int64)
    if x.ndim == 0:
        _not_for_bool(x, "median_out")
        return x, j.zeros((), i64)
    axis = _one_dim(x.ndim, dim)
    n = x.shape[axis]
    if n == 0:
        raise IndexError(f"median(): Expected reduction dim {dim} to have non-zero size.")
    _not_for_bool(x, "median_out")  # (CPU's median_out kernel's name, also nanmedian's)
    v, i = _sort(x, axis, False)
    if j.issubdtype(x.dtype, j.floating):
        cnt = j.sum(~j.isnan(x), axis=axis, keepdims=True)
        if ignore_nan:
            pos = j.maximum((cnt - 1) // 2, 0)
        else:
            pos = j.where(cnt < n, cnt, (n - 1) // 2)
    else:
        pos = j.full(_out_shape(x.shape, (axis,), True), (n - 1) // 2)
    pos = pos.astype(j.int32)
    v = j.take_along_axis(v, pos, axis=axis)
    i = j.take_along_axis(i, pos, axis=axis)
    if not keepdim:
        v, i = j.squeeze(v, axis), j.squeeze(i, axis)
    return v, i


@lower(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    return _median(x, dim, keepdim, False)


@lower(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    return _median(x, dim, keepdim, True)


def _median_all(x, ignore_nan):
    j = jnp()
    if x.size == 0:  # (NaN cast to the dtype, before CPU's dtype dispatch: True for Bool)
        return j.full((), j.nan, x.dtype)
    _not_for_bool(x, "median_tpu")  # CPU: "median_cpu" (nanmedian too)
    return _median(x.reshape(-1), 0, False, ignore_nan)[0]


def _not_for_bool(x, kernel: str) -> None:
    """CPU's dispatch error of a sorting kernel without a Bool instantiation (median,
    nanmedian, kthvalue: ``"median_cpu" not implemented for 'Bool'``)."""
    if x.dtype == jnp().bool_:
        raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\'')


@lower(aten.median.default)
def median(x):
    return _median_all(x, False)


@lower(aten.nanmedian.default)
def nanmedian(x):
    return _median_all(x, True)


def _mode_out_dtypes(vals, dts):
    """``out_dtypes`` hook (build time): ``mode(out=(values, indices))`` needs the input's
    dtype and int64, as CPU's kernel checks (PyTorch's meta kernel casts)."""
    if len(vals) == 5 and isinstance(vals[3], torch.Tensor):
        for t, want, what in ((vals[3], vals[0].dtype, "values"),
                              (vals[4], torch.int64, "indices")):
            if t.dtype != want:
                raise RuntimeError(f"expected scalar type '{scalar_type_name(want)}' but got "
                                   f"'{scalar_type_name(t.dtype)}' for {what} output")
    return dts


@lower(aten.mode.default, out_dtypes=_mode_out_dtypes)
def mode(x, dim=-1, keepdim=False):
    """Most frequent value along ``dim`` and an index of it, as CPU's kernel finds them:
    ``std::sort`` of the (value, index) pairs by value (``<``), then a scan for the first
    longest run of equal values (``!=`` ends a run: each NaN is a run of its own, -0.0
    and 0.0 are one run), returning the run's last pair.

    For up to 16 values ``std::sort`` is libstdc++'s insertion sort, reproduced step for
    step (:func:`_insertion_sorted`), NaNs included.  Longer slices: libstdc++'s
    introsort partitions them, whose order among equal values is not reproduced; a
    stable sort with NaNs last stands in for it (the same value as CPU's when no NaN is
    involved; the index of the last occurrence, where CPU's index among the equal values
    is another one)."""
    j = jnp()
    i64 = npdt(torch.int64)
    if x.ndim == 0:
        return x, j.zeros((), i64)
    axis = _one_dim(x.ndim, dim)
    n = x.shape[axis]
    if n == 0 or x.size == 0:
        raise IndexError(f"mode(): Expected reduction dim {dim} to have non-zero size.")
    if j.issubdtype(x.dtype, j.complexfloating):
        raise NotImplementedError(
            f'"mode_tpu" not implemented for \'{scalar_type_name(tdtype(x))}\'')
    y = j.moveaxis(x, axis, -1)
    if n <= 16 and j.issubdtype(y.dtype, j.floating):
        v, i = _insertion_sorted(y)
    else:
        v, i = _sort(y, y.ndim - 1, False)
    pos = j.arange(n)
    if n > 1:
        new_run = v[..., 1:] != v[..., :-1]
        last = j.concatenate([new_run, j.ones(v.shape[:-1] + (1,), bool)], axis=-1)
        first = j.concatenate([j.ones(v.shape[:-1] + (1,), bool), new_run], axis=-1)
        run_start = lax().cummax(j.where(first, pos, 0), axis=v.ndim - 1)
        freq = j.where(last, pos - run_start + 1, 0)
        at = j.argmax(freq, axis=-1)[..., None]  # the first of the longest runs
    else:
        at = j.zeros(v.shape[:-1] + (1,), j.int32)
    val = j.take_along_axis(v, at, axis=-1)[..., 0]
    idx = j.take_along_axis(i, at, axis=-1)[..., 0]
    if keepdim:
        val, idx = j.expand_dims(val, axis), j.expand_dims(idx, axis)
    return val, idx.astype(i64)


def _insertion_sorted(y):
    """libstdc++'s ``__insertion_sort`` of the last axis of ``y`` with ``a < b`` on the
    values (what ``std::sort`` runs for 16 or fewer elements): (values, int64 indices).
    An element less than the first goes to the front; any other moves down past the
    elements it is less than (``__unguarded_linear_insert``).  NaN is less than nothing
    and nothing is less than it, so it stops the elements after it, as on CPU."""
    j = jnp()
    n = y.shape[-1]
    pos = j.arange(n)
    i0 = j.broadcast_to(pos.astype(npdt(torch.int64)), y.shape)

    def step(k, vi):
        v, i = vi
        val = lax().dynamic_slice_in_dim(v, k, 1, axis=v.ndim - 1)  # v[..., k:k + 1]
        ival = lax().dynamic_slice_in_dim(i, k, 1, axis=i.ndim - 1)
        to_front = val[..., 0] < v[..., 0]
        # the highest place below k whose value ``val`` is not less than: insert after it
        stop = ~(val < v) & (pos < k)
        p = j.max(j.where(stop, pos + 1, 0), axis=-1)
        p = j.where(to_front, 0, p)[..., None]
        # places p..k-1 move up one, ``val`` goes to p (selections: no gather to build)
        keep, moved = (pos < p) | (pos > k), pos > p
        v = j.where(keep, v, j.where(moved, _shift_up(v), val))
        i = j.where(keep, i, j.where(moved, _shift_up(i), ival))
        return v, i

    return lax().fori_loop(1, n, step, (y, i0))


def _shift_up(a):
    """``a`` with every element one place later along the last axis (the first kept)."""
    return jnp().concatenate([a[..., :1], a[..., :-1]], axis=-1)


_histc_fits = fits(2, 3)


def _histc_prepare(vals):
    """``prepare`` of histc: ``min``/``max`` must fit the input's dtype; with ``min ==
    max`` the data's range is used and must be finite (CPU's "range of [a, b] is not
    finite").  That reads the data's min and max: a sync point, as on CUDA, whose kernel
    reads them on the host too.  A compiled graph (fake tensors, no values) runs only the
    ``fits`` part."""
    from torch._subclasses.fake_tensor import is_fake

    vals = _histc_fits(vals)
    x, lo, hi = vals[0], vals[2], vals[3]
    if not isinstance(lo, torch.Tensor) and not isinstance(hi, torch.Tensor) \
            and float(lo) == float(hi) and x.numel() and x.is_floating_point() \
            and not is_fake(x):
        mn, mx = torch.aminmax(x.detach())
        mn, mx = float(mn), float(mx)
        if not (math.isfinite(mn) and math.isfinite(mx)):
            raise RuntimeError(f"torch.histc: range of [{mn:g}, {mx:g}] is not finite")
    return vals


_histc_prepare.scalar_check = True  # as fits(2, 3) was: compile runs the fits part


@lower(aten.histc.default, static_scalars=True, prepare=_histc_prepare)
def histc(x, bins=100, min=0, max=0):
    """``torch.histc``: ``bins`` equal-width bins over [min, max] (the data's range when
    both are 0); values outside are ignored; the last bin includes ``max``.  Counts have
    the input's dtype (integer inputs count as CUDA does; CPU rejects them)."""
    import numpy as np

    j = jnp()
    xf = x.reshape(-1).astype(np.float64 if x.dtype == np.float64 else np.float32)
    lo, hi = float(min), float(max)
    if lo == hi:
        lo_t, hi_t = (j.min(xf), j.max(xf)) if xf.size else (j.asarray(0.0), j.asarray(0.0))
    else:
        lo_t, hi_t = j.asarray(lo, xf.dtype), j.asarray(hi, xf.dtype)
    same = lo_t == hi_t
    lo_t = j.where(same, lo_t - 1, lo_t)
    hi_t = j.where(same, hi_t + 1, hi_t)
    idx = j.floor((xf - lo_t) * bins / (hi_t - lo_t)).astype(np.int64)
    idx = j.where(xf == hi_t, bins - 1, idx)
    inside = (xf >= lo_t) & (xf <= hi_t)
    counts = j.zeros((bins,), np.int64).at[j.where(inside, idx, 0)].add(inside.astype(np.int64))
    return counts.astype(x.dtype)


# ------------------------------------------------------------ segment_reduce (issue 8)


def _segments(data, lengths, offsets, axis):
    """Segment layout of ``segment_reduce``: data as (B, N, I) (B the dims before ``axis``,
    I those after), per-position segment ids (B, N) (S where a position is in no segment,
    so segment ops drop it) and segment lengths (B, S)."""
    j = jnp()
    if offsets is not None:
        bounds = offsets.reshape(-1, offsets.shape[-1]).astype(npdt(torch.int64))
        starts, ends = bounds[:, :-1], bounds[:, 1:]
    else:
        lens = lengths.reshape(-1, lengths.shape[-1]).astype(npdt(torch.int64))
        ends = j.cumsum(lens, axis=-1)
        starts = ends - lens
    b, s = starts.shape
    n = data.shape[axis]
    x = data.reshape((b, n, -1))
    pos = j.arange(n)
    member = (pos[None, None, :] >= starts[:, :, None]) & (pos[None, None, :] < ends[:, :, None])
    ids = j.where(member.any(1), j.argmax(member, axis=1), s)
    return x, ids, ends - starts, s


def _seg_op(fn, x, ids, s):
    """``fn`` (a jax.ops.segment_* reduction) per batch row: (B, N, I) -> (B, S, I)."""
    jax = _jax()
    return jax.vmap(lambda xb, ib: fn(xb, ib, num_segments=s))(x, ids)


def _jax():
    from torchtpu._device import runtime

    return runtime.jax()


def _check_lengths(data, lengths, axis, unsafe):
    from torchtpu.ops import _checks

    if lengths is None or unsafe:
        return
    j = jnp()
    _checks.check(j.any(lengths < 0), RuntimeError, "lengths contains negative value!")
    _checks.check(j.any(j.sum(lengths, axis=-1) != data.shape[axis]), RuntimeError,
                  "segment_reduce(): Expected all rows of lengths along axis to sum to "
                  "data.size(lengths.dim()-1) when !unsafe.")


@lower(aten.segment_reduce.default)
def segment_reduce(data, reduce, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None):
    """``torch.segment_reduce``: reduce consecutive segments of ``data`` along ``axis``
    (given by ``lengths`` (..., S) or ``offsets`` (..., S+1); the dims before ``axis`` are
    batch dims of both).  As CPU's kernel: ``initial`` joins every reduction (mean:
    ``(initial + sum) / length``); an empty segment is ``initial``, else the reduction's
    identity (``mean``: NaN); max/min propagate NaN.  Half types compute in float32."""
    jax = _jax()
    j = jnp()
    axis = axis % data.ndim
    if indices is not None:
        raise RuntimeError("segment_reduce(): indices based reduction is not supported yet.")
    _check_lengths(data, lengths, axis, unsafe)
    dt = tdtype(data)
    ct = npdt(opmath(dt))
    x, ids, lens, s = _segments(data.astype(ct), lengths, offsets, axis)
    cnt = lens[:, :, None]
    init = None if initial is None else cast(initial, opmath(dt))
    if reduce in ("sum", "mean"):
        out = _seg_op(jax.ops.segment_sum, x, ids, s)
        if init is not None:
            out = out + init
        if reduce == "mean":
            div = out / j.where(cnt > 0, cnt, 1).astype(ct)
            empty = init if init is not None else j.asarray(j.nan, ct)
            out = j.where(cnt > 0, div, empty)
    elif reduce in ("max", "min"):
        fn = jax.ops.segment_max if reduce == "max" else jax.ops.segment_min
        out = _seg_op(fn, x, ids, s)
        if init is not None:
            out = (j.maximum if reduce == "max" else j.minimum)(out, init)
        else:
            out = j.where(cnt > 0, out, j.asarray(-j.inf if reduce == "max" else j.inf, ct))
        has_nan = _seg_op(jax.ops.segment_sum, j.isnan(x).astype(j.int32), ids, s) > 0
        out = j.where(has_nan, j.asarray(j.nan, ct), out)
    elif reduce == "prod":
        out = _seg_op(jax.ops.segment_prod, x, ids, s)
        if init is not None:
            out = out * init
    else:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    return out.reshape(data.shape[:axis] + (s,) + data.shape[axis + 1:])


@lower(aten._segment_reduce_backward.default)
def _segment_reduce_backward(grad, output, data, reduce, lengths=None, offsets=None, axis=0,
                             initial=None):
    """Gradient of :func:`segment_reduce` w.r.t. ``data``, CPU's rules: sum/mean spread the
    segment's gradient (mean: divided by the length); max/min give it to every element
    equal to the result (or NaN), a positive gradient divided by the number of ties;
    prod: ``grad * output / x``, or ``grad * initial * (product of the others)`` where
    ``x`` is 0 or NaN.  Elements in no segment get 0."""
    jax = _jax()
    j = jnp()
    axis = axis % data.ndim
    dt = tdtype(data)
    ct = npdt(opmath(dt))
    x, ids, lens, s = _segments(data.astype(ct), lengths, offsets, axis)
    b = x.shape[0]
    g = grad.astype(ct).reshape(b, s, -1)
    o = output.astype(ct).reshape(b, s, -1)
    valid = (ids < s)[:, :, None]
    take = j.minimum(ids, s - 1)[:, :, None]
    g_e = j.where(valid, j.take_along_axis(g, take, axis=1), 0)
    o_e = j.take_along_axis(o, take, axis=1)

    def per_elem(v):  # (B, S, I) segment values -> (B, N, I) at each element
        return j.take_along_axis(v, take, axis=1)

    if reduce == "sum":
        r = g_e
    elif reduce == "mean":
        n_e = per_elem(j.broadcast_to(lens[:, :, None], g.shape)).astype(ct)
        r = g_e / j.where(n_e > 0, n_e, 1)
    elif reduce in ("max", "min"):
        tie = j.isnan(x) | (x == o_e)
        ties = per_elem(_seg_op(jax.ops.segment_sum, tie.astype(j.int32), ids, s))
        r = j.where(tie, g_e, 0)
        r = j.where(tie & (ties >= 2) & (g_e > 0), g_e / ties.astype(ct), r)
    elif reduce == "prod":
        zero, nan = x == 0, j.isnan(x)
        p = per_elem(_seg_op(jax.ops.segment_prod, j.where(zero | nan, 1, x), ids, s))
        zeros = per_elem(_seg_op(jax.ops.segment_sum, zero.astype(j.int32), ids, s))
        nans = per_elem(_seg_op(jax.ops.segment_sum, nan.astype(j.int32), ids, s))
        other_zeros = zeros - zero.astype(j.int32)
        other_nans = nans - nan.astype(j.int32)
        init = 1 if initial is None else cast(initial, opmath(dt))
        excl = j.where(other_nans > 0, j.asarray(j.nan, ct),
                       j.where(other_zeros > 0, j.asarray(0, ct), p * init))
        r = j.where(zero | nan, g_e * excl, g_e * o_e / j.where(zero | nan, 1, x))
    else:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    r = j.where(valid, r, 0)
    return r.reshape(data.shape)


def _histogram_from_edges(x, edges, weight, density):
    """PyTorch's 1-D ``histogramdd`` kernel: element ``v`` falls in bin
    ``upper_bound(edges, v) - 1`` (the last edge into the last bin); elements outside
    ``[edges[0], edges[-1]]`` and NaNs are skipped; ``density`` divides by the total and by
    the bin widths."""
    j = jnp()
    nb = edges.shape[0] - 1
    xf = x.reshape(-1)
    pos = j.searchsorted(edges, xf, side="right") - 1
    pos = j.where(xf == edges[-1], nb - 1, pos)
    inside = (xf >= edges[0]) & (xf <= edges[-1])
    w = j.ones_like(xf) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = j.zeros((nb,), x.dtype).at[j.where(inside, pos, 0)].add(
        j.where(inside, w, j.zeros_like(w)))
    if density:
        hist = hist / j.sum(hist) / (edges[1:] - edges[:-1])
    return hist, edges


@lower(aten.histogram.bin_ct, dynamic_shape=True)
def histogram_bin_ct(x, bins=100, range=None, weight=None, density=False):
    """``torch.histogram(x, bins: int, range=, weight=, density=)``: ``bins`` equal-width
    bins over ``range`` or the data's [min, max] (an empty range widened by 0.5 on each
    side, as numpy; [0, 1] for an empty input); edges by PyTorch's linspace.  Returns
    ``(hist, bin_edges)`` in the input's dtype; RuntimeErrors as CPU (bins <= 0, a
    non-finite or reversed range).  Runs on concrete arrays (the edges depend on the
    data's range: a sync point)."""
    from torchtpu.ops.factory import _halfway

    j = jnp()
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    xf = x.reshape(-1)
    if range is not None or xf.size:
        lo, hi = ((float(range[0]), float(range[1])) if range is not None
                  else (float(j.min(xf)), float(j.max(xf))))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise RuntimeError(f"torch.histogramdd: dimension 0's range [{lo:g}, {hi:g}] is "
                               f"not finite")
        if lo > hi:
            raise RuntimeError(f"torch.histogramdd: min should not exceed max, but got min "
                               f"{lo:g} max {hi:g} for dimension 0")
    else:
        lo, hi = 0.0, 1.0
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    ct = x.dtype
    edges = _halfway(lo, hi, bins + 1, ct)
    return _histogram_from_edges(x, edges, weight, density)


@lower(aten.histogram.bins_tensor, dynamic_shape=True)
def histogram_bins_tensor(x, bins, weight=None, density=False):
    """``torch.histogram(x, bins: Tensor, weight=, density=)``: the given (ascending) bin
    edges; see :func:`histogram_bin_ct`."""
    if bins.dtype != x.dtype:
        raise RuntimeError(
            f"torch.histogramdd: input tensor and bins tensors should have the same dtype, "
            f"but got input with dtype {_dt_name(x.dtype)} and bins for dimension 0 with "
            f"dtype {_dt_name(bins.dtype)}")
    return _histogram_from_edges(x, bins.reshape(-1), weight, density)


def _dt_name(dt):
    import numpy as np

    return {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}.get(np.dtype(dt), str(dt))


# mode.values (``torch.mode(..., out=)``): its own PrivateUse1 kernel, registered with the
# device (``_device._register_direct_kernels``), runs the out= plan derived from ``mode``


@lower(aten.hash_tensor.default)
def hash_tensor(x, dim=(), keepdim=False, mode=0):
    """``torch.hash_tensor`` (mode 0, the only one PyTorch has): the XOR of the elements'
    bits as uint64 over ``dim`` (all dims when empty); floating inputs are widened to
    float64 and their bits taken, integers and bool converted to uint64 (sign-extended),
    as PyTorch's kernel and its NumPy reference."""
    import numpy as np

    j = jnp()
    if mode != 0:
        raise RuntimeError(f"hash_tensor: Only mode=0 (xor_sum) is supported right now, "
                           f"got mode={mode}")
    if j.issubdtype(x.dtype, j.complexfloating):
        _raise("hash_tensor", "complex input")
    if j.issubdtype(x.dtype, j.floating):
        u = lax().bitcast_convert_type(x.astype(np.float64), np.uint64)
    else:
        u = x.astype(np.int64).astype(np.uint64) if x.dtype != j.bool_ else x.astype(np.uint64)
    dims = _dims(x.ndim, dim)
    r = lax().reduce(u, np.uint64(0), lax().bitwise_xor, dims)
    if keepdim:
        r = r.reshape(_out_shape(x.shape, dims, True))
    return r
