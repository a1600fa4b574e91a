"""Regression tests for lowerings added to raise OpInfo coverage: linalg factorizations and
solves, special functions, median/mode, adaptive max pooling, misc.  Every case runs on
CPU and on tpu and must match in value, dtype and shape (factorizations whose factors are
unique only up to sign are compared the way PyTorch's OpInfos compare them)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torchtpu  # noqa: F401

TPU = "tpu"


def _tpu(v):
    return v.to(TPU) if isinstance(v, torch.Tensor) else v


def _cmp(c, t, atol, rtol):
    if isinstance(c, (tuple, list)):
        assert len(c) == len(t)
        for a, b in zip(c, t):
            _cmp(a, b, atol, rtol)
        return
    if not isinstance(c, torch.Tensor):
        assert c == t
        return
    torch.testing.assert_close(t.cpu(), c, atol=atol, rtol=rtol, equal_nan=True)


def check(fn, *args, atol=1e-5, rtol=1e-5):
    expected = fn(*args)
    actual = fn(*[_tpu(a) for a in args])
    _cmp(expected, actual, atol, rtol)


def _gen(seed=0):
    g = torch.Generator().manual_seed(seed)
    return g


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=_gen(seed), dtype=dtype)


def _spd(n, batch=(), dtype=torch.float32, seed=0):
    a = _randn(*batch, n, n, dtype=dtype, seed=seed)
    return a @ a.mT + n * torch.eye(n, dtype=dtype)


# ------------------------------------------------------------------ LU family


@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (3, 5), (0, 3, 3), (3, 0)])
def test_lu_factor_ex(shape):
    check(torch.linalg.lu_factor_ex, _randn(*shape))


def test_lu_factor_ex_singular_info():
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    check(lambda x: torch.linalg.lu_factor_ex(x)[2], a)


def test_lu_and_unpack():
    a = _randn(2, 5, 3)
    check(torch.linalg.lu, a, atol=1e-5)
    lu, piv = torch.linalg.lu_factor(_randn(4, 4))
    check(torch.lu_unpack, lu, piv)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve(left, adjoint):
    lu, piv = torch.linalg.lu_factor(_randn(2, 4, 4))
    b = _randn(2, 4, 3, seed=1)
    check(lambda l, p, x: torch.linalg.lu_solve(l, p, x, left=left, adjoint=adjoint),
          lu, piv, b if left else b.mT, atol=1e-4, rtol=1e-4)


def test_solve_inv_det():
    a, b = _randn(2, 4, 4), _randn(2, 4, 3, seed=1)
    check(torch.linalg.solve_ex, a, b, atol=1e-4, rtol=1e-4)
    check(torch.linalg.solve, a, _randn(4, seed=2), atol=1e-4, rtol=1e-4)      # vector rhs
    check(lambda x, y: torch.linalg.solve(x, y, left=False), a, b.mT, atol=1e-4, rtol=1e-4)
    check(torch.linalg.inv_ex, a, atol=1e-4, rtol=1e-4)
    check(torch.linalg.det, a, atol=1e-4, rtol=1e-4)
    check(torch.linalg.slogdet, a, atol=1e-4, rtol=1e-4)
    check(torch.linalg.inv, _randn(3, 3, dtype=torch.float64), atol=1e-10, rtol=1e-10)


def test_solve_triangular():
    a = torch.triu(_randn(3, 3)) + 3 * torch.eye(3)
    b = _randn(2, 3, 2, seed=1)
    check(lambda x, y: torch.linalg.solve_triangular(x, y, upper=True), a, b, atol=1e-5)
    check(lambda x, y: torch.linalg.solve_triangular(x, y, upper=True, left=False), a,
          b.mT, atol=1e-5)
    check(lambda x, y: torch.triangular_solve(x, y, upper=True, transpose=True), b, a)


# ------------------------------------------------------------------ Cholesky / QR / eigh / SVD


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(upper):
    p = _spd(4, (2,))
    check(lambda x: torch.linalg.cholesky_ex(x, upper=upper), p, atol=1e-4, rtol=1e-4)
    L = torch.linalg.cholesky(p, upper=upper)
    check(lambda l: torch.cholesky_inverse(l, upper=upper), L, atol=1e-4, rtol=1e-4)
    check(lambda b, l: torch.cholesky_solve(b, l, upper=upper), _randn(2, 4, 2, seed=3), L,
          atol=1e-4, rtol=1e-4)


def test_cholesky_ex_info_not_pd():
    a = torch.tensor([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    check(lambda x: torch.linalg.cholesky_ex(x)[1], a)


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("shape", [(2, 5, 3), (3, 5), (0, 3)])
def test_qr(mode, shape):
    check(lambda x: torch.linalg.qr(x, mode=mode), _randn(*shape), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh(uplo):
    a = _randn(2, 4, 4)  # only the UPLO triangle is read
    check(lambda x: (lambda r: (r[0], r[1].abs()))(torch.linalg.eigh(x, UPLO=uplo)), a,
          atol=1e-4, rtol=1e-4)
    check(lambda x: torch.linalg.eigvalsh(x, UPLO=uplo), a, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("shape", [(2, 5, 3), (3, 5), (0, 3), (3, 0)])
def test_svd(full, shape):
    def f(x):
        U, S, Vh = torch.linalg.svd(x, full_matrices=full)
        k = S.shape[-1]
        return U[..., :k].abs(), S, Vh[..., :k, :].abs()

    check(f, _randn(*shape), atol=1e-4, rtol=1e-4)
    check(torch.linalg.svdvals, _randn(*shape), atol=1e-4, rtol=1e-4)


def test_geqrf_householder_ormqr():
    a = _randn(5, 3)
    check(torch.geqrf, a, atol=1e-5)
    h, tau = torch.geqrf(a)
    check(torch.linalg.householder_product, h, tau, atol=1e-5)
    c = _randn(5, 2, seed=1)
    check(torch.ormqr, h, tau, c, atol=1e-5)
    check(lambda *t: torch.ormqr(*t, transpose=True), h, tau, c, atol=1e-5)
    check(lambda *t: torch.ormqr(*t, left=False), h, tau, c.mT.contiguous(), atol=1e-5)


def test_cross_trace():
    check(torch.linalg.cross, _randn(4, 3), _randn(1, 3, seed=1))
    check(torch.trace, _randn(3, 4))
    check(torch.trace, torch.arange(9).reshape(3, 3))


# ------------------------------------------------------------------ special functions


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
def test_polygamma(n):
    x = torch.tensor([-2.7, -1.3, -0.4, 0.2, 0.5, 1.0, 2.5, 7.0, 30.0])
    check(lambda t: torch.polygamma(n, t), x, atol=1e-5, rtol=1e-4)


def test_zeta_mvlgamma():
    check(torch.special.zeta, torch.tensor([1.0, 1.5, 2.0, 3.0, 4.0, 0.5]),
          torch.tensor([1.0, 2.0, -2.5, -3.0, 0.3, 1.0]), atol=1e-5, rtol=1e-4)
    check(lambda t: torch.mvlgamma(t, 3), torch.tensor([1.5, 2.0, 4.5]), rtol=1e-5)


def test_special_unary():
    x = torch.tensor([-7.0, -1.5, -0.3, 0.0, 0.2, 1.0, 3.0, 12.0])
    for f in (torch.i0, torch.special.i0e, torch.special.i1, torch.special.i1e,
              torch.special.ndtr, torch.special.log_ndtr, torch.special.erfcx,
              torch.special.spherical_bessel_j0, torch.sinc):
        check(f, x, atol=1e-5, rtol=1e-4)
    check(torch.special.ndtri, torch.tensor([0.0, 0.1, 0.5, 0.97, 1.0]), rtol=1e-4)
    check(torch.special.entr, torch.tensor([-1.0, 0.0, 0.5, 2.0, math.nan]))
    check(torch.special.xlog1py, torch.tensor([0.0, 1.0, 2.0]), torch.tensor([-1.0, 0.5, 3.0]))


def test_igamma_frexp_logit():
    a, x = torch.tensor([0.5, 1.0, 3.0, 10.0]), torch.tensor([0.1, 2.0, 3.0, 4.0])
    check(torch.igamma, a, x, rtol=1e-4)
    check(torch.igammac, a, x, rtol=1e-4)
    check(torch.frexp, torch.tensor([0.0, -3.5, 1e-30, 1e30, 7.0]))
    check(torch.logit, torch.tensor([0.0, 0.2, 0.5, 0.9, 1.0]))
    check(lambda t: torch.logit(t, eps=0.1), torch.tensor([0.0, 0.2, 0.95]))


# ------------------------------------------------------------------ reductions / nn / misc


def test_median_mode():
    x = torch.tensor([[3.0, math.nan, 2.0, 1.0, math.nan], [2.0, 2.0, 5.0, 5.0, 1.0]])
    check(lambda t: torch.median(t, 1), x)
    check(lambda t: torch.nanmedian(t, 1), x)
    check(torch.median, x)
    check(torch.nanmedian, x)
    y = torch.tensor([[3, 1, 2, 1, 3, 3, 1], [2, 2, 5, 5, 1, 1, 0]])
    check(lambda t: torch.mode(t, 1), y)
    check(lambda t: torch.mode(t, 1, True), y.float())


def test_norm_dist_equal():
    a, b = _randn(3, 4), _randn(3, 4, seed=1)
    check(lambda t: torch.norm(t, 3, 1), a)
    check(torch.norm, a)
    check(lambda s, o: torch.dist(s, o, 1.5), a, b)
    check(torch.equal, a, b)
    check(torch.equal, a, a.clone())
    check(torch.equal, torch.tensor([math.nan]), torch.tensor([math.nan]))


def test_adaptive_max_pool():
    check(lambda t: F.adaptive_max_pool2d(t, (3, 2), True), _randn(2, 3, 7, 5))
    check(lambda t: F.adaptive_max_pool1d(t, 4, True), _randn(2, 3, 7))
    check(lambda t: F.adaptive_max_pool3d(t, (2, 3, 4), True), _randn(1, 2, 5, 6, 7))
    nan = torch.tensor([[[1.0, math.nan, 3.0, math.nan]]])
    check(lambda t: F.adaptive_max_pool1d(t, 1, True), nan)


def test_shrink_huber_renorm_shuffle():
    x = torch.tensor([-1.0, -0.5, -0.2, 0.3, 0.5, 2.0, math.nan])
    check(F.softshrink, x)
    check(F.hardshrink, x)
    check(F.huber_loss, _randn(5), _randn(5, seed=1))
    check(lambda s, t: F.huber_loss(s, t, reduction="none", delta=0.5), _randn(5),
          _randn(5, seed=1))
    check(lambda t: torch.renorm(t, 2, 0, 1.0), _randn(3, 4))
    check(lambda t: F.channel_shuffle(t, 2), _randn(1, 4, 2, 2))


def test_complex_polar_angle():
    check(torch.complex, _randn(2, 3), _randn(3, seed=1))
    check(torch.polar, torch.rand(3, generator=_gen()), _randn(3, seed=1))
    check(torch.angle, torch.tensor([-1.0, 0.0, 2.0, math.nan]))


def test_put():
    x = torch.zeros(3, 3)
    idx = torch.tensor([1, -1, 4, 4])
    src = torch.tensor([1.0, 2.0, 3.0, 4.0])
    check(lambda t, i, s: torch.put(t, i, s), x, idx, src)
    check(lambda t, i, s: torch.put(t, i, s, accumulate=True), x, idx, src)
    xb = torch.zeros(3, 3, dtype=torch.bool)
    check(lambda t, i, s: torch.put(t, i, s, accumulate=True), xb, idx, src.bool())
