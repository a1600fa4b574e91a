"""Signed zeros (and NaN) of clamp-like, max/min and activation ops, bit for bit against CPU.

XLA's ``max``/``min`` return +0.0 for ``max(-0.0, 0.0)`` (and -0.0 for ``min``) whatever
the operand order; PyTorch's CPU kernels are written as ``x < lo ? lo : x``
(``std::max(x, lo)``), so a tie keeps ``x`` and its sign: ``clamp(-0.0, min=0.0)`` is
-0.0 and ``relu(-0.0)`` is -0.0.  Every comparison here checks values, the sign bit of
every non-NaN element and the NaN positions.

Two references:

* ``cpu_whole``: the op on CPU on the same tensors.  For ops whose CPU kernel gives the
  same answer at every position (scalar-bound ``clamp``, ``relu``, ``hardtanh``,
  ``threshold``, ``fmax``, ``max.dim``, ``cummax``, adaptive max pooling, scatter
  ``amax``/``amin``...).
* ``cpu_scalar_kernel``: the op on CPU one element at a time (1-element tensors).  For
  ops with a tensor "other" (``maximum``/``minimum``, ``clamp.Tensor``,
  ``clamp_min.Tensor``...) CPU's answer on a ±0.0 tie depends on the element's position:
  the SIMD body (``_mm256/_mm512_max_ps(a, b)`` returns ``b`` on a tie) keeps the bound,
  the scalar kernel (``std::max(a, b)``, used for tensors shorter than a vector, the tail
  of a longer one, and strided operands) keeps ``a``.  Which positions take which path
  depends on the CPU's vector width, so the lowering follows the scalar kernel, the same
  rule as the scalar-bound ``clamp`` (a 0-d tensor bound and a Python bound agree).

Not compared here: ``amax``/``amin``/``max()``/``min()``/``aminmax`` over several ±0.0 (CPU
reduces in SIMD lanes, the sign it returns depends on the lane layout and the ISA).
"""

from __future__ import annotations

import math

import _budget
import pytest
import torch
import torch.nn.functional as F

import torchtpu  # noqa: F401

TPU = "tpu"
INF, NAN = math.inf, math.nan
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
# the sweeps over shapes x dims (a new executable each): float32 in the default run
# (make test's time budget), every float dtype with TORCHTPU_FULL_TESTS=1
SWEEP_FLOATS = FLOATS if _budget.FULL else [torch.float32]
INTS = [torch.int32, torch.int64, torch.uint8]

# every bound used below appears in X exactly
X_VALS = [-INF, -7.0, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 6.0, 7.0, INF, NAN]
GRID = [-INF, -1.0, -0.0, 0.0, 1.0, INF, NAN]


def _x(dt, vals=X_VALS):
    return torch.tensor(vals, dtype=torch.float64).to(dt)


def _pairs(dt):
    a = [p for p in GRID for _ in GRID]
    b = [q for _ in GRID for q in GRID]
    return _x(dt, a), _x(dt, b)


def _fmt(t):
    return [("-0.0" if v == 0 and math.copysign(1, v) < 0 else repr(v))
            for v in t.double().flatten().tolist()]


def assert_bitwise(tpu, cpu, what=""):
    """Same dtype, shape, NaN positions, values and sign bits (NaNs' signs aside)."""
    if isinstance(cpu, (tuple, list)):
        assert len(tpu) == len(cpu)
        for i, (t, c) in enumerate(zip(tpu, cpu)):
            assert_bitwise(t, c, f"{what}[{i}]")
        return
    t = tpu.cpu()
    assert t.dtype == cpu.dtype and t.shape == cpu.shape, (what, t.dtype, cpu.dtype, t.shape)
    if cpu.is_floating_point():
        tn, cn = torch.isnan(t), torch.isnan(cpu)
        ok = torch.equal(tn, cn)
        if ok:
            ok = (torch.equal(t[~tn], cpu[~cn])
                  and torch.equal(torch.signbit(t[~tn]), torch.signbit(cpu[~cn])))
    else:
        ok = torch.equal(t, cpu)
    assert ok, f"{what}\n tpu {_fmt(t)}\n cpu {_fmt(cpu)}"


def _tpu(args):
    return [a.to(TPU) if isinstance(a, torch.Tensor) else a for a in args]


def cpu_whole(fn, *args, what=""):
    assert_bitwise(fn(*_tpu(args)), fn(*args), what)


def cpu_scalar_kernel(fn, *args, what=""):
    """CPU reference computed element by element (CPU's scalar kernel, see the module
    docstring); the tensor arguments are 1-D of one length."""
    n = next(a.numel() for a in args if isinstance(a, torch.Tensor))
    ref = torch.cat([fn(*[a[i:i + 1] if isinstance(a, torch.Tensor) else a for a in args])
                     for i in range(n)])
    assert_bitwise(fn(*_tpu(args)), ref, what)


# ------------------------------------------------------------------ clamp, scalar bounds

LOWS = [0.0, -0.0, 1.0, -1.0, -INF]
HIGHS = [0.0, -0.0, -1.0, 1.0, INF]
BOTH = [(0.0, 0.0), (-0.0, -0.0), (-0.0, 0.0), (0.0, -0.0), (-1.0, 0.0), (-1.0, -0.0),
        (0.0, 1.0), (-0.0, 6.0), (1.0, -1.0), (1.0, 0.0), (-INF, INF)]


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_clamp_scalar_bounds(dt):
    x = _x(dt)
    for lo in LOWS:
        cpu_whole(lambda t: torch.clamp(t, min=lo), x, what=f"clamp(min={lo})")
        cpu_whole(lambda t: torch.clamp_min(t, lo), x, what=f"clamp_min({lo})")
        cpu_whole(lambda t: t.clone().clamp_min_(lo), x, what=f"clamp_min_({lo})")
    for hi in HIGHS:
        cpu_whole(lambda t: torch.clamp(t, max=hi), x, what=f"clamp(max={hi})")
        cpu_whole(lambda t: torch.clamp_max(t, hi), x, what=f"clamp_max({hi})")
        cpu_whole(lambda t: t.clone().clamp_max_(hi), x, what=f"clamp_max_({hi})")
    for lo, hi in BOTH:
        cpu_whole(lambda t: torch.clamp(t, lo, hi), x, what=f"clamp({lo}, {hi})")
        cpu_whole(lambda t: torch.clip(t, lo, hi), x, what=f"clip({lo}, {hi})")
        cpu_whole(lambda t: t.clone().clamp_(lo, hi), x, what=f"clamp_({lo}, {hi})")
        cpu_whole(lambda t: torch.clamp(t, lo, hi, out=torch.empty_like(t)), x,
                  what=f"clamp(out=)({lo}, {hi})")


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_clamp_nan_bounds(dt):
    x = _x(dt)
    cpu_whole(lambda t: torch.clamp(t, min=NAN), x, what="clamp(min=nan)")
    cpu_whole(lambda t: torch.clamp(t, max=NAN), x, what="clamp(max=nan)")
    cpu_whole(lambda t: torch.clamp(t, -0.0, NAN), x, what="clamp(-0.0, nan)")


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_clamp_longer_than_a_vector(dt):
    """CPU's SIMD body and scalar tail agree for scalar bounds: 70 elements of each."""
    for v in (-0.0, 0.0):
        x = torch.full((70,), v, dtype=dt)
        for lo, hi in [(0.0, None), (-0.0, None), (None, 0.0), (None, -0.0), (0.0, -0.0),
                       (-0.0, 0.0)]:
            cpu_whole(lambda t: torch.clamp(t, lo, hi), x, what=f"clamp({v}: {lo}, {hi})")
        cpu_whole(torch.relu, x, what=f"relu({v})")


# ------------------------------------------------------------------ clamp, tensor bounds

@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_clamp_tensor_bounds(dt):
    a, b = _pairs(dt)
    cpu_scalar_kernel(lambda t, m: torch.clamp(t, min=m), a, b, what="clamp(min=T)")
    cpu_scalar_kernel(lambda t, m: torch.clamp(t, max=m), a, b, what="clamp(max=T)")
    cpu_scalar_kernel(torch.clamp_min, a, b, what="clamp_min.Tensor")
    cpu_scalar_kernel(torch.clamp_max, a, b, what="clamp_max.Tensor")
    cpu_scalar_kernel(lambda t, m: t.clone().clamp_min_(m), a, b, what="clamp_min_.Tensor")
    cpu_scalar_kernel(lambda t, m: t.clone().clamp_(max=m), a, b, what="clamp_(max=T)")
    cpu_scalar_kernel(lambda t, m: torch.clamp(t, min=m, out=torch.empty_like(t)), a, b,
                      what="clamp(min=T, out=)")
    # both bounds: x against (lo, hi) = (b, b), (b, -b), (-b, b)
    cpu_scalar_kernel(lambda t, m: torch.clamp(t, m, m), a, b, what="clamp(T, T)")
    cpu_scalar_kernel(lambda t, m: torch.clamp(t, m, -m), a, b, what="clamp(T, -T)")
    cpu_scalar_kernel(lambda t, m: torch.clamp(t, -m, m), a, b, what="clamp(-T, T)")


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_clamp_zero_dim_tensor_bound_agrees_with_scalar(dt):
    x = _x(dt)
    for lo in (0.0, -0.0):
        bound = torch.tensor(lo, dtype=dt)
        cpu_scalar_kernel(lambda t: torch.clamp(t, min=bound.to(t.device)), x,
                          what=f"clamp(min=tensor({lo}))")
        cpu_scalar_kernel(lambda t: torch.clamp(t, max=bound.to(t.device)), x,
                          what=f"clamp(max=tensor({lo}))")
        assert_bitwise(torch.clamp(x.to(TPU), min=bound.to(TPU)), torch.clamp(x, min=lo))
        assert_bitwise(torch.clamp(x.to(TPU), max=bound.to(TPU)), torch.clamp(x, max=lo))


# ------------------------------------------------------------------ maximum / minimum / fmax

@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_maximum_minimum(dt):
    a, b = _pairs(dt)
    cpu_scalar_kernel(torch.maximum, a, b, what="maximum")
    cpu_scalar_kernel(torch.minimum, a, b, what="minimum")
    cpu_scalar_kernel(torch.max, a, b, what="max.other")
    cpu_scalar_kernel(torch.min, a, b, what="min.other")
    cpu_scalar_kernel(lambda p, q: torch.maximum(p, q, out=torch.empty_like(p)), a, b,
                      what="maximum(out=)")
    cpu_scalar_kernel(lambda p, q: p.clone().copy_(torch.minimum(p, q)), a, b,
                      what="minimum copy")


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_fmax_fmin(dt):
    """CPU's fmax/fmin give the same answer at every position: the first operand on a
    ±0.0 tie for float32/float64/float16, the second for bfloat16."""
    a, b = _pairs(dt)
    cpu_whole(torch.fmax, a, b, what="fmax")
    cpu_whole(torch.fmin, a, b, what="fmin")
    cpu_scalar_kernel(torch.fmax, a, b, what="fmax scalar kernel")
    n = 70
    z, nz = torch.zeros(n, dtype=dt), torch.full((n,), -0.0, dtype=dt)
    for p, q in [(z, nz), (nz, z)]:
        cpu_whole(torch.fmax, p, q, what="fmax 70")
        cpu_whole(torch.fmin, p, q, what="fmin 70")


# ------------------------------------------------------------------ activations

@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_relu_family(dt):
    x = _x(dt)
    cpu_whole(torch.relu, x, what="relu")
    cpu_whole(lambda t: t.clone().relu_(), x, what="relu_")
    cpu_whole(lambda t: F.relu(t.clone(), inplace=True), x, what="F.relu(inplace)")
    cpu_whole(F.relu6, x, what="relu6")
    cpu_whole(lambda t: F.relu6(t.clone(), inplace=True), x, what="relu6(inplace)")
    for lo, hi in [(-1.0, 1.0), (0.0, 6.0), (-0.0, 0.0), (0.0, 0.0), (-0.0, -0.0),
                   (-0.0, 1.0), (-1.0, -0.0), (0.0, -0.0)]:
        cpu_whole(lambda t: F.hardtanh(t, lo, hi), x, what=f"hardtanh({lo}, {hi})")
        cpu_whole(lambda t: F.hardtanh(t.clone(), lo, hi, inplace=True), x,
                  what=f"hardtanh_({lo}, {hi})")
    for th, v in [(0.0, 0.0), (-0.0, -0.0), (0.0, -0.0), (-0.0, 0.0), (1.0, -0.0),
                  (-1.0, 7.0)]:
        cpu_whole(lambda t: F.threshold(t, th, v), x, what=f"threshold({th}, {v})")
        cpu_whole(lambda t: F.threshold(t.clone(), th, v, inplace=True), x,
                  what=f"threshold_({th}, {v})")
    for s in (0.01, 0.0, -0.0, 1.0, -1.0):
        cpu_whole(lambda t: F.leaky_relu(t, s), x, what=f"leaky_relu({s})")
    cpu_whole(lambda t: F.rrelu(t, training=False), x, what="rrelu(eval)")
    cpu_whole(F.hardshrink, x, what="hardshrink")
    cpu_whole(lambda t: F.hardshrink(t, 0.0), x, what="hardshrink(0)")
    cpu_whole(F.hardswish, _x(dt, [-4.0, -3.0, -0.0, 0.0, 3.0, NAN]), what="hardswish")


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_elu_family_near_zero(dt):
    # values whose exp/expm1 are exact on both sides: the signs at ±0.0 are the point
    x = _x(dt, [-INF, -0.0, 0.0, 1.0, 2.0, INF, NAN])
    cpu_whole(F.elu, x, what="elu")
    cpu_whole(lambda t: F.elu(t, 0.0), x, what="elu(alpha=0)")
    cpu_whole(F.celu, x, what="celu")
    cpu_whole(F.selu, x, what="selu")
    cpu_whole(lambda t: F.elu(t.clone(), inplace=True), x, what="elu_")


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_softshrink_scalar_kernel(dt):
    """CPU's softshrink SIMD body returns +0.0 inside the band, its scalar kernel
    ``x * 0`` (the sign of x): the lowering follows the scalar kernel."""
    x = _x(dt, [-1.0, -0.5, -0.25, -0.0, 0.0, 0.25, 0.5, 1.0, NAN, INF, -INF])
    cpu_scalar_kernel(F.softshrink, x, what="softshrink")
    cpu_scalar_kernel(lambda t: F.softshrink(t, 0.0), x, what="softshrink(0)")


# ------------------------------------------------------------------ integers unaffected

@pytest.mark.parametrize("dt", INTS, ids=str)
def test_integers(dt):
    vals = [0, 1, 2, 5, 7] if dt == torch.uint8 else [-7, -1, 0, 1, 2, 5, 7]
    x = torch.tensor(vals, dtype=dt)
    y = x.flip(0)
    cpu_whole(lambda t: torch.clamp(t, 1, 5), x, what="clamp")
    cpu_whole(lambda t: torch.clamp(t, min=2), x, what="clamp(min)")
    cpu_whole(lambda t, u: torch.clamp(t, min=u), x, y, what="clamp(min=T)")
    cpu_whole(lambda t, u: torch.clamp(t, u, u + 1), x, y, what="clamp(T, T)")
    cpu_whole(torch.relu, x, what="relu")
    cpu_whole(torch.maximum, x, y, what="maximum")
    cpu_whole(torch.minimum, x, y, what="minimum")
    cpu_whole(torch.fmax, x, y, what="fmax")
    cpu_whole(torch.fmin, x, y, what="fmin")
    cpu_whole(lambda t: tuple(torch.max(t.view(1, -1), 1)), x, what="max.dim")
    cpu_whole(lambda t: tuple(torch.cummax(t, 0)), x, what="cummax")
    cpu_whole(lambda t: tuple(torch.cummin(t, 0)), x, what="cummin")


# ------------------------------------------------------------------ reductions with an index

def _zeros_pattern(dt, shape, seed):
    g = torch.Generator().manual_seed(seed)
    choice = torch.tensor([-0.0, 0.0, -0.0, 0.0, -1.0, 1.0, NAN, -INF], dtype=torch.float64)
    k = 8 if seed % 3 == 0 else 4   # every third pattern with NaN and -inf
    idx = torch.randint(0, k, shape, generator=g)
    return choice[idx].to(dt)


@pytest.mark.parametrize("dt", SWEEP_FLOATS, ids=str)
def test_max_min_dim_value_of_first_index(dt):
    """CPU's max.dim/min.dim return the element at the first extreme index (its sign)."""
    for seed, shape in enumerate([(4, 9), (3, 70), (70, 3), (2, 3, 5)]):
        x = _zeros_pattern(dt, shape, seed)
        for d in range(-1, x.ndim):
            for keep in (False, True):
                cpu_whole(lambda t: tuple(torch.max(t, d, keepdim=keep)), x,
                          what=f"max.dim {shape} {d} {keep}")
                cpu_whole(lambda t: tuple(torch.min(t, d, keepdim=keep)), x,
                          what=f"min.dim {shape} {d} {keep}")


@pytest.mark.parametrize("dt", SWEEP_FLOATS, ids=str)
def test_cummax_cummin(dt):
    for seed, shape in enumerate([(4, 9), (3, 70), (2, 3, 5)]):
        x = _zeros_pattern(dt, shape, seed + 10)
        for d in range(x.ndim):
            cpu_whole(lambda t: tuple(torch.cummax(t, d)), x, what=f"cummax {shape} {d}")
            cpu_whole(lambda t: tuple(torch.cummin(t, d)), x, what=f"cummin {shape} {d}")
    x = _x(dt, [-0.0, 0.0, -0.0, 1.0, -0.0, NAN, 0.0])
    cpu_whole(lambda t: tuple(torch.cummax(t, 0)), x, what="cummax")
    cpu_whole(lambda t: tuple(torch.cummin(-t, 0)), x, what="cummin")


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_max_pools_value_of_first_index(dt):
    x = _zeros_pattern(dt, (2, 3, 8, 8), 3 if dt == torch.float32 else 1)
    cpu_whole(lambda t: tuple(F.adaptive_max_pool2d(t, 3, return_indices=True)), x,
              what="adaptive_max_pool2d")
    cpu_whole(lambda t: tuple(F.adaptive_max_pool1d(t.flatten(2), 5, return_indices=True)),
              x, what="adaptive_max_pool1d")
    cpu_whole(lambda t: tuple(F.adaptive_max_pool3d(t, (1, 3, 3), return_indices=True)), x,
              what="adaptive_max_pool3d")
    cpu_whole(lambda t: tuple(F.max_pool2d(t, 2, return_indices=True)), x, what="max_pool2d")
    cpu_whole(lambda t: F.max_pool2d(t, 3, 1, 1), x, what="max_pool2d(3, 1, 1)")


# ------------------------------------------------------------------ gradients

def _grad(fn, x, *others):
    """Gradients of ``fn(x, *others)`` with an upstream gradient of distinct values."""
    x = x.detach().clone().requires_grad_(True)
    others = [o.detach().clone().requires_grad_(True) for o in others]
    y = fn(x, *others)
    g = torch.linspace(-3, 3, y.numel(), dtype=torch.float64).to(y.dtype).view(y.shape)
    g = g.to(y.device)
    ins = [x, *others]
    return torch.autograd.grad(y, ins, g)


GRAD_FNS = {
    "clamp(min=0)": lambda t: torch.clamp(t, min=0.0),
    "clamp(min=-0)": lambda t: torch.clamp(t, min=-0.0),
    "clamp(max=-0)": lambda t: torch.clamp(t, max=-0.0),
    "clamp(-1, 1)": lambda t: torch.clamp(t, -1.0, 1.0),
    "clamp(0, 0)": lambda t: torch.clamp(t, 0.0, 0.0),
    "clamp_min(0)": lambda t: torch.clamp_min(t, 0.0),
    "clamp_max(1)": lambda t: torch.clamp_max(t, 1.0),
    "relu": torch.relu,
    "relu6": F.relu6,
    "hardtanh(-1, 1)": F.hardtanh,
    "hardtanh(-0, 0)": lambda t: F.hardtanh(t, -0.0, 0.0),
    "threshold(0, 0)": lambda t: F.threshold(t, 0.0, 0.0),
    "threshold(-0, 5)": lambda t: F.threshold(t, -0.0, 5.0),
    "threshold(1, -1)": lambda t: F.threshold(t, 1.0, -1.0),
    "leaky_relu": F.leaky_relu,
    "elu": F.elu,
    "celu": F.celu,
    "selu": F.selu,
    "softshrink": F.softshrink,
    "hardshrink": F.hardshrink,
}


@pytest.mark.parametrize("dt", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(GRAD_FNS))
def test_backward_at_signed_zeros_and_bounds(dt, name):
    x = _x(dt, [-7.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 6.0, 7.0, NAN])
    if name in ("elu", "celu", "selu"):  # no exp of a non-zero negative (an ulp apart)
        x = _x(dt, [-INF, -0.0, 0.0, 0.5, 1.0, 6.0, NAN])
    fn = GRAD_FNS[name]
    assert_bitwise(_grad(fn, x.to(TPU)), _grad(fn, x), name)


@pytest.mark.parametrize("dt", [torch.float32, torch.float64], ids=str)
def test_backward_tensor_bounds(dt):
    a, b = _pairs(dt)
    for name, fn in {
        "clamp(min=T)": lambda t, m: torch.clamp(t, min=m),
        "clamp(max=T)": lambda t, m: torch.clamp(t, max=m),
        "clamp(T, T)": lambda t, m: torch.clamp(t, m, m),
        "maximum": torch.maximum,
        "minimum": torch.minimum,
        "fmax": torch.fmax,
        "fmin": torch.fmin,
    }.items():
        assert_bitwise(_grad(fn, a.to(TPU), b.to(TPU)), _grad(fn, a, b), name)


@pytest.mark.parametrize("dt", [torch.float32, torch.float64], ids=str)
def test_backward_max_dim_cummax(dt):
    x = _zeros_pattern(dt, (4, 9), 1)
    for name, fn in {
        "max.dim": lambda t: torch.max(t, 1).values,
        "min.dim": lambda t: torch.min(t, 0).values,
        "cummax": lambda t: torch.cummax(t, 1).values,
        "cummin": lambda t: torch.cummin(t, 0).values,
        "adaptive_max_pool1d": lambda t: F.adaptive_max_pool1d(t[None], 4),
    }.items():
        assert_bitwise(_grad(fn, x.to(TPU)), _grad(fn, x), name)


# ------------------------------------------------------------------ scatter amax / amin

def _scatter_case(dt, seed, shape, dim, n_src):
    g = torch.Generator().manual_seed(seed)
    choice = torch.tensor([-0.0, 0.0, -0.0, 0.0, -1.0, 1.0], dtype=torch.float64)
    ishape = list(shape)
    ishape[dim] = n_src
    src = choice[torch.randint(0, 6, ishape, generator=g)].to(dt)
    base = choice[torch.randint(0, 6, shape, generator=g)].to(dt)
    index = torch.randint(0, shape[dim], ishape, generator=g)
    return base, index, src


@pytest.mark.parametrize("dt", SWEEP_FLOATS, ids=str)
def test_scatter_reduce_amax_amin(dt):
    """CPU folds each target's contributors in order (self first when included, then src
    along dim), a tie keeping the earlier one: a zero result has the first zero's sign."""
    for seed, (shape, dim, n) in enumerate([((6,), 0, 9), ((4, 5), 0, 7), ((4, 5), 1, 8),
                                             ((3, 4), 1, 2)]):
        base, index, src = _scatter_case(dt, seed, shape, dim, n)
        for red in ("amax", "amin"):
            for inc in (True, False):
                cpu_whole(lambda b, i, s: b.scatter_reduce(dim, i, s, red, include_self=inc),
                          base, index, src, what=f"scatter_reduce {shape} {dim} {red} {inc}")
    base, _, src = _scatter_case(dt, 7, (4, 3), 0, 9)
    index = torch.tensor([0, 2, 0, 1, 2, 2, 0, 1, 0])
    for red in ("amax", "amin"):
        for inc in (True, False):
            cpu_whole(lambda b, i, s: b.index_reduce(0, i, s, red, include_self=inc),
                      base, index, src, what=f"index_reduce {red} {inc}")
    x = _x(dt, [NAN, -0.0, 0.0, 1.0])
    cpu_whole(lambda b, i, s: b.scatter_reduce(0, i, s, "amax"), x,
              torch.tensor([0, 1, 1, 2, 2, 3]), _x(dt, [-0.0, 0.0, NAN, -0.0, -0.0, 1.0]),
              what="scatter_reduce with NaN")


# ------------------------------------------------------------------ torch.compile

def test_compiled():
    x = _x(torch.float32)
    for name, fn in {
        "relu": torch.relu,
        "clamp(min=0)": lambda t: torch.clamp(t, min=0.0),
        "clamp(max=-0)": lambda t: torch.clamp(t, max=-0.0),
        "relu6": F.relu6,
        "maximum(x, 0)": lambda t: torch.maximum(t, torch.zeros_like(t)),
        "max.dim": lambda t: torch.max(t.view(2, 7), 1),
        "cummax": lambda t: torch.cummax(t, 0),
    }.items():
        assert_bitwise(torch.compile(fn, backend="tpu")(x.to(TPU)), fn(x), name)
