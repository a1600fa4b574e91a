"""Random lowerings: uniform, normal, bernoulli, randint/random, randperm, multinomial...

Every random lowering is registered with ``random=True`` and receives ``key=``: uint32[4]
(a hash of seed and offset) drawn on the host from the device's stream
(``torchtpu._device.state.RNGState``).  :func:`prng_key` turns it into a JAX key inside
the executable, so drawing a key never syncs and a seeded program replays its streams.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from torchtpu._device import runtime
from torchtpu.ops import _checks, aten, lower
from torchtpu.ops._scalar import C_TYPE_NAMES, scalar_check
from torchtpu.ops._util import jnp, npdt, opmath, promote, scalar_type_name, tdtype
from torchtpu.ops.decomp_overrides import decomp


def prng_key(key):
    """Traced: a JAX PRNG key from the uint32[4] key data given to random lowerings.

    The key data is already a hash of (seed, offset) (``state.RNGState.next_key_data``),
    so it is used as is, as a JAX ``rbg`` key: bits come from XLA's ``RngBitGenerator``.
    A threefry key derived in the executable (``fold_in`` twice, then threefry bits) costs
    2-3x more to trace and compile, for every new shape (measured on CPU: uniform of
    f64[n] 240 ms -> 90 ms at the quick compile tier).
    """
    return runtime.jax().random.wrap_key_data(key, impl="rbg")


def threefry_key(key):
    """Traced: a JAX ``threefry2x32`` key from the same uint32[4] key data, for the few
    JAX samplers that accept no other key implementation (``jax.random.poisson``).  The
    key data is a hash of (seed, offset), so its first two words are a key as good."""
    return runtime.jax().random.wrap_key_data(key[:2], impl="threefry2x32")


def _jr():
    return runtime.jax().random


def _sample_dtype(dtype: torch.dtype):
    """numpy dtype in which to draw floats for a tensor of ``dtype`` (float32 for
    half/bfloat16 and for non-float tensors, as PyTorch's CPU generator does; the
    component dtype for complex tensors)."""
    if dtype in (torch.float64, torch.complex128):
        return npdt(torch.float64)
    return npdt(torch.float32)


def _to_complex(pairs, dtype):
    """Traced: complex values of ``dtype`` from real pairs ``pairs[..., 2]``."""
    return runtime.jax().lax.complex(pairs[..., 0], pairs[..., 1]).astype(npdt(dtype))


def _uniform(key, shape, dtype, lo=0.0, hi=1.0):
    ct = _sample_dtype(dtype)
    return _jr().uniform(prng_key(key), tuple(shape), ct, lo, hi)


def _check_float(op, dtype):
    if not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(f"{op} expects a floating point dtype, got {dtype}")


# ------------------------------------------------------------------- uniform / normal


_LIMIT_NAMES = {torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float",
                torch.float64: "Double"}


@scalar_check
def _uniform_checks(vals):
    """Host side, CPU's ``uniform_`` checks: ``from``/``to`` within the dtype's finite
    range (a complex tensor: its component's), ``from <= to``, and ``to - from`` finite
    in the dtype.  Raises ``RuntimeError`` with CPU's messages."""
    x, lo, hi = vals[0], vals[1], vals[2]
    dt = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(x.dtype, x.dtype)
    if dt not in _LIMIT_NAMES or isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        return vals
    fmax = torch.finfo(dt).max
    for name, v in (("from", lo), ("to", hi)):
        if not -fmax <= float(v) <= fmax:  # NaN and inf fail too
            raise RuntimeError(f"{name} is out of bounds for {C_TYPE_NAMES[dt]}")
    if lo > hi:
        raise RuntimeError(
            f"uniform_ expects to return a [from, to) range, but found from={lo:g} > to={hi:g}")
    if hi - lo > fmax:
        raise RuntimeError(
            f"uniform_ expects to-from <= std::numeric_limits<{_LIMIT_NAMES[dt]}>::max(), "
            f"but found to={hi:g} and from={lo:g} which result in to-from to exceed the limit")
    return vals


@lower(aten.uniform.default, random=True, prepare=_uniform_checks)
def uniform(x, low=0.0, high=1.0, generator=None, *, key):
    dt = tdtype(x)
    if not (dt.is_floating_point or dt.is_complex):  # CPU's dispatch error
        raise NotImplementedError(
            f'"check_uniform_bounds" not implemented for \'{scalar_type_name(dt)}\'')
    # complex: real and imaginary parts each uniform on [low, high), as PyTorch (which
    # fills view_as_real(x))
    shape = tuple(x.shape) + ((2,) if dt.is_complex else ())
    u = _uniform(key, shape, dt)
    ct = u.dtype
    # from + (to - from) * u, as PyTorch's uniform_real_distribution
    j = jnp()
    r = j.asarray(low, ct) + j.asarray(high - low, ct) * u
    # a value that rounds to ``to`` in the tensor's dtype becomes ``from``, as PyTorch's
    # kernels do ("reverse the bounds"): the result stays in [from, to) (a bfloat16 draw
    # rounds to 1.0 once in 512 otherwise)
    out_dt = r.dtype if dt.is_complex else npdt(dt)
    r = r.astype(out_dt)
    r = j.where(r == j.asarray(high, out_dt), j.asarray(low, out_dt), r)
    return _to_complex(r, dt) if dt.is_complex else r


def _normal(key, shape, dtype):
    """Traced: standard normal samples for a tensor of ``dtype``; for a complex dtype
    complex samples of variance 1 (each part N(0, 1/2)), as PyTorch's complex normal."""
    if dtype.is_complex:
        z = _jr().normal(prng_key(key), tuple(shape) + (2,), _sample_dtype(dtype))
        return _to_complex(z * np.sqrt(0.5).astype(z.dtype), dtype)
    return _jr().normal(prng_key(key), tuple(shape), _sample_dtype(dtype))


@lower(aten.normal_functional.default, random=True)
def normal_functional(x, mean=0.0, std=1.0, generator=None, *, key):
    dt = tdtype(x)
    _check_float("normal_", dt)
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    z = _normal(key, x.shape, dt)
    if dt.is_complex:  # PyTorch fills view_as_real(x): mean is added to both parts
        return z * jnp().asarray(std, z.real.dtype) + jnp().asarray(complex(mean, mean), z.dtype)
    return (z * jnp().asarray(std, z.dtype) + jnp().asarray(mean, z.dtype)).astype(npdt(dt))


@lower(aten.normal.Tensor_float, random=True)
def normal_tensor_float(mean, std=1.0, generator=None, *, key):
    dt = tdtype(mean)
    z = _normal(key, mean.shape, dt)
    return z * jnp().asarray(std, z.dtype) + mean.astype(z.dtype)


@lower(aten.normal.float_Tensor, random=True)
def normal_float_tensor(mean, std, generator=None, *, key):
    dt = tdtype(std)
    z = _normal(key, std.shape, dt)
    return z * std.astype(z.dtype) + jnp().asarray(mean, z.dtype)


@lower(aten.normal.Tensor_Tensor, random=True)
def normal_tensor_tensor(mean, std, generator=None, *, key):
    j = jnp()
    shape = j.broadcast_shapes(mean.shape, std.shape)
    dt = promote(mean, std)
    z = _normal(key, shape, dt)
    return z * std.astype(z.dtype) + mean.astype(z.dtype)


@lower(aten.normal.float_float, random=True)
def normal_float_float(mean, std, size, generator=None, dtype=None, layout=None, device=None,
                       pin_memory=None, *, key):
    dt = dtype or torch.get_default_dtype()
    z = _normal(key, size, dt)
    if dt.is_complex:  # as normal_: mean is added to both parts
        return z * jnp().asarray(std, z.real.dtype) + jnp().asarray(complex(mean, mean), z.dtype)
    return z * jnp().asarray(std, z.dtype) + jnp().asarray(mean, z.dtype)


@lower(aten.log_normal.default, random=True)
def log_normal(x, mean=1.0, std=2.0, generator=None, *, key):
    dt = tdtype(x)
    _check_float("log_normal_", dt)
    z = _normal(key, x.shape, dt)
    return jnp().exp(z * jnp().asarray(std, z.dtype) + jnp().asarray(mean, z.dtype))


@lower(aten.exponential.default, random=True)
def exponential(x, lambd=1.0, generator=None, *, key):
    dt = tdtype(x)
    _check_float("exponential_", dt)
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    e = _jr().exponential(prng_key(key), tuple(x.shape), _sample_dtype(dt))
    return e / jnp().asarray(lambd, e.dtype)


@lower(aten.cauchy.default, random=True)
def cauchy(x, median=0.0, sigma=1.0, generator=None, *, key):
    dt = tdtype(x)
    _check_float("cauchy_", dt)
    c = _jr().cauchy(prng_key(key), tuple(x.shape), _sample_dtype(dt))
    return c * jnp().asarray(sigma, c.dtype) + jnp().asarray(median, c.dtype)


@lower(aten.geometric.default, random=True)
def geometric(x, p, generator=None, *, key):
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    j = jnp()
    u = _jr().uniform(prng_key(key), tuple(x.shape), npdt(torch.float64),
                      minval=float(np.finfo(np.float64).tiny), maxval=1.0)
    return j.ceil(j.log(u) / j.log1p(-p))


# ------------------------------------------------------------------------ bernoulli


_P_IN_MSG = ("Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could this error "
             "message be improved?  If so, please report an enhancement request to PyTorch.)")


def _check_p(p):
    """CPU raises for probabilities outside [0, 1] (NaN included): a device-side check."""
    _checks.check(~((p >= 0) & (p <= 1)), RuntimeError, _P_IN_MSG)


def _bernoulli(key, shape, p, dtype):
    u = _uniform(key, shape, dtype if dtype.is_floating_point else torch.float64)
    return u < p


@lower(aten.bernoulli.default, random=True)
def bernoulli(x, generator=None, *, key):
    dt = tdtype(x)
    if not dt.is_floating_point:  # CPU's dispatch errors
        kernel = "bernoulli_tensor_cpu_self_" if dt.is_complex else "bernoulli_tensor_cpu_p_"
        raise NotImplementedError(
            f'"{kernel}" not implemented for \'{scalar_type_name(dt)}\'')
    _check_p(x)
    return _bernoulli(key, x.shape, x.astype(_sample_dtype(dt)), dt)


@lower(aten.bernoulli.p, random=True)
def bernoulli_p(x, p=0.5, generator=None, *, key):
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    return _bernoulli(key, x.shape, p, torch.float64)


@lower(aten.bernoulli.Tensor, random=True)
def bernoulli_tensor(x, p, generator=None, *, key):
    _check_p(p)
    p = jnp().broadcast_to(p.astype(npdt(torch.float64)), x.shape)
    return _bernoulli(key, x.shape, p, torch.float64)


# --------------------------------------------------------------------------- random_


def _random_max(dtype: torch.dtype) -> int:
    """Inclusive upper bound of ``random_()`` without ``to``: 2**digits for floats."""
    if dtype is torch.bool:
        return 1
    if dtype.is_floating_point:
        return 2 ** {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24,
                     torch.float64: 53}[dtype]
    return int(torch.iinfo(dtype).max)


def check_order(lo: int, hi_excl: int) -> None:
    """CPU's ``random_(from, to)`` check that ``from < to`` (RuntimeError, its message)."""
    if hi_excl <= lo:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={lo} "
                           f">= to={hi_excl}")


def _randint(key, shape, lo: int, hi_incl: int, dtype: torch.dtype):
    """Uniform integers in [lo, hi_incl] (drawn as int64), as ``dtype``."""
    check_order(lo, hi_incl + 1)
    i64 = npdt(torch.int64)
    # maxval is exclusive; int64's largest value itself is never drawn (1 in 2**63)
    hi_excl = min(hi_incl + 1, 2**63 - 1)
    v = _jr().randint(prng_key(key), tuple(shape), jnp().asarray(lo, i64),
                      jnp().asarray(hi_excl, i64), dtype=i64)
    return v.astype(npdt(dtype))


# the C++ type names CPU's random_ checks print (typeid names on Linux)
_RANDOM_TYPE_NAMES = {torch.int8: "signed char", torch.uint8: "unsigned char",
                      torch.int16: "short int", torch.int32: "int", torch.int64: "long",
                      torch.bool: "bool", torch.float16: "c10::Half",
                      torch.bfloat16: "c10::BFloat16", torch.float32: "float",
                      torch.float64: "double"}


def _check_range(dtype, lo, hi_incl):
    """CPU's ``random_(from, to)`` checks: ``from`` and ``to - 1`` within the dtype's range
    (raise), and for floating dtypes a warning beyond ±2**digits, where not every integer
    is representable."""
    name = _RANDOM_TYPE_NAMES.get(dtype, str(dtype))
    if dtype is torch.bool:
        mn, mx = 0, 1
    elif dtype.is_floating_point:
        mn, mx = float(torch.finfo(dtype).min), float(torch.finfo(dtype).max)
    else:
        mn, mx = int(torch.iinfo(dtype).min), int(torch.iinfo(dtype).max)
    if lo < mn or lo > mx:
        raise RuntimeError(f"from is out of bounds for {name}")
    if hi_incl > mx or hi_incl < mn:
        raise RuntimeError(f"to - 1 is out of bounds for {name}")
    if dtype.is_floating_point:
        digits = _random_max(dtype).bit_length() - 1
        for what, v in (("from", lo), ("to - 1", hi_incl)):
            if not -(2 ** digits) <= v <= 2 ** digits:
                warnings.warn(
                    f"{what} is out of bounds [-(2^{digits}), 2^{digits}]. Due to precision "
                    f"limitations {name} can support discrete uniform distribution only within "
                    f"this range. This warning will become an error in version 1.7 release, "
                    f"please fix the code in advance", UserWarning, stacklevel=2)


@lower(aten.random.default, random=True)
def random_default(x, generator=None, *, key):
    dt = tdtype(x)
    return _randint(key, x.shape, 0, _random_max(dt), dt)


@lower(getattr(aten.random, "from"), random=True)
def random_from(x, low, high=None, generator=None, *, key):
    dt = tdtype(x)
    hi = _random_max(dt) if high is None else high - 1
    if high is None and not dt.is_floating_point and dt is not torch.bool:
        hi = int(torch.iinfo(dt).max)
    _check_range(dt, low, hi)
    return _randint(key, x.shape, low, hi, dt)


@lower(aten.random.to, random=True)
def random_to(x, high, generator=None, *, key):
    dt = tdtype(x)
    _check_range(dt, 0, high - 1)
    return _randint(key, x.shape, 0, high - 1, dt)


# ------------------------------------------------------------------------- randperm


@lower(aten.randperm.default, random=True)
def randperm(n, dtype=None, layout=None, device=None, pin_memory=None, *, key):
    return randperm_generator(n, None, dtype, key=key)


@lower(aten.randperm.generator, random=True)
def randperm_generator(n, generator=None, dtype=None, layout=None, device=None,
                       pin_memory=None, *, key):
    if n < 0:
        raise RuntimeError(f"n must be non-negative, got{n}")
    dt = _as_dtype(dtype) or torch.int64
    if not dt.is_floating_point and dt is not torch.bool and n > 0:
        if n - 1 > torch.iinfo(dt).max:
            raise RuntimeError(f"n is too large for result tensor type: '{dt}'")
    return _jr().permutation(prng_key(key), n).astype(npdt(dt))


def _as_dtype(dtype):
    from torchtpu.ops.factory import as_dtype

    return as_dtype(dtype)


# -------------------------------------------------------------------------- dropout


@lower(aten.native_dropout.default, random=True)
def native_dropout(x, p, train=None, *, key):
    j = jnp()
    dt = tdtype(x)
    if train is False:
        return x, j.ones(x.shape, bool)
    if not 0 <= p <= 1:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {p}")
    u = _uniform(key, x.shape, dt if dt.is_floating_point else torch.float32)
    mask = u < (1.0 - p)  # bernoulli_(1 - p): keep
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    ct = npdt(opmath(dt))
    return (x.astype(ct) * mask.astype(ct) * j.asarray(scale, ct)).astype(x.dtype), mask


# ---------------------------------------------------------------------- multinomial


@lower(aten.multinomial.default, random=True)
def multinomial(probs, num_samples, replacement=False, generator=None, *, key):
    j = jnp()
    jr = _jr()
    if probs.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    n_cat = probs.shape[-1]
    if not replacement and num_samples > n_cat:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    p2 = probs.reshape(-1, n_cat).astype(npdt(torch.float64))
    # CPU's checks of the distribution, as device-side checks (CUDA asserts)
    _checks.check(~j.isfinite(p2) | (p2 < 0), RuntimeError,
                  "probability tensor contains either `inf`, `nan` or element < 0")
    _checks.check(j.sum(j.where(j.isfinite(p2), p2, 0), axis=-1) <= 0, RuntimeError,
                  "invalid multinomial distribution (sum of probabilities <= 0)")
    logp = j.where(p2 > 0, j.log(j.where(p2 > 0, p2, 1.0)), -j.inf)
    k = prng_key(key)
    rows = p2.shape[0]
    if replacement:
        out = jr.categorical(k, logp[:, None, :], axis=-1, shape=(rows, num_samples))
    else:
        # Gumbel top-k: the order of the perturbed log-probabilities is a draw
        # without replacement (categories of probability 0 come last).
        g = jr.gumbel(k, (rows, n_cat), npdt(torch.float64))
        _, out = runtime.jax().lax.top_k(logp + g, num_samples)
    out = out.astype(npdt(torch.int64))
    return out.reshape(probs.shape[:-1] + (num_samples,))


# ------------------------------------------------ gamma / dirichlet / poisson (issue 8)
# torch.distributions Gamma, Beta, Dirichlet, Poisson sample with these.  The draws follow
# JAX's generator (not CPU's stream); the deterministic parts (clamping, the
# reparameterization gradient) are CPU's.


# Meta kernels PyTorch lacks (the executor reads output shapes/dtypes from them).
_META_LIB = torch.library.Library("aten", "IMPL")


def _meta_like_broadcast(a, b):
    return torch.empty(torch.broadcast_shapes(a.shape, b.shape), dtype=a.dtype, device="meta")


_META_LIB.impl("_standard_gamma_grad", _meta_like_broadcast, "Meta")
_META_LIB.impl("_sample_dirichlet", lambda a, generator=None: torch.empty_like(a), "Meta")


def _tiny(dtype: torch.dtype):
    return float(torch.finfo(dtype).tiny)


@lower(aten._standard_gamma.default, random=True)
def _standard_gamma(alpha, generator=None, *, key):
    """Gamma(alpha, 1) draws of ``alpha``'s shape and dtype, clamped below at the dtype's
    smallest normal number, as CPU's ``_standard_gamma`` (so ``log`` of a draw is finite).
    Half types draw in float32 (CUDA's accumulate type)."""
    dt = tdtype(alpha)
    _check_float("_standard_gamma", dt)
    ct = _sample_dtype(dt)
    g = _jr().gamma(prng_key(key), alpha.astype(ct), tuple(alpha.shape), ct)
    return jnp().maximum(g, jnp().asarray(_tiny(dt), ct)).astype(npdt(dt))


@lower(aten._sample_dirichlet.default, random=True)
def _sample_dirichlet(alpha, generator=None, *, key):
    """Dirichlet(alpha) draws over the last dim: Gamma(alpha) draws normalized, computed
    from log-gamma draws in float64 (no underflow for tiny concentrations), each value
    clamped below at the dtype's smallest normal number, as CPU's ``_sample_dirichlet``."""
    j = jnp()
    dt = tdtype(alpha)
    _check_float("_sample_dirichlet", dt)
    f64 = npdt(torch.float64)
    lg = _jr().loggamma(prng_key(key), alpha.astype(f64), tuple(alpha.shape), f64)
    lse = runtime.jax().nn.logsumexp(lg, axis=-1, keepdims=True)
    out = j.exp(lg - lse)
    return j.maximum(out, j.asarray(_tiny(dt), f64)).astype(npdt(dt))


@lower(aten.poisson.default, random=True)
def poisson(rate, generator=None, *, key):
    """Poisson(rate) counts as floats of ``rate``'s dtype (0 where rate is 0)."""
    j = jnp()
    dt = tdtype(rate)
    _check_float("poisson", dt)
    ct = _sample_dtype(dt)
    lam = rate.astype(ct)
    n = _jr().poisson(threefry_key(key), lam, tuple(rate.shape), dtype=npdt(torch.int64))
    return j.where(lam > 0, n, 0).astype(npdt(dt))


@lower(aten._standard_gamma_grad.default)
def _standard_gamma_grad(alpha, x):
    """d x / d alpha of a Gamma(alpha) draw ``x`` (implicit reparameterization,
    ``-(d/dalpha cdf(x; alpha)) / pdf(x; alpha)``), with CPU's approximation:
    a Taylor series for x < 0.8, Rice's saddle point expansion for alpha > 8, else a
    bivariate rational fit; computed in float64 as CPU's kernel."""
    jax = runtime.jax()
    j = jnp()
    dt = tdtype(alpha)
    f64 = npdt(torch.float64)
    a = alpha.astype(f64)
    x = x.astype(f64)
    # Taylor series (x < 0.8)
    numer = j.ones_like(x)
    denom = a
    s1 = numer / denom
    s2 = numer / (denom * denom)
    for i in range(1, 6):
        numer = numer * (-x / i)
        denom = denom + 1
        s1 = s1 + numer / denom
        s2 = s2 + numer / (denom * denom)
    pxa = j.power(x, a)
    pdf = j.power(x, a - 1) * j.exp(-x)
    cdf = pxa * s1
    cdf_a = (j.log(x) - jax.scipy.special.digamma(a)) * cdf - pxa * s2
    small = -cdf_a / pdf
    small = j.where(j.isnan(small), 0.0, small)
    # Rice saddle point (alpha > 8)
    near = (0.9 * a <= x) & (x <= 1.1 * a)
    n1 = 1 + 24 * a * (1 + 12 * a)
    n2 = 1440 * (a * a) + 6 * x * (53 - 120 * x) - 65 * x * x / a + a * (107 + 3600 * x)
    near_v = n1 * n2 / (1244160 * (a * a) * (a * a))
    den = j.sqrt(8 * a)
    t2 = den / (a - x)
    t3 = j.power(x - a - a * j.log(x / a), -1.5)
    t23 = j.where(x < a, t2 - t3, t2 + t3)
    t1 = j.log(x / a) * t23 - j.sqrt(2 / a) * (a + x) / ((a - x) * (a - x))
    stirling = 1 + 1 / (12 * a) * (1 + 1 / (24 * a))
    far_v = -stirling * (x * t1) / den
    large = j.where(near, near_v, far_v)
    # bivariate rational approximation
    u = j.log(x / a)
    v = j.log(a)
    c = np.array(_GAMMA_GRAD_COEF)
    cv = [c[0, i] + u * (c[1, i] + u * c[2, i]) for i in range(8)]
    p = cv[0] + v * (cv[1] + v * (cv[2] + v * cv[3]))
    q = cv[4] + v * (cv[5] + v * (cv[6] + v * cv[7]))
    mid = j.exp(p / q)
    out = j.where(x < 0.8, small, j.where(a > 8.0, large, mid))
    return out.astype(npdt(dt))


_GAMMA_GRAD_COEF = (
    (0.16009398, -0.094634809, 0.025146376, -0.0030648343,
     1, 0.32668115, 0.10406089, 0.0014179084),
    (0.53487893, 0.1298071, 0.065735949, -0.0015649758,
     0.16639465, 0.020070113, -0.0035938915, -0.00058392623),
    (0.040121004, -0.0065914022, -0.0026286047, -0.0013441777,
     0.017050642, -0.0021309326, 0.00085092367, -1.5247877e-07),
)


# --------------------------------------------------------------------------- rrelu


@scalar_check
def _rrelu_checks(vals):
    lo, hi = vals[2], vals[3]
    if not isinstance(lo, torch.Tensor) and not isinstance(hi, torch.Tensor) and lo > hi:
        raise RuntimeError("Lower bound should be less than or equal to the upper bound")
    return vals


@lower(aten.rrelu_with_noise_functional.default, random=True, static_scalars=True,
       prepare=_rrelu_checks)
def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1.0 / 3.0, training=False,
                                generator=None, *, key):
    """``F.rrelu``: training: ``x * r`` with ``r ~ U[lower, upper)`` where ``x <= 0``
    (``noise`` = r there, 1 elsewhere), as CPU's ``_rrelu_with_noise_train``; eval:
    ``leaky_relu(x, (lower + upper) / 2)`` with ``noise`` unchanged.  Returns
    ``(out, noise_out)``; floating dtypes only, as CPU."""
    dt = tdtype(x)
    if not dt.is_floating_point:
        raise NotImplementedError(
            f'"rrelu_with_noise_out_cpu" not implemented for \'{scalar_type_name(dt)}\'')
    j = jnp()
    ct = opmath(dt)
    xx = x.astype(npdt(ct))
    if not training:
        slope = j.asarray((lower + upper) / 2, npdt(ct))
        return j.where(xx > 0, xx, xx * slope).astype(x.dtype), noise
    r = _uniform(key, x.shape, dt, float(lower), float(upper)).astype(npdt(dt))
    neg = xx <= 0
    out = j.where(neg, xx * r.astype(npdt(ct)), xx).astype(x.dtype)
    return out, j.where(neg, r, j.ones_like(r)).astype(noise.dtype)


@decomp(aten.rrelu_with_noise.default)
def _rrelu_with_noise(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    out, new_noise = aten.rrelu_with_noise_functional(x, noise, lower, upper, training,
                                                      generator=generator)
    if training:
        noise.copy_(new_noise)
    return out


@decomp(aten.rrelu_with_noise_.default)
def _rrelu_with_noise_(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    return x.copy_(_rrelu_with_noise(x, noise, lower, upper, training, generator))
