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
from torchtpu.ops._scalar import Scalar
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
    if n == 0:  # calc_digamma: copysign(inf, -x) at +-0
        return j.where(x == 0, j.copysign(j.inf, -x).astype(x.dtype), lax().digamma(x))
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


def _igamma_edges(a, x, fn, upper):
    """``fn(a, x)`` (``gammainc``/``gammaincc``) with the special cases of PyTorch's
    ``calc_igamma``/``calc_igammac`` taken first, in its order: ``x < 0`` or ``a < 0`` ->
    NaN; ``a == 0`` -> 1 (igammac: 0) for ``x > 0``, else NaN; ``x == 0`` -> 0 (1);
    ``a`` infinite -> NaN for infinite ``x``, else 0 (1); ``x`` infinite -> 1 (0).  JAX's
    functions give NaN at ``a == 0`` and at infinite ``a`` and 1 at ``a = x = inf``.

    float32 (and half) compute in float64 and round once: XLA's float32 ``igamma`` is up
    to ~3e-5 (relative) off CPU's near ``a ~ x ~ 45``, past the 1.3e-6 float32 tolerance."""
    j = jnp()
    dt = a.dtype
    if dt == j.float32:
        a, x = a.astype(j.float64), x.astype(j.float64)
    lo, hi = (1.0, 0.0) if upper else (0.0, 1.0)
    nan = j.full(a.shape, j.nan, a.dtype)
    one_lo, one_hi = j.full(a.shape, lo, a.dtype), j.full(a.shape, hi, a.dtype)
    special = (x < 0) | (a < 0) | (a == 0) | (x == 0) | j.isinf(a) | j.isinf(x)
    safe = ~special
    r = fn(j.where(safe, a, 1), j.where(safe, x, 1))
    r = j.where(j.isinf(x), one_hi, r)
    r = j.where(j.isinf(a), j.where(j.isinf(x), nan, one_lo), r)
    r = j.where(x == 0, one_lo, r)
    r = j.where(a == 0, j.where(x > 0, one_hi, nan), r)
    r = j.where((x < 0) | (a < 0), nan, r)
    return r.astype(dt)


@lower(aten.igamma.default)
def igamma(a, x):
    a, x = _bin(a, x)
    a, x = jnp().broadcast_arrays(a, x)
    return _igamma_edges(a, x, _sp().gammainc, upper=False)


@lower(aten.igammac.default)
def igammac(a, x):
    a, x = _bin(a, x)
    a, x = jnp().broadcast_arrays(a, x)
    return _igamma_edges(a, x, _sp().gammaincc, upper=True)


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


def _frexp_out_dtypes(vals, dts):
    """``out_dtypes`` hook (build time): ``frexp(x, out=(m, e))`` with ``m`` not of
    ``x``'s dtype or ``e`` not int32 raises CPU's error (PyTorch's meta kernel accepts
    both, and the write would cast)."""
    if len(vals) == 3 and all(isinstance(v, torch.Tensor) for v in vals):
        x, m, e = vals
        if m.dtype != x.dtype or e.dtype != torch.int32:
            torch.frexp(torch.empty(0, dtype=x.dtype),
                        out=(torch.empty(0, dtype=m.dtype), torch.empty(0, dtype=e.dtype)))
    return dts


@lower(aten.frexp.Tensor, out_dtypes=_frexp_out_dtypes)
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


# ------------------------------------------------------------------ orthogonal polynomials
#
# ``torch.special.*_polynomial_*(x, n)``: PyTorch's CPU kernels (aten/src/ATen/native/Math.h)
# truncate ``n`` to int64 (NaN, +-inf and out-of-range floats give a negative ``n``, as the
# x86 conversion does), take the special cases in this order: ``n < 0`` -> 0, the values
# at the interval ends, a trigonometric closed form inside the interval for larger ``n``,
# ``n`` = 0 and 1, and else run the three-term recurrence in the compute dtype (stopping
# once the value is NaN).  The recurrence here is a ``while_loop`` up to the largest ``n``
# of the elements that need it, each element frozen after its own ``n``.


def _poly_n(n, dt):
    """``n`` as int64 the way ``static_cast<int64_t>`` does on x86 (invalid -> negative)."""
    j = jnp()
    if isinstance(n, Scalar):
        n = n.value
    if not hasattr(n, "dtype"):
        n = j.asarray(n)
    if j.issubdtype(n.dtype, j.integer) or n.dtype == bool:
        return n.astype(npdt(torch.int64))
    nf = n.astype(j.float64) if n.dtype == j.float64 else n.astype(j.float32)
    ok = j.isfinite(nf) & (j.abs(nf) < 2.0 ** 63)
    return j.where(ok, j.trunc(j.where(ok, nf, 0)), -1).astype(npdt(torch.int64))


def _poly(x, n, q1, step, k0, cases):
    """Shared driver: ``x`` and the int64 ``n`` broadcast; ``q1``: the value at n = 1;
    ``step(k, p, q)``: the next value; the loop runs ``k = k0 .. k0 + n - 2``;
    ``cases(x, n, nf)``: ``[(mask, value), ...]`` in PyTorch's priority order, ahead of
    n = 0 and n = 1."""
    j = jnp()
    lx = lax()
    xc, _ = _bin(x, n)
    ni = _poly_n(n, xc.dtype)
    xc, ni = j.broadcast_arrays(xc, ni)
    dt = xc.dtype
    nf = ni.astype(dt)
    pre = [(ni < 0, j.zeros_like(xc))] + cases(xc, ni, nf)
    pre += [(ni == 0, j.ones_like(xc)), (ni == 1, q1(xc))]
    taken = j.zeros(xc.shape, bool)
    for m, _ in pre:
        taken = taken | m
    loop = ~taken
    last = k0 + ni - 2  # the last k of the recurrence
    kmax = j.max(j.where(loop, last, k0 - 1), initial=k0 - 1)

    def cond(s):
        k, p, q = s
        return (k <= kmax) & j.any(loop & (k <= last) & ~j.isnan(q))

    def body(s):
        k, p, q = s
        r = step(k.astype(dt), xc, p, q)
        upd = loop & (k <= last) & ~j.isnan(q)
        return k + 1, j.where(upd, q, p), j.where(upd, r, q)

    init = (j.asarray(k0, npdt(torch.int64)), j.ones_like(xc), q1(xc))
    _, _, out = lx.while_loop(cond, body, init)
    for m, v in reversed(pre):
        out = j.where(m, v, out)
    return out


def _even(n):
    return n % 2 == 0


def _cheb_cases(kind, shifted, trig_n):
    """End-point and trigonometric cases of the Chebyshev polynomials T, U, V, W (shifted:
    on [0, 1], argument ``y = 2x - 1``)."""
    def cases(x, n, nf):
        j = jnp()
        one = j.ones_like(x)
        sgn = j.where(_even(n), 1.0, -1.0).astype(x.dtype)
        y = (x + x - 1) if shifted else x
        # end points: T(1)=1, T(-1)=(-1)^n; U: (n+1)(+-1)^n; V(1)=1, V(-1)=(-1)^n(2n+1);
        # W(1)=2n+1, W(-1)=(-1)^n
        top = {"t": one, "u": nf + 1, "v": one, "w": nf + nf + 1}[kind]
        bot = {"t": sgn, "u": sgn * (nf + 1), "v": sgn * (nf + nf + 1), "w": sgn}[kind]
        if shifted:
            ends = [(x == 1, top), (x == 0, bot)]
        else:
            pos_or_even = (x > 0) | _even(n) if kind in ("t", "u") else (x > 0)
            ends = [(j.abs(x) == 1, j.where(pos_or_even, top, bot))]
        a = j.arccos(j.where(j.abs(y) < 1, y, 0))
        inside = (n > trig_n) & (j.abs(y) < 1)
        if kind == "t":
            val = j.cos(nf * a)
        elif kind == "u":
            s = j.sin(a)
            val = j.where(s != 0, j.sin((nf + 1) * a) / j.where(s != 0, s, 1),
                          (nf + 1) * j.cos((nf + 1) * a) / y)
        elif kind == "v":
            h = a / 2
            val = j.where(j.sin(h) != 1, j.cos((nf + 0.5) * a) / j.cos(h), sgn * (nf + nf + 1))
        else:
            h = a / 2
            alt = sgn if shifted else j.where(y > 0, nf + nf + 1, sgn)
            val = j.where(j.cos(h) != 1, j.sin((nf + 0.5) * a) / j.sin(h), alt)
        return ends + [(inside, val.astype(x.dtype))]
    return cases


def _lower_cheb(op, kind, shifted, trig_n):
    q1 = {"t": lambda y: y, "u": lambda y: y + y, "v": lambda y: y + y - 1,
          "w": lambda y: y + y + 1}[kind]
    if shifted:
        first = lambda x: q1(x + x - 1)  # noqa: E731
        step = lambda k, x, p, q: ((x + x - 1) + (x + x - 1)) * q - p  # noqa: E731
    else:
        first = q1
        step = lambda k, x, p, q: (x + x) * q - p  # noqa: E731
    lower(op)(lambda x, n: _poly(x, n, first, step, 2, _cheb_cases(kind, shifted, trig_n)))


for _kind, _tn in (("t", 6), ("u", 8), ("v", 8), ("w", 8)):
    _lower_cheb(getattr(aten, f"special_chebyshev_polynomial_{_kind}").default, _kind, False, _tn)
for _kind, _tn in (("t", 6), ("u", 6), ("v", 6), ("w", 4)):
    _lower_cheb(getattr(aten, f"special_shifted_chebyshev_polynomial_{_kind}").default, _kind,
                True, _tn)


def _hermite_limit(dt):
    return 512 if dt == jnp().float64 else 128


@lower(aten.special_hermite_polynomial_h.default)
def hermite_polynomial_h(x, n):
    """Physicists' Hermite H_n: ``H_{k+1} = 2x H_k - 2k H_{k-1}``; NaN past n = 128
    (float32) / 512 (float64), as PyTorch."""
    j = jnp()
    # PyTorch's loop variable k runs 2, 4, ..., 2n-2: here k = 1 .. n-1 and 2k.
    return _poly(x, n, lambda x: x + x, lambda k, x, p, q: (x + x) * q - (k + k) * p, 1,
                 lambda x, n, nf: [(n > _hermite_limit(x.dtype), j.full_like(x, j.nan))])


@lower(aten.special_hermite_polynomial_he.default)
def hermite_polynomial_he(x, n):
    """Probabilists' Hermite He_n: ``He_{k+1} = x He_k - k He_{k-1}``; NaN past the same
    limits as H."""
    j = jnp()
    return _poly(x, n, lambda x: x, lambda k, x, p, q: x * q - k * p, 1,
                 lambda x, n, nf: [(n > _hermite_limit(x.dtype), j.full_like(x, j.nan))])


@lower(aten.special_laguerre_polynomial_l.default)
def laguerre_polynomial_l(x, n):
    """Laguerre L_n: ``L_{k+1} = ((2k + 1 - x) L_k - k L_{k-1}) / (k + 1)``; 1 at x = 0."""
    j = jnp()
    return _poly(x, n, lambda x: 1 - x,
                 lambda k, x, p, q: (((k + k) + (1 - x)) * q - k * p) / (k + 1), 1,
                 lambda x, n, nf: [(j.abs(x) == 0, j.ones_like(x))])


@lower(aten.special_legendre_polynomial_p.default)
def legendre_polynomial_p(x, n):
    """Legendre P_n: ``P_{k+1} = ((2k + 1) x P_k - k P_{k-1}) / (k + 1)``; P_n(1) = 1,
    P_n(-1) = (-1)^n."""
    j = jnp()

    def cases(x, n, nf):
        end = j.where((x > 0) | _even(n), 1.0, -1.0).astype(x.dtype)
        return [(j.abs(x) == 1, end)]
    return _poly(x, n, lambda x: x, lambda k, x, p, q: ((k + k + 1) * x * q - k * p) / (k + 1),
                 1, cases)
