"""Small shared pieces for lowerings: dtype promotion and casting (trace time only)."""

from __future__ import annotations

import torch

from torchtpu._device import runtime
from torchtpu.ops._scalar import Scalar


def jnp():
    return runtime.jax().numpy


def lax():
    return runtime.jax().lax


_HALF_BITS = {torch.float16: (5, 10), torch.bfloat16: (8, 7)}


def round_to(v, dtype: torch.dtype):
    """``v`` (a wider float array) rounded to float16/bfloat16 ``dtype``'s precision and
    range, kept in ``v``'s type: CPU's rounding of an intermediate.  Through
    ``lax.reduce_precision``: XLA drops a ``convert`` round trip (float32 -> float16 ->
    float32) inside a fusion as excess precision (also behind an optimization barrier or
    a bitcast pair).  ``reduce_precision`` flushes the narrow type's subnormals; float16's
    (below 2**-14, normal float32 values) are rounded to their multiple of 2**-24 instead
    (bfloat16's are float32 subnormals, which XLA:CPU's arithmetic flushes anyway:
    docs/precision.md).  Other dtypes: ``v`` unchanged."""
    bits = _HALF_BITS.get(dtype)
    if bits is None:
        return v
    r = lax().reduce_precision(v, exponent_bits=bits[0], mantissa_bits=bits[1])
    if dtype != torch.float16:
        return r
    j = jnp()
    tiny = j.asarray(2.0 ** -14, v.dtype)
    step = j.asarray(2.0 ** 24, v.dtype)
    return j.where(j.abs(v) < tiny, j.round(v * step) / step, r)


def ieee_div(x, y):
    """``x / y`` correctly rounded, as CPU (and CUDA) compute it.  XLA's algebraic
    simplifier rewrites a division by a broadcast or a constant (a scalar, a size-1
    dimension, ``sum / n``) into a multiplication by its reciprocal, on every platform and
    whatever the fast-math flags: one ulp off in about a third of the quotients (``x / 3``,
    ``w / s`` with ``s`` of shape (N, 1); ``5.125 / 5.125`` gives 0.99999994).  So the
    divisor is broadcast to the result's shape here and passed through an optimization
    barrier, which the simplifier cannot see through (an array of the result's size more
    where the divisor was smaller).  Used by ``div`` (every rounding mode),
    ``true_divide``, ``floor_divide``, ``mean``, ``var``/``std``, ``round(decimals=)``, and the ops that reach
    them through PyTorch's decompositions.  TPUs compute float division with a reciprocal
    and Newton steps in hardware, so there a quotient may still differ from CPU's in the
    last bit."""
    j = jnp()
    shape = j.broadcast_shapes(j.shape(x), j.shape(y))
    if tuple(j.shape(y)) != tuple(shape):
        y = j.broadcast_to(y, shape)
    # the numerator too: in a fused program (DEFER_AND_FUSE, torch.compile) the simplifier
    # would merge two divisions, ``x / 3 / 7`` -> ``x / 21``
    x, y = lax().optimization_barrier((x, y))
    return x / y


def tdtype(x) -> torch.dtype:
    """The torch dtype of a JAX array, or the wrapped-number dtype of a Scalar."""
    if isinstance(x, Scalar):
        return {bool: torch.bool, int: torch.int64, float: torch.float64,
                complex: torch.complex128}[x.kind]
    return runtime.to_torch_dtype(x.dtype)


def npdt(dtype: torch.dtype):
    return runtime.to_np_dtype(dtype)


def _promotion_operand(x):
    if isinstance(x, Scalar):
        return x.sample
    if isinstance(x, (bool, int, float, complex)):
        return x
    return torch.empty(x.shape, dtype=tdtype(x), device="meta")


def promote(*args) -> torch.dtype:
    """PyTorch's promoted dtype of several operands (tensors, Scalars, numbers)."""
    from torch._prims_common import elementwise_dtypes, ELEMENTWISE_TYPE_PROMOTION_KIND

    ops = [_promotion_operand(a) for a in args if a is not None]
    return elementwise_dtypes(*ops, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]


def cast(x, dtype: torch.dtype):
    """``x`` (array, Scalar or number) as a JAX value of torch dtype ``dtype``."""
    d = npdt(dtype)
    if dtype is torch.float8_e4m3fn:
        return _cast_e4m3fn(x, d)
    if isinstance(x, Scalar):
        return x.value.astype(d)
    if isinstance(x, (bool, int, float, complex)):
        return jnp().asarray(x, dtype=d)
    if x.dtype != d:
        if dtype is torch.uint8 and jnp().issubdtype(x.dtype, jnp().inexact):
            # PyTorch converts floating values to uint8 through int64 (c10's
            # static_cast_with_inter_type), so CPU and CUDA agree: -1.0 -> 255, 300.0 -> 44
            x = (jnp().real(x) if jnp().issubdtype(x.dtype, jnp().complexfloating) else x)
            return x.astype(jnp().int64).astype(d)
        if x.dtype == jnp().bool_ and jnp().issubdtype(d, jnp().inexact):
            # through uint8: XLA rewrites multiply(convert(pred), y) to select(pred, y, 0),
            # which gives 0 for False * inf or False / 0 where PyTorch gives NaN
            return x.astype(jnp().uint8).astype(d)
        return x.astype(d)
    return x


def _cast_e4m3fn(x, d):
    """float8_e4m3fn has no infinity: PyTorch's conversion saturates out-of-range and
    infinite values to +-448 (NaN stays NaN), where XLA's gives NaN."""
    j = jnp()
    v = x.value if isinstance(x, Scalar) else x
    if isinstance(v, (bool, int, float, complex)):
        v = j.asarray(v)
    if v.dtype == d:
        return v
    if j.issubdtype(v.dtype, j.complexfloating):
        v = j.real(v)
    if not j.issubdtype(v.dtype, j.floating):
        v = v.astype(j.float32)
    return j.clip(v, -448, 448).astype(d)


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def is_complex(dtype: torch.dtype) -> bool:
    return dtype.is_complex


def is_int(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype is not torch.bool


def opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype PyTorch computes in for reduced-precision floats (``opmath_type``)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def scalar_type_name(dtype: torch.dtype) -> str:
    """PyTorch's C++ ScalarType name of ``dtype`` ("Float", "Long", "ComplexFloat"), as its
    error messages spell it."""
    return torch.empty(0, dtype=dtype).type().split(".")[-1][: -len("Tensor")]


def float_compute(x) -> torch.dtype:
    """Compute dtype of float math on ``x`` (exp, sin, ...): opmath of its float type;
    integer and bool inputs compute in the default float dtype, as PyTorch promotes them."""
    dt = tdtype(x)
    if not (dt.is_floating_point or dt.is_complex):
        dt = torch.get_default_dtype()
    return opmath(dt)


def to_float_compute(x):
    """``x`` cast to :func:`float_compute` of it."""
    return cast(x, float_compute(x))


# ------------------------------------------------------------ float32 matmul precision
# torch.set_float32_matmul_precision -> XLA precision of float32 products (docs/precision.md)
XLA_PRECISION = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}
_TRACE_PRECISION = ["highest"]  # the setting the lowering being traced runs under


def host_matmul_precision() -> str:
    """``torch.get_float32_matmul_precision()`` (read on the host when an op runs and put
    in the cache key of every lowering marked ``precision=True``)."""
    return torch._C._get_float32_matmul_precision()


class precision_scope:
    """Trace lowerings under the float32 matmul precision ``setting`` ("highest", "high",
    "medium"); ``None`` leaves the current one."""

    __slots__ = ("setting", "old")

    def __init__(self, setting):
        self.setting = setting

    def __enter__(self):
        self.old = _TRACE_PRECISION[0]
        if self.setting is not None:
            _TRACE_PRECISION[0] = self.setting
        return self

    def __exit__(self, *exc):
        _TRACE_PRECISION[0] = self.old


def matmul_precision(dt: torch.dtype):
    """The ``jax.lax.Precision`` of a product of ``dt`` operands in the lowering being
    traced: float32 follows ``torch.set_float32_matmul_precision`` ("highest" ->
    HIGHEST, "high" -> HIGH, "medium" -> DEFAULT); every other dtype is HIGHEST (PyTorch's
    setting is for float32 only).  A lowering that calls this must be registered with
    ``precision=True`` so that the setting is part of its executable's key."""
    name = XLA_PRECISION[_TRACE_PRECISION[0]] if dt == torch.float32 else "HIGHEST"
    return getattr(lax().Precision, name)
