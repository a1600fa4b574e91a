"""Special-function lowerings: polygamma, Bessel functions, incomplete gamma, sinc, frexp,
``torch.special.*``.

Integer and bool inputs compute in the default float dtype, half/bfloat16 in float32
(``opmath``), rounded once by the executor.  Values come from ``jax.scipy.special`` or
``jax.lax`` where those implement the same function; edge cases (poles, zeros, infinities)
follow PyTorch's CPU kernels.
"""

from __future__ import annotations

import math

import torch

from torchtpu.ops import aten, lower
from torchtpu.ops._util import (cast, float_compute, jnp, lax, npdt, opmath, promote, tdtype,
                                to_float_compute)
from torchtpu._device import runtime


def _sp():
    return runtime.jax().scipy.special


_fc = float_compute
_f = to_float_compute


def _bin(a, b):
    """Both operands in the promoted float compute dtype."""
    dt = promote(a, b)
    if not (dt.is_floating_point or dt.is_complex):
        dt = torch.get_default_dtype()
    ct = opmath(dt)
    return cast(a, ct), cast(b, ct)


def _unary(op, fn):
    lower(op)(lambda x: fn(_f(x)))


# ------------------------------------------------------------------ gamma family


def _trigamma(x):
    """PyTorch's ``calc_trigamma``: reflection for x < 0.5
    (``trigamma(x) = pi^2 / sin^2(pi x) - trigamma(1 - x)``), six recurrence steps, then
    the asymptotic series."""
    j = jnp()
    refl = x < 0.5
    s_sin = j.sin(math.pi * x)
    xx = j.where(refl, 1 - x, x)
    r = j.zeros_like(x)
    for _ in range(6):
        r = r + 1 / (xx * xx)
        xx = xx + 1
    ixx = 1 / (xx * xx)
    r = r + (1 + 1 / (2 * xx) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / xx
    return j.where(refl, (math.pi * math.pi) / (s_sin * s_sin) - r, r)


@lower(aten.polygamma.default)
def polygamma(n, x):
    j = jnp()
    x = _f(x)
    if n == 0:
        return j.where(x == 0, -j.inf, lax().digamma(x))
    if n == 1:
        return _trigamma(x)
    # (-1)^(n+1) n! zeta(n+1, x)
    fact = math.exp(math.lgamma(n + 1))
    sgn = -1.0 if n % 2 == 0 else 1.0
    return (sgn * fact) * _zeta(j.full(x.shape, n + 1, x.dtype), x)


@lower(aten.special_polygamma.default)
def special_polygamma(n, x):
    return polygamma(n, x)


@lower(aten.mvlgamma.default)
def mvlgamma(x, p):
    j = jnp()
    x = _f(x)
    c = p * (p - 1) / 4 * math.log(math.pi)
    r = j.zeros_like(x) + c
    for i in range(p):
        r = r + lax().lgamma(x - i / 2)
    return r


@lower(aten.igamma.default)
def igamma(a, x):
    a, x = _bin(a, x)
    return _sp().gammainc(a, x)


@lower(aten.igammac.default)
def igammac(a, x):
    a, x = _bin(a, x)
    return _sp().gammaincc(a, x)


_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
           7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
           -4.5979787224074726105e15, 1.8152105401943546773e17, -7.1661652561756670113e18)


def _zeta(x, q):
    """Hurwitz zeta, PyTorch's (Cephes) algorithm: direct sum until ``a > 9`` and at least
    9 terms (stopping early once a term is below MACHEP relative), then Euler-Maclaurin
    with 12 Bernoulli terms.  ``x`` and ``q`` in one float dtype."""
    j = jnp()
    dt = x.dtype
    machep = 1.11022302462515654042e-16
    one = j.asarray(1.0, dt)
    special = (x == 1) | (x < 1) | ((q <= 0) & ((q == j.floor(q)) | (x != j.floor(x))))
    special_val = j.where(x == 1, j.inf, j.where(x < 1, j.nan,
                          j.where(q == j.floor(q), j.inf, j.nan))).astype(dt)
    s0 = j.power(q, -x)


    def body2(c):
        i, a, s, b, done, ret = c
        go = ~done
        i = j.where(go, i + 1, i)
        a = j.where(go, a + 1, a)
        b = j.where(go, j.power(a, -x), b)
        s = j.where(go, s + b, s)
        early = go & (j.abs(b / s) < machep)
        fin = go & ~((i < 9) | (a <= 9.0))
        return i, a, s, b, done | early | fin, ret | early

    zero_i = j.zeros(j.broadcast_shapes(x.shape, q.shape), j.int32)
    init = (zero_i, j.broadcast_to(q, zero_i.shape), j.broadcast_to(s0, zero_i.shape),
            j.zeros(zero_i.shape, dt), j.broadcast_to(special, zero_i.shape),
            j.zeros(zero_i.shape, bool))
    _, a, s, b, _, ret = lax().while_loop(lambda c: j.any(~c[4]), body2, init)
    w = a
    s2 = s + b * w / (x - 1) - 0.5 * b
    aa = one
    k = j.zeros_like(s2)
    stop = ret
    for coef in _ZETA_A:
        aa = aa * (x + k)
        b = b / w
        t = aa * b / coef
        s2 = j.where(stop, s2, s2 + t)
        stop = stop | (j.abs(t / s2) < machep)
        k = k + 1
        aa = aa * (x + k)
        b = b / w
        k = k + 1
    res = j.where(ret, s, s2)
    return j.where(special, special_val, res)


@lower(aten.special_zeta.default)
def zeta(x, q):
    x, q = _bin(x, q)
    return _zeta(x, q)


# ------------------------------------------------------------------ Bessel


_unary(aten.i0.default, lambda x: _sp().i0(x))
_unary(aten.special_i0e.default, lambda x: _sp().i0e(x))
_unary(aten.special_i1.default, lambda x: _sp().i1(x))
_unary(aten.special_i1e.default, lambda x: _sp().i1e(x))
_unary(aten.special_modified_bessel_i0.default, lambda x: _sp().i0(x))
_unary(aten.special_modified_bessel_i1.default, lambda x: _sp().i1(x))


# ------------------------------------------------------------------ error functions


_unary(aten.special_ndtr.default, lambda x: _sp().ndtr(x))
_unary(aten.special_ndtri.default, lambda x: _sp().ndtri(x))
_unary(aten.special_log_ndtr.default, lambda x: _sp().log_ndtr(x))
_unary(aten.special_erfcx.default, lambda x: _sp().erfcx(x))
_unary(aten.special_entr.default, lambda x: _entr(x))


def _entr(x):
    j = jnp()
    r = j.where(x > 0, -x * j.log(j.where(x > 0, x, 1)), j.where(x == 0, 0.0, -j.inf))
    return j.where(j.isnan(x), x, r).astype(x.dtype)


@lower(aten.special_xlog1py.default)
def xlog1py(a, b):
    j = jnp()
    x, y = _bin(a, b)
    r = j.where(x == 0, j.zeros_like(x), x * j.log1p(y))
    return j.where(j.isnan(y), j.nan, r)


# ------------------------------------------------------------------ misc


@lower(aten.sinc.default)
def sinc(x):
    j = jnp()
    x = _f(x)
    p = x * math.pi
    return j.where(x == 0, j.ones_like(x), j.sin(p) / j.where(x == 0, 1, p))


@lower(aten.frexp.Tensor)
def frexp(x):
    j = jnp()
    if not j.issubdtype(x.dtype, j.floating):
        raise RuntimeError("torch.frexp() only supports floating-point dtypes")
    ct = opmath(tdtype(x))
    m, e = j.frexp(cast(x, ct))
    return m, e.astype(npdt(torch.int32))


def _spherical_j0(x):
    """PyTorch's ``spherical_bessel_j0``: Taylor polynomial for |x| < 0.5, else
    ``sin(x) / x``; 0 at +-inf."""
    j = jnp()
    x2 = x * x
    poly = 1 + x2 * (-1.0 / 6 + x2 * (1.0 / 120 + x2 * (-1.0 / 5040 + x2 * (
        1.0 / 362880 + x2 * (-1.0 / 39916800 + x2 * (1.0 / 6227020800))))))
    small = j.abs(x) < 0.5
    r = j.where(small, poly, j.sin(x) / j.where(small, 1, x))
    return j.where(j.isinf(x), j.zeros_like(x), r)


_unary(aten.special_spherical_bessel_j0.default, _spherical_j0)
