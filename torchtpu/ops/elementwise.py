"""Elementwise lowerings: unary math, binary arithmetic, comparisons, where, casts.

Shared shapes of code are constructors (:func:`unary`, :func:`binary`, :func:`compare`);
each op is one line naming its ATen overload and its jax function.  Dtype rules follow
PyTorch: integer inputs to float-only math (``exp``, ``sin``...) compute in the default
float dtype; half/bfloat16 math computes in float32 (PyTorch's ``opmath``) and rounds
once.  The executor casts every result to the dtype PyTorch's meta kernel reports.
"""

from __future__ import annotations

import math

import torch

from torchtpu import _compat
from torchtpu.ops import _checks, aten, lower
from torchtpu.ops._scalar import (Scalar, check_converts, clamp_integer_bounds, fits,
                                  opmath_dtype, scalar_check)
from torchtpu.ops._util import (cast, float_compute, ieee_div, jnp, lax, npdt, opmath, promote,
                                scalar_type_name, tdtype)


_float_compute = float_compute


def unary(op, fn, float_math=True, same_dtype_out=False):
    """Register ``op(x)`` = ``fn(x)``; float_math: ints promote to float (exp, sin...).

    ``same_dtype_out``: ``op(x, out=o)`` with ``o`` of another dtype raises CPU's
    "Found dtype Double but expected Float", as PyTorch's unary kernels built without
    output casting (neg, round, bitwise_not) do; checked once per signature, at build."""

    def lowering(x):
        if float_math:
            return fn(cast(x, _float_compute(x)))
        return fn(x)

    lower(op, out_dtypes=_same_dtype_out if same_dtype_out else None)(lowering)
    return lowering


def _same_dtype_out(vals, dts):
    """``out_dtypes`` hook (build time): an ``out=`` tensor must have the result's dtype."""
    out = vals[-1] if len(vals) > 1 else None
    if isinstance(out, torch.Tensor) and out.dtype != dts[0]:
        raise RuntimeError(f"Found dtype {scalar_type_name(out.dtype)} but expected "
                           f"{scalar_type_name(dts[0])}")
    return dts


def binary(op, fn, has_alpha=False, float_math=False, alpha_on_self=False, check=None,
           meta=None):
    """Register ``op(a, b[, alpha])`` computed in PyTorch's promoted dtype.

    ``alpha`` scales ``b`` (``add``/``sub``: ``a + alpha * b``), or ``a`` when
    ``alpha_on_self`` (``rsub``: ``b - alpha * a``, as ATen's ``rsub`` is ``sub(b, a, alpha)``);
    its Python type is checked as PyTorch's ``alpha_check`` does.  ``check(a, b)`` raises
    CPU's error for operands CPU refuses (at trace time: dtypes only); ``meta`` replaces
    PyTorch's meta kernel where that refuses what CPU accepts.
    """

    def lowering(a, b, alpha=None):
        if check is not None:
            check(a, b)
        dt = promote(a, b)
        if float_math and not (dt.is_floating_point or dt.is_complex):
            dt = torch.get_default_dtype()
        if has_alpha:
            _alpha_check(dt, alpha)
        ct = opmath(dt)
        if has_alpha and ct is not dt:
            # CPU's add/sub kernels read every operand (a float32 0-d tensor, a Python
            # number) and alpha in the common dtype: round them to bfloat16/half first
            x, y = cast(cast(a, dt), ct), cast(cast(b, dt), ct)
            alpha = None if alpha is None else cast(cast(alpha, dt), ct)
        else:
            x, y = cast(a, ct), cast(b, ct)
        if has_alpha and alpha is not None:
            if alpha_on_self:
                x = x * cast(alpha, ct)
            else:
                y = y * cast(alpha, ct)
        return fn(x, y)

    lower(op, prepare=_alpha_fits if has_alpha else None, meta=meta)(lowering)
    return lowering


@scalar_check
def _alpha_fits(vals):
    """Host side: ``alpha`` must fit the result dtype (``add(int8, int8, alpha=300)``
    raises on CPU)."""
    alpha = vals[2]
    # (hot path: add/sub run with the default alpha=1 almost always)
    if alpha is not None and alpha != 1 and not isinstance(alpha, (bool, torch.Tensor)):
        vals[2] = check_converts(alpha, torch.result_type(vals[0], vals[1]))
    return vals


# (the C++ hot path does not call it while alpha is the schema default's object: a
# Python frame in every add and sub)
_alpha_fits.skip_at_defaults = (2,)


@scalar_check
def _value_fits(vals):
    """Host side: ``addcmul``/``addcdiv``'s ``value`` must fit the result dtype."""
    value = vals[3]
    if value is not None and not isinstance(value, (bool, torch.Tensor)):
        dt = torch.promote_types(vals[0].dtype, torch.promote_types(vals[1].dtype, vals[2].dtype))
        vals[3] = check_converts(value, opmath_dtype(dt))  # read as the compute type
    return vals


def _alpha_check(dtype: torch.dtype, alpha) -> None:
    """PyTorch's ``alpha_check`` (add/sub/rsub) on the result dtype (trace time: the
    Python type of ``alpha`` is part of the executable's signature)."""
    kind = alpha.kind if isinstance(alpha, Scalar) else type(alpha)
    if kind is bool and dtype is not torch.bool:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if kind is float and not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating "
                           "point number.")
    if kind is complex and not dtype.is_complex:
        raise RuntimeError("For non-complex input tensors, argument alpha must not be a "
                           "complex number.")


def _sub_check(a, b) -> None:
    """PyTorch's ``sub_check``: no subtraction with bool operands (``NotImplementedError``
    from torch 2.14 on, ``RuntimeError`` before)."""
    exc = _compat.error_since(2, 14, NotImplementedError)
    if tdtype(a) is torch.bool and tdtype(b) is torch.bool:
        raise exc("Subtraction, the `-` operator, with two bool tensors is not "
                  "supported. Use the `^` or `logical_xor()` operator instead.")
    if tdtype(a) is torch.bool or tdtype(b) is torch.bool:
        raise exc("Subtraction, the `-` operator, with a bool tensor is not "
                  "supported. If you are trying to invert a mask, use the `~` or "
                  "`logical_not()` operator instead.")


def _not_for_bool(dt: torch.dtype, kernel: str) -> None:
    """CPU's dispatch error for a kernel without a Bool instantiation."""
    if dt is torch.bool:
        raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\'')


def _no_int_zero_divisor(y) -> None:
    """Integer division by zero raises on CPU ("ZeroDivisionError"): a device-side check."""
    _checks.check(y == 0, RuntimeError, "ZeroDivisionError")


def compare(op, fn, ordered=False):
    """Register a comparison: promote both operands, return bool.

    ``ordered`` (lt/le/gt/ge): complex numbers have no order; PyTorch's kernels raise
    NotImplementedError (``"lt_cpu" not implemented for 'ComplexFloat'``) for a complex
    common dtype, and so does the lowering (at trace time, once per signature)."""
    name = op._schema.name.split("::")[1]

    def lowering(a, b):
        dt = promote(a, b)
        if ordered and dt.is_complex:
            raise NotImplementedError(
                f'"{name}_tpu" not implemented for \'{scalar_type_name(dt)}\'')
        return fn(cast(a, dt), cast(b, dt))

    lower(op)(lowering)
    return lowering


# ------------------------------------------------------------------ arithmetic
binary(aten.add.Tensor, lambda x, y: x + y, has_alpha=True)
binary(aten.add.Scalar, lambda x, y: x + y, has_alpha=True)
binary(aten.sub.Tensor, lambda x, y: x - y, has_alpha=True, check=lambda a, b: _sub_check(a, b))
binary(aten.sub.Scalar, lambda x, y: x - y, has_alpha=True, check=lambda a, b: _sub_check(a, b))
binary(aten.rsub.Tensor, lambda x, y: y - x, has_alpha=True, alpha_on_self=True,
       check=lambda a, b: _sub_check(b, a))
binary(aten.rsub.Scalar, lambda x, y: y - x, has_alpha=True, alpha_on_self=True,
       check=lambda a, b: _sub_check(b, a))
binary(aten.mul.Tensor, lambda x, y: x * y)
binary(aten.mul.Scalar, lambda x, y: x * y)
binary(aten.maximum.default, lambda x, y: _nan_propagating(cpu_max, x, y))
binary(aten.minimum.default, lambda x, y: _nan_propagating(cpu_min, x, y))
binary(aten.atan2.default, lambda x, y: jnp().arctan2(x, y), float_math=True)
binary(aten.hypot.default, lambda x, y: jnp().hypot(x, y))
binary(aten.copysign.Tensor, lambda x, y: jnp().copysign(x, y), float_math=True)
binary(aten.copysign.Scalar, lambda x, y: jnp().copysign(x, y), float_math=True)
binary(aten.nextafter.default, lambda x, y: jnp().nextafter(x, y))
binary(aten.logaddexp.default, lambda x, y: jnp().logaddexp(x, y))
binary(aten.logaddexp2.default, lambda x, y: jnp().logaddexp2(x, y))
binary(aten.xlogy.Tensor, lambda x, y: _xlogy(x, y), float_math=True)


def _integral_only(kernel: str, bool_ok: bool = True):
    """``check`` of the bitwise binary ops: CPU's kernels exist for integral dtypes (and
    Bool, except the shifts), so a floating or complex common dtype raises
    NotImplementedError (``"bitwise_and_cpu" not implemented for 'Float'``), as does a
    Bool one for a shift (``"lshift_cpu" not implemented for 'Bool'``)."""

    def check(a, b):
        dt = promote(a, b)
        if dt.is_floating_point or dt.is_complex or (dt is torch.bool and not bool_ok):
            raise NotImplementedError(
                f'"{kernel}_tpu" not implemented for \'{scalar_type_name(dt)}\'')

    return check


for _name, _fn in (("and", lambda x, y: x & y), ("or", lambda x, y: x | y),
                   ("xor", lambda x, y: x ^ y)):
    binary(getattr(aten, f"bitwise_{_name}").Tensor, _fn,
           check=_integral_only(f"bitwise_{_name}"))
    binary(getattr(aten, f"bitwise_{_name}").Scalar, _fn,
           check=_integral_only(f"bitwise_{_name}"))
binary(aten.bitwise_left_shift.Tensor, lambda x, y: jnp().left_shift(x, y),
       check=_integral_only("lshift", bool_ok=False))
binary(aten.bitwise_right_shift.Tensor, lambda x, y: jnp().right_shift(x, y),
       check=_integral_only("rshift", bool_ok=False))


def _nan_propagating(f, x, y):
    if jnp().issubdtype(x.dtype, jnp().floating):
        return jnp().where(jnp().isnan(x) | jnp().isnan(y), jnp().nan, f(x, y)).astype(x.dtype)
    return f(x, y)


# Signed zeros.  XLA's max/min return +0.0 for max(-0.0, 0.0) (-0.0 for min) whatever the
# operand order; PyTorch's CPU kernels are comparisons: std::max(x, y) is
# ``x < y ? y : x``, so a tie keeps ``x``, sign included (clamp(-0.0, min=0.0) and
# relu(-0.0) are -0.0).  A select after a comparison is exact on every backend.
#
# For a tensor ``y`` (maximum, minimum, clamp.Tensor, clamp_min.Tensor...) CPU's answer on
# a ±0.0 tie depends on the element's position: the SIMD body (_mm256/_mm512_max_ps(x, y)
# returns y on a tie) keeps y, the scalar kernel (tensors shorter than a vector, the tail
# of a longer one, strided operands) keeps x.  Which positions take which path depends on
# the CPU's vector width; these lowerings follow the scalar kernel everywhere, the rule
# of the scalar-bound clamp (whose SIMD body, max_ps(lo, x), also keeps x).

def cpu_max(x, y):
    """``std::max(x, y)``: ``y`` where ``x < y``, else ``x`` (NaN ``x`` stays)."""
    return jnp().where(x < y, y, x)


def cpu_min(x, y):
    """``std::min(x, y)``: ``y`` where ``y < x``, else ``x`` (NaN ``x`` stays)."""
    return jnp().where(y < x, y, x)


def _fmax_fmin(op, is_max):
    """``fmax``/``fmin``: the non-NaN operand when one is NaN.  On a ±0.0 tie CPU's kernel
    (the same at every position) gives the first operand for float16, float32 and
    float64, and the second for bfloat16."""

    def lowering(a, b):
        dt = promote(a, b)
        x, y = cast(a, dt), cast(b, dt)  # a selection: exact in bfloat16/half too
        j = jnp()
        if not dt.is_floating_point:
            return (j.fmax if is_max else j.fmin)(x, y)
        lo, hi = (x, y) if is_max else (y, x)
        take_y = (lo <= hi) if dt is torch.bfloat16 else (lo < hi)
        return j.where(take_y | j.isnan(x), y, x)

    lower(op)(lowering)


_fmax_fmin(aten.fmax.default, True)
_fmax_fmin(aten.fmin.default, False)


def _xlogy(x, y):
    j = jnp()
    res = j.where(x == 0, j.zeros_like(x), x * j.log(y))
    return j.where(j.isnan(y), j.nan, res)


@lower(aten.div.Tensor, aten.div.Scalar)
def div(a, b):
    dt = promote(a, b)
    if not (dt.is_floating_point or dt.is_complex):
        dt = torch.get_default_dtype()
    x, y, _ = _div_operands(a, b, dt)
    return ieee_div(x, y)


def _div_operands(a, b, dt):
    """``(a, b)`` in ``dt``'s computation dtype, as CPU's division kernels see them, and
    whether the divisor takes their one-element path.  bfloat16/float16: a divisor of one
    element (a number, a 0-d or one-element tensor) takes the kernels' scalar path,
    which divides in float32 by the divisor's own value (``original_scalar_value``: a
    float32 0-d divisor is not rounded to bfloat16 first) and rounds once at the end;
    every other operand is converted to the dtype first (an int64 numerator of 257
    becomes 256 in bfloat16), and the vectorized kernels round each step's result to it
    (``Vectorized<BFloat16>`` arithmetic)."""
    ct = opmath(dt)
    one = isinstance(b, Scalar) or math.prod(jnp().shape(b)) == 1
    if dt in (torch.float16, torch.bfloat16):
        x = cast(cast(a, dt), ct)
        y = cast(b, ct) if one else cast(cast(b, dt), ct)
        return x, y, one
    return cast(a, ct), cast(b, ct), one


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a, b, rounding_mode=None):
    dt = promote(a, b)
    if rounding_mode is None:
        return div(a, b)
    is_int = not (dt.is_floating_point or dt.is_complex)
    if rounding_mode in ("trunc", "floor"):
        _not_for_bool(dt, f"div_{rounding_mode}_cpu")
    j = jnp()
    reduced = dt in (torch.float16, torch.bfloat16)
    x, y, one = _div_operands(a, b, dt)  # (bfloat16/float16: see there)
    if is_int:
        _no_int_zero_divisor(y)
    if rounding_mode == "trunc":
        if is_int:
            q = lax().div(*j.broadcast_arrays(x, y))  # C-style truncation
            return q
        q = ieee_div(x, y)
        if reduced and not one:
            q = q.astype(npdt(dt)).astype(q.dtype)  # CPU rounds the quotient to the dtype
        return j.trunc(q)
    if rounding_mode == "floor":
        if is_int:
            return j.floor_divide(x, y)
        return _python_floor_div(x, y, dt if reduced and not one else None)
    raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")


def _python_floor_div(x, y, step_dtype=None):
    """PyTorch's float floor division (``div_floor_floating``).  ``step_dtype``
    (bfloat16/float16, with ``x``/``y`` in float32): round each step's result to it, as
    CPU's vectorized kernel does (``div_floor_floating_vec`` on ``Vectorized<BFloat16>``;
    the few tail elements of a contiguous loop that CPU runs through its scalar kernel
    are computed in float32 there, so they may differ)."""
    j = jnp()
    if step_dtype is None:
        def r(v):
            return v
    else:
        sdt = npdt(step_dtype)

        def r(v):
            return v.astype(sdt).astype(v.dtype)
    mod = j.fmod(x, y)
    div = r(ieee_div(r(x - mod), y))
    div = j.where((mod != 0) & ((y < 0) != (mod < 0)), r(div - 1), div)
    floordiv = j.floor(div)
    floordiv = j.where(r(div - floordiv) > 0.5, r(floordiv + 1), floordiv)
    q = r(ieee_div(x, y))
    res = j.where(div != 0, floordiv, j.copysign(j.zeros_like(div), q))
    return j.where(y == 0, q, res)


@lower(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(a, b):
    return div_mode(a, b, "floor")


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(a, b):
    dt = promote(a, b)
    _not_for_bool(dt, "remainder_cpu")
    x, y = _in_dtype_first(a, b, dt)
    j = jnp()
    if dt.is_floating_point:
        r = j.fmod(x, y)
        return j.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)
    _no_int_zero_divisor(y)
    return j.remainder(x, y)


def _in_dtype_first(a, b, dt):
    """``(a, b)`` in ``dt``'s computation dtype, each converted to ``dt`` first: CPU's
    bfloat16/float16 ``remainder``/``fmod`` kernels read both operands in the dtype (a
    divisor of 3.7 is 3.703125 in bfloat16), then compute in float32."""
    ct = opmath(dt)
    if dt in (torch.float16, torch.bfloat16):
        return cast(cast(a, dt), ct), cast(cast(b, dt), ct)
    return cast(a, ct), cast(b, ct)


def _int_only(dt: torch.dtype, kernel: str) -> None:
    """CPU's ``AT_DISPATCH_INTEGRAL_TYPES``: int8..int64 and uint8 only (gcd, lcm)."""
    if dt.is_floating_point or dt.is_complex or dt in (
            torch.bool, torch.uint16, torch.uint32, torch.uint64):
        raise NotImplementedError(f'"{kernel}" not implemented for \'{scalar_type_name(dt)}\'')


def _gcd_values(x, y):
    """CPU's ``calc_gcd``: Euclid on |x|, |y| with truncated remainders, in the operands'
    integer dtype (so |INT_MIN| wraps exactly as it does there)."""
    a, b = jnp().broadcast_arrays(jnp().abs(x), jnp().abs(y))

    def body(ab):
        a, b = ab
        nz = a != 0
        r = lax().rem(b, jnp().where(nz, a, jnp().ones_like(a)))
        return jnp().where(nz, r, a), jnp().where(nz, a, b)

    a, b = lax().while_loop(lambda ab: jnp().any(ab[0] != 0), body, (a, b))
    return b


@lower(aten.gcd.default)
def gcd(a, b):
    dt = promote(a, b)
    _int_only(dt, "gcd_cpu")
    return _gcd_values(cast(a, dt), cast(b, dt))


@lower(aten.lcm.default)
def lcm(a, b):
    """CPU's ``calc_lcm``: ``|(x / gcd) * y|`` in the integer dtype (wrapping), 0 when
    the gcd is 0."""
    dt = promote(a, b)
    _int_only(dt, "lcm_cpu")
    x, y = jnp().broadcast_arrays(cast(a, dt), cast(b, dt))
    g = _gcd_values(x, y)
    nz = g != 0
    q = lax().div(x, jnp().where(nz, g, jnp().ones_like(g)))
    if dt.itemsize < 4:  # C++ promotes narrow integers to int before the product and abs
        q, y = q.astype(npdt(torch.int32)), y.astype(npdt(torch.int32))
    return jnp().where(nz, jnp().abs(q * y).astype(x.dtype), jnp().zeros_like(x))


@lower(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(a, b):
    dt = promote(a, b)
    _not_for_bool(dt, "fmod_cpu")
    x, y = _in_dtype_first(a, b, dt)
    if dt.is_floating_point:
        return jnp().fmod(x, y)
    _no_int_zero_divisor(y)
    x, y = jnp().broadcast_arrays(x, y)
    return lax().rem(x, y)


@scalar_check
def _pow_scalar_check(vals):
    """``pow(int tensor, negative int)`` raises on CPU (host-known: at once); the
    tensor-tensor and scalar-base overloads return 0/±1 there instead, as computed."""
    base, exp = vals[0], vals[1]
    if (isinstance(exp, int) and exp < 0 and isinstance(base, torch.Tensor)
            and not (base.dtype.is_floating_point or base.dtype.is_complex)):
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    # the exponent is converted with the checked Scalar::to<T>() to the result type,
    # except float32/float64/complex results (read as double): pow(int8, 300) and
    # pow(float16, 1e5) raise on CPU
    if isinstance(base, torch.Tensor) and not isinstance(exp, (bool, torch.Tensor)):
        dt = torch.result_type(base, exp)
        if not (dt.is_complex or dt in (torch.float32, torch.float64, torch.bool)):
            vals[1] = check_converts(exp, dt)
    return vals


def _bool_pow_out(vals, dts):
    """``out_dtypes`` hook: a bool tensor to a bool power is bool on CPU (PyTorch's meta
    kernel says int64)."""
    base, exp = vals[0], vals[1]
    if isinstance(base, torch.Tensor) and base.dtype is torch.bool and isinstance(exp, bool):
        return [torch.bool]
    return dts


@lower(aten.pow.Tensor_Scalar, prepare=_pow_scalar_check, out_dtypes=_bool_pow_out)
def pow_tensor_scalar(a, b):
    if promote(a, b) is torch.bool:  # CPU: x ** True is x, x ** False is True
        return jnp().logical_or(cast(a, torch.bool), jnp().logical_not(cast(b, torch.bool)))
    return pow_(a, b)


@lower(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_(a, b):
    dt = promote(a, b)
    _not_for_bool(dt, "pow")  # (CPU's Tensor_Tensor and Scalar kernels)
    ct = opmath(dt)
    x, y = cast(a, ct), cast(b, ct)
    if dt.is_floating_point or dt.is_complex:
        return jnp().power(x, y)
    return lax().integer_pow(x, 1) if False else _int_pow(x, y)


def _int_pow(x, y):
    """Integer power by repeated squaring (exact, wraps like PyTorch's CPU kernel)."""
    j = jnp()
    one = j.ones_like(x)
    neg = y < 0
    # x ** negative: 1 for x == 1, +-1 for x == -1, 0 otherwise (PyTorch CPU)
    yy = j.where(neg, 0, y)
    res = one
    base = x
    for _ in range(64):
        res = j.where((yy & 1) == 1, res * base, res)
        base = base * base
        yy = yy >> 1
    negres = j.where(x == 1, one, j.where(x == -1, j.where((y & 1) == 1, -one, one), j.zeros_like(x)))
    return j.where(neg, negres, res)


# ------------------------------------------------------------------ comparisons
compare(aten.eq.Tensor, lambda x, y: x == y)
compare(aten.eq.Scalar, lambda x, y: x == y)
compare(aten.ne.Tensor, lambda x, y: x != y)
compare(aten.ne.Scalar, lambda x, y: x != y)
compare(aten.lt.Tensor, lambda x, y: x < y, ordered=True)
compare(aten.lt.Scalar, lambda x, y: x < y, ordered=True)
compare(aten.le.Tensor, lambda x, y: x <= y, ordered=True)
compare(aten.le.Scalar, lambda x, y: x <= y, ordered=True)
compare(aten.gt.Tensor, lambda x, y: x > y, ordered=True)
compare(aten.gt.Scalar, lambda x, y: x > y, ordered=True)
compare(aten.ge.Tensor, lambda x, y: x >= y, ordered=True)
compare(aten.ge.Scalar, lambda x, y: x >= y, ordered=True)
compare(aten.logical_and.default, lambda x, y: (x != 0) & (y != 0))
compare(aten.logical_or.default, lambda x, y: (x != 0) | (y != 0))
compare(aten.logical_xor.default, lambda x, y: (x != 0) ^ (y != 0))


@lower(aten.logical_not.default)
def logical_not(x):
    return x == 0


# ------------------------------------------------------------------ unary math
_U = [
    (aten.exp.default, lambda x: _exp(x)),
    (aten.exp2.default, lambda x: _exp2(x)),
    (aten.expm1.default, lambda x: jnp().expm1(x)),
    (aten.log.default, lambda x: _log(x)),
    (aten.log2.default, lambda x: jnp().log2(x)),
    (aten.log10.default, lambda x: jnp().log10(x)),
    (aten.log1p.default, lambda x: _log1p(x)),
    (aten.sqrt.default, lambda x: _sqrt(x)),
    (aten.rsqrt.default, lambda x: _rsqrt(x)),
    (aten.sin.default, lambda x: jnp().sin(x)),
    (aten.cos.default, lambda x: jnp().cos(x)),
    (aten.tan.default, lambda x: _tan(x)),
    (aten.asin.default, lambda x: _asin(x)),
    (aten.acos.default, lambda x: _acos(x)),
    (aten.atan.default, lambda x: _atan(x)),
    (aten.sinh.default, lambda x: jnp().sinh(x)),
    (aten.cosh.default, lambda x: jnp().cosh(x)),
    (aten.tanh.default, lambda x: jnp().tanh(x)),
    (aten.asinh.default, lambda x: _asinh(x)),
    (aten.acosh.default, lambda x: _acosh(x)),
    (aten.atanh.default, lambda x: _atanh(x)),
    (aten.sigmoid.default, lambda x: _sigmoid(x)),
    (aten.erf.default, lambda x: lax().erf(x)),
    (aten.erfc.default, lambda x: lax().erfc(x)),
    (aten.lgamma.default, lambda x: lax().lgamma(x)),
    (aten.digamma.default, lambda x: _digamma(x)),
    (aten.reciprocal.default, lambda x: 1 / x),
]
for _op, _fn in _U:
    unary(_op, _fn)


@lower(aten.erfinv.default)
def erfinv(x):
    """CPU's float32 erfinv is within an ulp of the correctly rounded value; XLA's float32
    ``erf_inv`` is up to ~60 ulps off near +-1, where erfinv is ill-conditioned (and its
    gradient, exp(erfinv(x)**2), magnifies the error): float32 and half inputs are
    computed in float64 and rounded once."""
    ct = _float_compute(x)
    if ct == torch.float32:
        return cast(lax().erf_inv(cast(x, torch.float64)), torch.float32)
    return lax().erf_inv(cast(x, ct))


def _sigmoid(x):
    if jnp().iscomplexobj(x):  # CPU: 1 / (1 + exp(-x)), c10::complex's division
        return _creciprocal(1 + _exp(-x))
    return runtime_nn().sigmoid(x)


def _creciprocal(d):
    """``1 / d`` for complex ``d`` = ``c + dj`` by Smith's algorithm, as c10::complex's
    (and NumPy's) division: an infinite part makes the ratio NaN (``1 / (inf - infj)`` is
    NaN + NaNj on CPU; XLA's division gives 0)."""
    j = jnp()
    c, e = j.real(d), j.imag(d)
    big_c = j.abs(c) >= j.abs(e)
    zero = (c == 0) & (e == 0)
    rat = j.where(big_c, e / j.where(c == 0, 1, c), c / j.where(e == 0, 1, e))
    scl = 1 / j.where(big_c, c + e * rat, e + c * rat)
    re = j.where(big_c, scl, rat * scl)
    im = j.where(big_c, -rat * scl, -scl)
    re = j.where(zero, 1 / c, re)  # 1 / 0: inf + nanj, as c10's
    im = j.where(zero, 0 / j.where(zero, e, 1) * j.nan, im)
    return lax().complex(re, im)


def _rsqrt(x):
    """``1 / sqrt(x)``; complex as CPU, the reciprocal (:func:`_creciprocal`) of
    :func:`_sqrt` (``rsqrt(infj)`` is NaN + NaNj on CPU, XLA's rsqrt gives 0)."""
    if jnp().iscomplexobj(x):
        return _creciprocal(_sqrt(x))
    return lax().rsqrt(x)


def _branch_signs(x, r, re=0, im=0):
    """Complex ``r = f(x)``, with the signs of its parts set from ``x``'s as ``f``'s
    symmetries fix them (``re=1``: the real part has the sign of ``x``'s real part,
    ``im=1``/``-1``: the imaginary part has the sign of / the opposite sign to ``x``'s
    imaginary part).  On a branch cut the sign of a zero part of ``x`` picks the side:
    CPU (C99) follows it, XLA ignores it (``sqrt(-1 - 0j)``: CPU ``-1j``, XLA ``+1j``).
    NaN parts (in ``x`` or ``r``) are left alone.  Real ``x``: ``r`` unchanged."""
    j = jnp()
    if not j.iscomplexobj(x):
        return r
    a, b = j.real(x), j.imag(x)
    rr, ri = j.real(r), j.imag(r)
    if re:
        rr = j.where(j.isnan(rr) | j.isnan(a), rr, j.copysign(j.abs(rr), a))
    if im:
        ri = j.where(j.isnan(ri) | j.isnan(b), ri, j.copysign(j.abs(ri), im * b))
    return lax().complex(rr, ri)


def _nan_case(x, r, mask, re=None, im=None):
    """Complex ``r`` with its real / imaginary part replaced by ``re`` / ``im`` (arrays or
    numbers; None keeps ``r``'s) where ``mask`` holds."""
    j = jnp()
    rr, ri = j.real(r), j.imag(r)
    if re is not None:
        rr = j.where(mask, re, rr)
    if im is not None:
        ri = j.where(mask, im, ri)
    return lax().complex(rr, ri)


def _asinh(x):
    """``asinh``; complex: the parts take the signs of ``x``'s (:func:`_branch_signs`:
    ``asinh(-0 - 3j)`` is ``-1.81 - 1.57j`` on CPU, XLA gave ``+1.81``);
    ``asinh(nan + 0j) = nan + 0j``; a NaN part with a finite (nonzero) other part gives
    ``nan + nanj`` (C99; XLA's complex64 gave a finite part for ``1e20 + nanj``)."""
    j = jnp()
    r = _branch_signs(x, j.arcsinh(x), re=1, im=1)
    if not j.iscomplexobj(x):
        return r
    a, b = j.real(x), j.imag(x)
    r = _nan_case(x, r, j.isnan(a) & (b == 0), im=b)
    nan_nan = (j.isfinite(a) & j.isnan(b)) | (j.isnan(a) & j.isfinite(b) & (b != 0))
    return _nan_case(x, r, nan_nan, re=j.nan, im=j.nan)


def _asin(x):
    """``asin``; complex: signs as :func:`_branch_signs` (``asin(3 - 0j)`` has a negative
    imaginary part on CPU); ``asin(+-0 + nanj) = +-0 + nanj``, ``asin(a + nanj)`` for
    other finite ``a`` is ``nan + nanj`` (C99)."""
    j = jnp()
    r = _branch_signs(x, j.arcsin(x), re=1, im=1)
    if not j.iscomplexobj(x):
        return r
    a, b = j.real(x), j.imag(x)
    r = _nan_case(x, r, (a == 0) & j.isnan(b), re=a)
    return _nan_case(x, r, j.isfinite(a) & (a != 0) & j.isnan(b), re=j.nan, im=j.nan)


def _acos(x):
    """``acos``; complex: the imaginary part of the opposite sign to ``x``'s
    (:func:`_branch_signs`); ``acos(+-0 + nanj) = pi/2 + nanj``, other finite ``a``:
    ``nan + nanj`` (C99)."""
    j = jnp()
    r = _branch_signs(x, j.arccos(x), im=-1)
    if not j.iscomplexobj(x):
        return r
    a, b = j.real(x), j.imag(x)
    r = _nan_case(x, r, (a == 0) & j.isnan(b), re=math.pi / 2)
    return _nan_case(x, r, j.isfinite(a) & (a != 0) & j.isnan(b), re=j.nan, im=j.nan)


def _acosh(x):
    """``acosh``; complex: the imaginary part of ``x``'s sign (:func:`_branch_signs`:
    ``acosh(-1 - 0j) = -pi j`` on CPU, XLA ``+pi j``); ``acosh(+-0 + nanj) = nan + pi/2 j``,
    other finite ``a``: ``nan + nanj`` (C99)."""
    j = jnp()
    r = _branch_signs(x, j.arccosh(x), im=1)
    if not j.iscomplexobj(x):
        return r
    a, b = j.real(x), j.imag(x)
    r = _nan_case(x, r, (a == 0) & j.isnan(b), im=math.pi / 2)
    return _nan_case(x, r, j.isfinite(a) & (a != 0) & j.isnan(b), re=j.nan, im=j.nan)


def _log1p(x):
    """``log1p``; complex: ``log(1 + x)`` where ``|x| >= 1/2`` (``1 + x`` is then exact or
    within an ulp of ``|1 + x|``), XLA's ``log1p`` below.  XLA's complex ``log1p`` squares
    ``|1 + x|``, which underflows in complex64: ``log1p(-1 + 1e-30j)`` gave ``-inf``, CPU
    ``-69.08 + 1.57j``."""
    j = jnp()
    r = j.log1p(x)
    if not j.iscomplexobj(x):
        return r
    # 1 + x built part by part: adding 1 would turn a -0 imaginary part into +0 and put
    # log1p(-2 - 0j) on the other side of the branch cut (+pi j; CPU -pi j)
    return j.where(j.abs(x) < 0.5, r, _log(lax().complex(1 + j.real(x), j.imag(x))))


def _unless_finite(x, r, fallback):
    """``r``, except where ``x`` is finite, ``r`` is not and ``fallback`` is: XLA's
    complex64 ``atan``/``atanh`` square a tiny ``|1 +- x|`` to 0 and return inf where CPU
    returns finite values (``atanh(1 + 1e-30j)``: CPU ``34.89 + 0.785j``)."""
    j = jnp()
    finite = lambda v: j.isfinite(j.real(v)) & j.isfinite(j.imag(v))  # noqa: E731
    return j.where(finite(x) & ~finite(r) & finite(fallback), fallback, r)


def _catanh_by_log1p(x):
    """Complex ``atanh(x) = (log1p(x) - log1p(-x)) / 2`` through :func:`_log1p`."""
    return 0.5 * (_log1p(x) - _log1p(-x))


def _atanh(x):
    """``atanh``; complex: the parts take the signs of ``x``'s (:func:`_branch_signs`:
    ``atanh(inf - 0j) = -pi/2 j`` on CPU) and C99's NaN cases: ``a + nanj`` is
    ``copysign(0, a) + nanj`` for ``a`` zero or infinite, else ``nan + nanj``;
    ``nan + bj`` is ``copysign(0, a) +- pi/2 j`` for ``b`` infinite, else ``nan + nanj``
    (XLA gave ``-pi/2`` imaginary parts)."""
    j = jnp()
    r = _branch_signs(x, j.arctanh(x), re=1, im=1)
    if not j.iscomplexobj(x):
        return r
    r = _unless_finite(x, r, _catanh_by_log1p(x))
    a, b = j.real(x), j.imag(x)
    zero = j.zeros_like(a)
    nb = j.isnan(b)
    r = _nan_case(x, r, nb, re=j.where((a == 0) | j.isinf(a), j.copysign(zero, a), j.nan),
                  im=j.nan)
    na = j.isnan(a) & ~nb
    return _nan_case(x, r, na, re=j.where(j.isinf(b), zero, j.nan),
                     im=j.where(j.isinf(b), j.copysign(j.full_like(b, math.pi / 2), b), j.nan))


def _log(x):
    """``log``; complex with an infinite part has an infinite real part even with a NaN in
    the other (``log(inf + nanj) = inf + nanj``, C99; XLA gave NaN)."""
    j = jnp()
    r = j.log(x)
    if not j.iscomplexobj(x):
        return r
    a, b = j.real(x), j.imag(x)
    return _nan_case(x, r, j.isinf(a) | j.isinf(b), re=j.inf)


def runtime_nn():
    from torchtpu._device import runtime

    return runtime.jax().nn


def _digamma(x):
    j = jnp()
    r = lax().digamma(x)
    # PyTorch's calc_digamma: digamma(+-0) = copysign(inf, -x) (-inf at +0, +inf at -0)
    return j.where(x == 0, j.copysign(j.inf, -x).astype(x.dtype), r)


def _exp(x):
    """``exp``; complex ``x = a + bj`` takes C99 ``cexp``'s special values, as CPU's
    ``std::exp`` (and NumPy) do where XLA gives NaN + NaNj: ``b == 0`` -> ``exp(a) + bj``
    (``exp(nan + 0j) = nan + 0j``), ``a = +inf`` with ``b`` inf or NaN -> ``inf + nanj``,
    ``a = -inf`` with ``b`` inf or NaN -> ``0 + copysign(0, b)j``."""
    j = jnp()
    r = j.exp(x)
    if not j.iscomplexobj(x):
        return r
    a, b = j.real(x), j.imag(x)
    e = j.exp(a)
    bad_b = ~j.isfinite(b)
    zero = j.zeros_like(a)
    re = j.where(b == 0, e, j.real(r))
    im = j.where(b == 0, b, j.imag(r))
    re = j.where((a == j.inf) & bad_b, j.inf, re)
    im = j.where((a == j.inf) & bad_b, j.nan, im)
    re = j.where((a == -j.inf) & bad_b, zero, re)
    im = j.where((a == -j.inf) & bad_b, j.copysign(zero, b), im)
    return lax().complex(re, im)


# Complex special values (infinities, NaN) where XLA's complex functions give NaN + NaNj
# and CPU's (std:: complex functions, C99 Annex G, as NumPy) do not.


def _abs(x):
    """``|x|``; complex: ``hypot``'s rule, inf when either part is infinite (even with a
    NaN in the other)."""
    j = jnp()
    r = j.abs(x)
    if not j.iscomplexobj(x):
        return r
    return j.where(j.isinf(j.real(x)) | j.isinf(j.imag(x)), j.inf, r).astype(r.dtype)


def _sqrt(x):
    """``sqrt``; complex ``a + bj`` as C99 ``csqrt``: ``b`` infinite -> ``inf + bj`` (any
    ``a``), ``a = +inf, b = nan`` -> ``inf + nanj``, ``a = -inf, b = nan`` -> ``nan + infj``;
    the imaginary part has the sign of ``b`` (``-0`` included)."""
    j = jnp()
    r = j.sqrt(x)
    if not j.iscomplexobj(x):
        return r
    a, b = j.real(x), j.imag(x)
    re, im = j.real(r), j.imag(r)
    nb = j.isnan(b)
    re = j.where((a == j.inf) & nb, j.inf, j.where((a == -j.inf) & nb, j.nan, re))
    im = j.where((a == -j.inf) & nb, j.inf, im)
    re = j.where(j.isinf(b), j.inf, re)
    im = j.where(j.isinf(b), b, im)
    return _branch_signs(x, lax().complex(re, im), im=1)  # sqrt(-1 - 0j) = -1j


def _exp2(x):
    """``2 ** x``; complex as ``exp(x * ln 2)`` with ``ln 2`` real (componentwise, so
    ``exp2(inf + 0j) = inf + 0j``) and :func:`_exp`'s special values."""
    j = jnp()
    if not j.iscomplexobj(x):
        return j.exp2(x)
    ln2 = math.log(2.0)
    return _exp(lax().complex(j.real(x) * ln2, j.imag(x) * ln2))


def _tan(x):
    """``tan``; complex ``a + 0j`` with ``a`` inf or NaN is ``nan + 0j`` (``ctan``)."""
    j = jnp()
    r = j.tan(x)
    if not j.iscomplexobj(x):
        return r
    a, b = j.real(x), j.imag(x)
    flat = (b == 0) & ~j.isfinite(a)
    return lax().complex(j.where(flat, j.nan, j.real(r)), j.where(flat, b, j.imag(r)))


def _atan(x):
    """``atan``; complex with a NaN part as C99 ``catan``: ``nan + bj`` -> ``nan + 0j``
    for ``b = +-0``, ``nan +- 0j`` for ``b = +-inf``, else ``nan + nanj``; ``a + nanj``
    with ``a`` finite -> ``nan + nanj`` (XLA gave +-pi/2 for the real part)."""
    j = jnp()
    r = j.arctan(x)
    if not j.iscomplexobj(x):
        return r
    r = _unless_finite(x, r, -1j * _catanh_by_log1p(1j * x))  # atan(x) = -i atanh(ix)
    a, b = j.real(x), j.imag(x)
    re, im = j.real(r), j.imag(r)
    zero = j.zeros_like(b)
    na = j.isnan(a)
    im_na = j.where(b == 0, b, j.where(j.isinf(b), j.copysign(zero, b), j.nan))
    re = j.where(na, j.nan, re)
    im = j.where(na, im_na, im)
    nb = j.isnan(b) & j.isfinite(a)
    re = j.where(nb, j.nan, re)
    im = j.where(nb, j.nan, im)
    return _branch_signs(x, lax().complex(re, im), re=1, im=1)  # atan(-0 + infj) = -pi/2


_UI = [  # same dtype in, same dtype out
    (aten.neg.default, lambda x: -x),
    (aten.abs.default, lambda x: _abs(x)),
    (aten.sign.default, lambda x: _sign(x)),
    (aten.floor.default, lambda x: jnp().floor(x) if _isfloat(x) else x),
    (aten.ceil.default, lambda x: jnp().ceil(x) if _isfloat(x) else x),
    (aten.trunc.default, lambda x: jnp().trunc(x) if _isfloat(x) else x),
    (aten.round.default, lambda x: jnp().round(x) if _isfloat(x) else x),
    (aten.frac.default, lambda x: x - jnp().trunc(_only_float("frac", x))),
    (aten.bitwise_not.default, lambda x: jnp().invert(_no_float("bitwise_not", x))
     if x.dtype != bool else ~x),
    (aten.isnan.default, lambda x: jnp().isnan(x)),
    (aten.isinf.default, lambda x: jnp().isinf(x)),
    (aten.isfinite.default, lambda x: jnp().isfinite(x)),
    (aten.signbit.default, lambda x: jnp().signbit(x)),
    (aten.conj_physical.default, lambda x: jnp().conj(x)),
    (aten._conj_physical.default, lambda x: jnp().conj(x)),
    (aten.positive.default, lambda x: x),
]
# PyTorch builds these without output casting: out= must have the input's dtype
_SAME_DTYPE_OUT = {aten.neg.default, aten.round.default, aten.bitwise_not.default}
for _op, _fn in _UI:
    unary(_op, _fn, float_math=False, same_dtype_out=_op in _SAME_DTYPE_OUT)


def _only_float(name, x):
    """``x`` if floating; else CPU's NotImplementedError for the dtype (frac of an int)."""
    if not _isfloat(x):
        raise NotImplementedError(
            f'"{name}_tpu" not implemented for \'{scalar_type_name(tdtype(x))}\'')
    return x


def _no_float(name, x):
    """``x`` if integral; else CPU's NotImplementedError (bitwise ops on floats)."""
    if _isfloat(x):
        raise NotImplementedError(
            f'"{name}_tpu" not implemented for \'{scalar_type_name(tdtype(x))}\'')
    return x


def _sign(x):
    """PyTorch's sign: (x > 0) - (x < 0), so NaN and -0.0 give 0 (jnp.sign keeps NaN)."""
    if x.dtype == bool:
        return x
    return ((x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)).astype(x.dtype)


def _isfloat(x):
    return jnp().issubdtype(x.dtype, jnp().inexact)


@lower(aten.round.decimals)
def round_decimals(x, decimals=0):
    j = jnp()
    ct = opmath(tdtype(x))
    x = cast(x, ct)
    if decimals >= 0:
        f = 10.0 ** decimals
        return ieee_div(j.round(x * f), j.asarray(f, x.dtype))
    f = 10.0 ** (-decimals)
    return j.round(ieee_div(x, j.asarray(f, x.dtype))) * f


@lower(aten.sgn.default)
def sgn(x):
    j = jnp()
    if j.iscomplexobj(x):
        a = j.abs(x)
        return j.where(a == 0, 0, x / j.where(a == 0, 1, a))
    return _sign(x)


@scalar_check
def _fill_fits(vals):
    """``fill_(300)`` on int8 raises as on CPU (``fill_(tensor(300))`` wraps there)."""
    vals[1] = check_converts(vals[1], vals[0].dtype, vals[0].numel())
    return vals


@scalar_check
def _clamp_fits(vals, roles=((1, "min"), (2, "max"))):
    """``clamp`` Scalar bounds must fit the result dtype, as CPU checks them (from torch
    2.15 on, integer bounds out of range saturate or raise: ``clamp_integer_bounds``).
    ``roles``: the bounds' positions in ``vals``."""
    bounds = [v for v in vals[1:] if v is not None and not isinstance(v, torch.Tensor)]
    xdt = vals[0].dtype
    if any(isinstance(b, complex) for b in bounds):
        # CPU: a floating tensor takes a complex bound's real part when its imaginary
        # part is 0 (else the bound "cannot be converted to type double"); other
        # tensors would get a complex result, which clamp refuses
        if not xdt.is_floating_point:
            raise NotImplementedError("clamp is not supported for complex types")
        for i in range(1, len(vals)):
            b = vals[i]
            if isinstance(b, complex):
                if b.imag != 0:
                    raise RuntimeError("value cannot be converted to type double without overflow")
                vals[i] = b.real
        bounds = [v for v in vals[1:] if v is not None and not isinstance(v, torch.Tensor)]
    if xdt.is_complex:
        raise NotImplementedError("clamp is not supported for complex types")
    if bounds:
        dt = vals[0].dtype
        for b in bounds:
            dt = torch.result_type(torch.empty((), dtype=dt, device="meta"), b)
        if not clamp_integer_bounds(vals, roles, dt):
            for b in bounds:
                check_converts(b, dt)
    return vals


def _one_bound_fits(role):
    """``clamp_min``/``clamp_max`` (CPU kernels of their own): a complex bound raises."""

    @scalar_check
    def prepare(vals):
        if isinstance(vals[1], complex):
            raise NotImplementedError("clamp is not supported for complex types")
        return _clamp_fits(vals, ((1, role),))

    return prepare


@lower(aten.clamp.Tensor)
@lower(aten.clamp.default, prepare=_clamp_fits)
def clamp(x, min=None, max=None):
    dt = promote(*[v for v in (x, min, max) if v is not None])
    ct = opmath(dt)
    r = cast(x, ct)
    j = jnp()
    isf = dt.is_floating_point
    # CPU's comparisons (``x < lo ? lo : x``, then ``> hi``): a ±0.0 tie keeps x's sign
    # (cpu_max); a NaN bound gives NaN
    if min is not None:
        m = cast(min, ct)
        r = j.where(j.isnan(m), m, cpu_max(r, m)) if isf else cpu_max(r, m)
    if max is not None:
        m = cast(max, ct)
        r = j.where(j.isnan(m), m, cpu_min(r, m)) if isf else cpu_min(r, m)
    if isf:
        r = j.where(j.isnan(cast(x, ct)), cast(x, ct), r)
    return r


def _bool_condition(vals):
    """CPU still accepts a uint8 condition in ``where`` (deprecated): treat it as bool."""
    c = vals[0]
    if isinstance(c, torch.Tensor) and c.dtype == torch.uint8:
        vals = [c.bool()] + list(vals[1:])
    return vals


@lower(aten.where.self, prepare=_bool_condition)
def where(cond, a, b):
    dt = promote(a, b)
    return jnp().where(cond, cast(a, dt), cast(b, dt))


@lower(aten.copy.default)
def copy(self, src, non_blocking=False):
    """``copy(self, src)``: ``src`` broadcast to ``self``'s shape, cast to its dtype."""
    return jnp().broadcast_to(cast(src, tdtype(self)), self.shape)


@lower(aten._to_copy.default)
def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return cast(x, dtype or tdtype(x))


@lower(torch.ops.prims.convert_element_type.default)
def convert_element_type(x, dtype):
    """``prims.convert_element_type``: ``x`` cast to ``dtype``.  Only graphs hold it
    (PyTorch's pass that turns a float ``item()`` used in arithmetic back into a tensor
    emits it); eager receives ``_to_copy``."""
    return cast(x, dtype)


@lower(aten.clone.default)
def clone(x, memory_format=None):
    return x


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(start, end, weight):
    dt = promote(start, end)
    if not (dt.is_floating_point or dt.is_complex):
        kernel = "lerp_kernel_tensor" if hasattr(weight, "shape") and weight.shape else (
            "lerp_kernel_scalar")
        raise NotImplementedError(f'"{kernel}" not implemented for \'{scalar_type_name(dt)}\'')
    ct = opmath(dt)
    s, e, w = cast(start, ct), cast(end, ct), cast(weight, ct)
    j = jnp()
    # PyTorch's lerp: weight < 0.5 ? start + w*(end-start) : end - (end-start)*(1-w)
    return j.where(j.abs(w) < 0.5, s + w * (e - s), e - (e - s) * (1 - w))


@lower(aten.addcmul.default, prepare=_value_fits)
def addcmul(self, t1, t2, value=1):
    dt = promote(self, t1, t2)
    _not_for_bool(dt, "addcmul_cpu_out")
    ct = opmath(dt)
    return cast(self, ct) + cast(value, ct) * cast(t1, ct) * cast(t2, ct)


@lower(aten.addcdiv.default, prepare=_value_fits)
def addcdiv(self, t1, t2, value=1):
    if not (tdtype(t1).is_floating_point or tdtype(t1).is_complex or tdtype(t2).is_floating_point
            or tdtype(t2).is_complex):  # integer or bool operands (meta misses bool)
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future  release "
            "addcdiv will perform a true division of tensor1 and tensor2. The historic addcdiv "
            "behavior can be implemented as (input + value * torch.trunc(tensor1 / tensor2))."
            "to(input.dtype) for integer inputs and as (input + value * tensor1 / tensor2) for "
            "float inputs. The future addcdiv behavior is just the latter implementation: "
            "(input + value * tensor1 / tensor2), for all dtypes.")
    dt = promote(self, t1, t2)
    ct = opmath(dt)
    # CPU's order: self + value * t1 / t2 (one rounding less than value * (t1 / t2))
    return cast(self, ct) + cast(value, ct) * cast(t1, ct) / cast(t2, ct)


@lower(aten.fill.Tensor)
@lower(aten.fill.Scalar, prepare=_fill_fits)
def fill(self, value):
    return jnp().full(self.shape, cast(value, tdtype(self)), npdt(tdtype(self)))


@lower(aten.zero.default)
def zero(self):
    return jnp().zeros(self.shape, self.dtype)


@lower(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    j = jnp()
    if not _isfloat(x):
        return x
    fi = j.finfo(x.dtype)
    r = j.where(j.isnan(x), 0.0 if nan is None else nan, x)
    r = j.where(j.isposinf(x), fi.max if posinf is None else posinf, r)
    r = j.where(j.isneginf(x), fi.min if neginf is None else neginf, r)
    return r.astype(x.dtype)


@lower(aten.heaviside.default)
def heaviside(x, values):
    dt = promote(x, values)
    j = jnp()
    x, v = cast(x, dt), cast(values, dt)
    return j.where(x == 0, v, (x > 0).astype(x.dtype))


@lower(aten.clamp_min.Tensor)
@lower(aten.clamp_min.default, prepare=_one_bound_fits("min"))
def clamp_min(x, min):
    return clamp(x, min, None)


@lower(aten.clamp_max.Tensor)
@lower(aten.clamp_max.default, prepare=_one_bound_fits("max"))
def clamp_max(x, max):
    return clamp(x, None, max)


@lower(aten.isposinf.default)
def isposinf(x):
    return jnp().isposinf(x) if _isfloat(x) else jnp().zeros(x.shape, bool)


@lower(aten.isneginf.default)
def isneginf(x):
    return jnp().isneginf(x) if _isfloat(x) else jnp().zeros(x.shape, bool)


@lower(aten.glu.default)
def glu(x, dim=-1):
    """``glu(x) = a * sigmoid(b)`` with ``a, b = x.chunk(2, dim)``."""
    a, b = jnp().split(x, 2, axis=dim)
    ct = _float_compute(x)
    return cast(a, ct) * _sigmoid(cast(b, ct))


@lower(aten.complex.default)
def complex_(real, imag):
    """``real + i imag``; float16 parts make a complex32 result, which tpu does not have
    (``npdt`` raises its NotImplementedError)."""
    if tdtype(real) == torch.float16:
        npdt(torch.complex32)
    j = jnp()
    shape = j.broadcast_shapes(real.shape, imag.shape)
    return lax().complex(j.broadcast_to(real, shape),
                         j.broadcast_to(cast(imag, tdtype(real)), shape))


@lower(aten.polar.default)
def polar(abs_, angle):
    j = jnp()
    shape = j.broadcast_shapes(abs_.shape, angle.shape)
    a, t = j.broadcast_to(abs_, shape), j.broadcast_to(angle, shape)
    return lax().complex(a * j.cos(t), a * j.sin(t))


@lower(aten.angle.default)
def angle(x):
    j = jnp()
    if j.iscomplexobj(x):
        return j.angle(x)
    xf = cast(x, _float_compute(x))
    r = j.where(xf < 0, j.asarray(math.pi, xf.dtype), j.zeros_like(xf))
    return j.where(j.isnan(xf), xf, r)


def _float_result(vals) -> torch.dtype:
    dt = vals[0].dtype
    return dt if dt.is_floating_point or dt.is_complex else torch.get_default_dtype()


@lower(aten.logit.default, prepare=fits(1, dtype=_float_result))
def logit(x, eps=None):
    j = jnp()
    xf = cast(x, _float_compute(x))
    if eps is not None:
        lo = j.asarray(eps, xf.dtype)
        xf = j.where(xf < lo, lo, j.where(xf > 1 - lo, 1 - lo, xf))
    return j.log(xf / (1 - xf))


@lower(aten.logit_backward.default)
def logit_backward(g, x, eps=None):
    """CPU's kernel, in ``x``'s dtype: ``eps`` converted to it (``eps.to<scalar_t>()``,
    ``hi = 1 - eps`` rounded there too): ``g / (x * (1 - x))`` where ``eps <= x <= hi``,
    else 0 (NaN ``x`` too, as CPU's vectorized loop; its scalar tail gives NaN); without
    ``eps`` (or below 0): NaN outside [0, 1].  (PyTorch's
    decomposition compared a float16 ``x`` with the unrounded ``eps``: float16's 0.1,
    0.0999756, got 0 for ``eps=0.1`` where CPU gives the gradient.)"""
    j = jnp()
    gg = cast(g, tdtype(x))
    one = j.asarray(1, x.dtype)
    r = ieee_div(gg, x * (one - x))
    lo = None if eps is None else npdt(tdtype(x)).type(eps)
    if lo is not None and lo >= 0:
        lo = j.asarray(lo, x.dtype)
        return j.where((x >= lo) & (x <= one - lo), r, j.zeros_like(r))
    return j.where((x < 0) | (x > 1), j.asarray(math.nan, x.dtype), r)


def _isin_meta(elements, test_elements, assume_unique=False, invert=False, *out):
    """PyTorch's meta output of ``isin``, after CPU's view check of the brute-force path
    (``decomp_overrides._isin_brute_force_view_check``); ``out``: the ``out=`` form's
    tensor (its own resize and checks follow)."""
    from torchtpu.ops.decomp_overrides import _isin_brute_force_view_check

    _isin_brute_force_view_check(elements, test_elements)
    return aten.isin.Tensor_Tensor(elements, test_elements, assume_unique=assume_unique,
                                   invert=invert)


# more element x test-element comparisons than this take the sorting method
_ISIN_COMPARE_ALL = 1 << 22


@lower(aten.isin.Tensor_Tensor, meta=_isin_meta)
def isin(elements, test_elements, assume_unique=False, invert=False):
    """``isin`` as one executable (PyTorch's structured kernel allocated an ``out`` and
    ran its decomposition's ops into it: 5 ops per call, 3 calls per token in HF's
    ``generate``): both operands in their promoted dtype, every element against every
    test element (NaN matches nothing, -0.0 matches 0.0, as CPU), or JAX's sorting
    method for large operands."""
    j = jnp()
    dt = promote(elements, test_elements)
    e, t = cast(elements, dt), cast(test_elements, dt).reshape(-1)
    method = "compare_all" if e.size * t.size <= _ISIN_COMPARE_ALL else "sort"
    return j.isin(e, t, invert=bool(invert), method=method)


def _shift_meta(a, b):
    """``__lshift__``/``__rshift__``'s output: PyTorch's meta kernel refuses a Bool operand
    (``bool_tensor << 2``) that CPU's kernel shifts in the promoted dtype (int64 there); the
    lowering's check raises CPU's error for the dtypes CPU refuses."""
    shape = torch.broadcast_shapes(*(t.shape for t in (a, b) if isinstance(t, torch.Tensor)))
    return torch.empty(shape, dtype=torch.result_type(a, b), device="meta")


_lshift_check = _integral_only("lshift", bool_ok=False)
_rshift_check = _integral_only("rshift", bool_ok=False)
binary(aten.__lshift__.Tensor, lambda x, y: jnp().left_shift(x, y), check=_lshift_check,
       meta=_shift_meta)
binary(aten.__lshift__.Scalar, lambda x, y: jnp().left_shift(x, y), check=_lshift_check,
       meta=_shift_meta)
binary(aten.__rshift__.Tensor, lambda x, y: jnp().right_shift(x, y), check=_rshift_check,
       meta=_shift_meta)
binary(aten.__rshift__.Scalar, lambda x, y: jnp().right_shift(x, y), check=_rshift_check,
       meta=_shift_meta)
binary(aten.bitwise_left_shift.Tensor_Scalar, lambda x, y: jnp().left_shift(x, y),
       check=_lshift_check)
binary(aten.bitwise_right_shift.Tensor_Scalar, lambda x, y: jnp().right_shift(x, y),
       check=_rshift_check)
