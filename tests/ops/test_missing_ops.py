"""Ops users hit that were missing or crashed (issue 8): each test runs the PyTorch
snippet on CPU and on tpu and compares values and gradients (random ops: statistics,
support, dtype/shape and seeded replay)."""

from __future__ import annotations


import _budget
import pytest
import torch
import torch.nn.functional as F

import torchtpu  # noqa: F401

TPU = "tpu"


def _pair(t, rg=True):
    """(cpu leaf, tpu leaf) copies of ``t``."""
    c = t.detach().clone().requires_grad_(rg and t.is_floating_point())
    d = t.detach().to(TPU).requires_grad_(rg and t.is_floating_point())
    return c, d


def close(got, exp, **kw):
    torch.testing.assert_close(got.detach().cpu(), exp.detach().cpu(), equal_nan=True, **kw)


# ------------------------------------------------------------------ padding backward


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_pad_backward(mode, nd):
    torch.manual_seed(0)
    x = torch.randn((2, 3) + (5,) * nd)
    pad = (1, 2, 2, 0, 0, 3)[: 2 * nd]
    xc, xt = _pair(x)
    yc = F.pad(xc, pad, mode=mode)
    yt = F.pad(xt, pad, mode=mode)
    g = torch.randn_like(yc)
    yc.backward(g)
    yt.backward(g.to(TPU))
    close(yt, yc)
    close(xt.grad, xc.grad)


def test_replicate_pad_negative_backward():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 7)
    xc, xt = _pair(x)
    yc = F.pad(xc, (-1, 3, 2, -2), mode="replicate")
    yt = F.pad(xt, (-1, 3, 2, -2), mode="replicate")
    g = torch.randn_like(yc)
    yc.backward(g)
    yt.backward(g.to(TPU))
    close(yt, yc)
    close(xt.grad, xc.grad)


# ------------------------------------------------------------------ pooling backward


@pytest.mark.parametrize("dim", [2, 3])
def test_adaptive_max_pool_backward(dim):
    torch.manual_seed(0)
    x = torch.randn((2, 3) + (7,) * dim)
    pool = F.adaptive_max_pool2d if dim == 2 else F.adaptive_max_pool3d
    xc, xt = _pair(x)
    yc, ic = pool(xc, 3, return_indices=True)
    yt, it = pool(xt, 3, return_indices=True)
    g = torch.randn_like(yc)
    yc.backward(g)
    yt.backward(g.to(TPU))
    close(yt, yc)
    close(it, ic)
    close(xt.grad, xc.grad)


# ------------------------------------------------------------------ hessian


def test_func_hessian():
    def f(x, y):
        return (x.sin() * y.exp()).sum() + (x ** 3 * y).sum()

    x = torch.randn(4, dtype=torch.float64)
    y = torch.randn(4, dtype=torch.float64)
    exp = torch.func.hessian(f, argnums=(0, 1))(x, y)
    got = torch.func.hessian(f, argnums=(0, 1))(x.to(TPU), y.to(TPU))
    for ge, ee in zip(got, exp):
        for g, e in zip(ge, ee):
            close(g, e)


def test_efficientzerotensor():
    z = torch.ops.aten._efficientzerotensor([2, 3], dtype=torch.float32, device=TPU)
    assert z.device.type == TPU and z.shape == (2, 3) and z.dtype == torch.float32
    close(z, torch.zeros(2, 3))


# ------------------------------------------------------------------ random: gamma & co


def _stats(x):
    x = x.double().cpu()
    return x.mean().item(), x.var().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_standard_gamma(dtype):
    torch.manual_seed(0)
    alpha = torch.tensor([0.3, 1.0, 2.5, 12.0], dtype=dtype).repeat(20000, 1)
    got = torch._standard_gamma(alpha.to(TPU))
    exp = torch._standard_gamma(alpha)
    assert got.dtype == exp.dtype and got.shape == exp.shape
    assert bool((got > 0).all())
    for k in range(4):
        gm, gv = _stats(got[:, k])
        em, ev = _stats(exp[:, k])
        a = alpha[0, k].item()
        assert abs(gm - em) < 0.05 * a + 0.02 and abs(gv - ev) < 0.1 * a + 0.03, (a, gm, em, gv, ev)
    # alpha = 0: CPU clamps to the smallest normal number
    close(torch._standard_gamma(torch.zeros(3, dtype=dtype, device=TPU)),
          torch._standard_gamma(torch.zeros(3, dtype=dtype)))


def test_random_distributions_seeded_replay():
    D = torch.distributions

    def draw():
        torch.manual_seed(7)
        c = torch.tensor([0.5, 2.0, 4.0], device=TPU)
        return [torch._standard_gamma(c), torch.poisson(c * 3), torch._sample_dirichlet(c),
                D.Beta(c, c + 1).sample((3,)), D.Dirichlet(c).sample((2,)),
                D.Poisson(c).sample((4,)), D.Gamma(c, 2.0).rsample((5,))]

    a, b = draw(), draw()
    for x, y in zip(a, b):
        assert x.device.type == TPU
        close(x, y.cpu(), rtol=0, atol=0)
    assert not torch.equal(a[0].cpu(), torch._standard_gamma(
        torch.tensor([0.5, 2.0, 4.0], device=TPU)).cpu())


def test_poisson():
    torch.manual_seed(0)
    rate = torch.tensor([0.0, 0.5, 3.0, 40.0]).repeat(20000, 1)
    got = torch.poisson(rate.to(TPU))
    exp = torch.poisson(rate)
    assert got.dtype == exp.dtype and got.shape == exp.shape
    g = got.cpu()
    assert bool((g == g.round()).all()) and bool((g >= 0).all())
    assert bool((g[:, 0] == 0).all())
    for k in range(1, 4):
        gm, gv = _stats(got[:, k])
        em, ev = _stats(exp[:, k])
        r = rate[0, k].item()
        assert abs(gm - em) < 0.03 * r + 0.02 and abs(gv - ev) < 0.1 * r + 0.03, (r, gm, em)


def test_sample_dirichlet():
    torch.manual_seed(0)
    alpha = torch.tensor([[0.5, 1.0, 3.0]]).repeat(20000, 1)
    got = torch._sample_dirichlet(alpha.to(TPU))
    exp = torch._sample_dirichlet(alpha)
    assert got.dtype == exp.dtype and got.shape == exp.shape
    close(got.sum(-1), torch.ones(20000), atol=1e-5, rtol=0)
    assert bool((got > 0).all())
    close(got.mean(0), exp.mean(0), atol=0.01, rtol=0)
    close(got.var(0), exp.var(0), atol=0.005, rtol=0)
    # tiny concentrations: values clamped at float32's smallest normal number, as CPU
    tiny = torch._sample_dirichlet(torch.full((50, 3), 1e-3, device=TPU)).cpu()
    assert bool((tiny >= torch.finfo(torch.float32).tiny).all())
    close(tiny.sum(-1), torch.ones(50))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_standard_gamma_grad(dtype):
    torch.manual_seed(0)
    # every branch of CPU's approximation: x < 0.8; alpha > 8 (near and far from alpha);
    # the rational fit in between
    alpha = torch.cat([torch.rand(500, dtype=dtype) * 20 + 0.05,
                       torch.tensor([0.3, 2.0, 9.0, 20.0, 4.0, 50.0, 10.0], dtype=dtype)])
    x = torch.cat([torch._standard_gamma(alpha[:500]),
                   torch.tensor([0.1, 0.79, 0.81, 19.5, 3.0, 20.0, 10.5], dtype=dtype)])
    exp = torch._standard_gamma_grad(alpha, x)
    got = torch._standard_gamma_grad(alpha.to(TPU), x.to(TPU))
    close(got, exp, rtol=1e-5, atol=1e-6)


def test_gamma_rsample_backward():
    D = torch.distributions
    conc = torch.tensor([0.7, 2.0, 11.0])
    cc, ct = _pair(conc)
    torch.manual_seed(0)
    xt = D.Gamma(ct, 1.5).rsample((64,))
    # the same draws on CPU: the reparameterized gradient depends only on (alpha, x)
    xc = xt.detach().cpu()
    (xt * torch.arange(3.0, device=TPU)).sum().backward()
    gc = torch._standard_gamma_grad(conc.expand(64, 3), xc * 1.5) / 1.5
    close(ct.grad, (gc * torch.arange(3.0)).sum(0), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ segment_reduce


@pytest.mark.parametrize("reduce", ["max", "min", "sum", "mean", "prod"])
@pytest.mark.parametrize("initial", [None, -2.0])
@pytest.mark.parametrize("form", ["lengths", "offsets"])
def test_segment_reduce(reduce, initial, form):
    # NaN, ties, a zero, an empty segment, positive and negative gradients
    data = torch.tensor([1.0, float("nan"), 3.0, 3.0, 2.0, 0.0, 5.0, -1.0])
    lengths = torch.tensor([2, 0, 3, 2])  # the last element is in no segment
    kw = {"lengths": lengths} if form == "lengths" else \
        {"offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])}
    dc, dt = _pair(data)
    oc = torch.segment_reduce(dc, reduce, **kw, initial=initial, unsafe=True)
    ot = torch.segment_reduce(dt, reduce, **{k: v.to(TPU) for k, v in kw.items()},
                              initial=initial, unsafe=True)
    g = torch.tensor([1.0, -2.0, 3.0, -4.0])
    oc.backward(g)
    ot.backward(g.to(TPU))
    close(ot, oc)
    close(dt.grad, dc.grad)


@pytest.mark.parametrize("reduce", ["max", "sum", "mean", "prod"])
def test_segment_reduce_batched_axis1(reduce):
    torch.manual_seed(0)
    data = torch.randn(3, 6, 2)
    lengths = torch.tensor([[2, 0, 4], [1, 1, 4], [6, 0, 0]])
    dc, dt = _pair(data)
    oc = torch.segment_reduce(dc, reduce, lengths=lengths, axis=1, initial=1.0)
    ot = torch.segment_reduce(dt, reduce, lengths=lengths.to(TPU), axis=1, initial=1.0)
    g = torch.randn_like(oc)
    oc.backward(g)
    ot.backward(g.to(TPU))
    close(ot, oc)
    close(dt.grad, dc.grad)


def test_segment_reduce_unsafe_check():
    data = torch.randn(5, device=TPU)
    with pytest.raises(RuntimeError, match="to sum to data.size"):
        torch.segment_reduce(data, "sum", lengths=torch.tensor([1, 1], device=TPU)).cpu()


# ------------------------------------------------------------------ CTC loss


@pytest.mark.parametrize("layout", ["padded", "concatenated"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss(layout, reduction, zero_infinity):
    torch.manual_seed(0)
    T, N, C = 12, 4, 6
    logits = torch.randn(T, N, C)
    input_lengths = [12, 10, 7, 5]
    target_lengths = [3, 5, 1, 0]
    if zero_infinity:
        target_lengths = [3, 5, 1, 7]  # 7 labels in 5 steps: infinite loss, zeroed
    padded = torch.randint(1, C, (N, 7))
    targets = padded if layout == "padded" else \
        torch.cat([padded[b, :target_lengths[b]] for b in range(N)])
    xc, xt = _pair(logits)
    lc = F.ctc_loss(xc.log_softmax(2), targets, input_lengths, target_lengths,
                    reduction=reduction, zero_infinity=zero_infinity)
    lt = F.ctc_loss(xt.log_softmax(2), targets.to(TPU), input_lengths, target_lengths,
                    reduction=reduction, zero_infinity=zero_infinity)
    lc.sum().backward()
    lt.sum().backward()
    close(lt, lc, rtol=1e-5, atol=1e-5)
    close(xt.grad, xc.grad, rtol=1e-5, atol=1e-5)


def test_ctc_loss_log_probs_grad_and_length_tensors():
    # the gradient w.r.t. log_probs itself (CPU's log_softmax-input convention), length
    # tensors, an infinite loss without zero_infinity (NaN gradient, as CPU), float64
    torch.manual_seed(0)
    lp = torch.randn(9, 3, 5, dtype=torch.float64).log_softmax(2)
    targets = torch.tensor([[1, 2, 2, 4], [3, 3, 3, 3], [1, 1, 1, 1]])
    il, tl = torch.tensor([9, 8, 2]), torch.tensor([4, 2, 3])
    c, t = _pair(lp)
    lc = F.ctc_loss(c, targets, il, tl, reduction="none")
    lt = F.ctc_loss(t, targets.to(TPU), il, tl, reduction="none")
    w = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    (lc * w).sum().backward()
    (lt * w.to(TPU)).sum().backward()
    close(lt, lc)
    close(t.grad, c.grad)


# ------------------------------------------------------------------ antialiased resize


@pytest.mark.parametrize("shape,kw", [
    ((2, 3, 16, 12), dict(size=(5, 7))),
    ((1, 2, 8, 8), dict(size=(20, 3))),
    ((1, 1, 9, 10), dict(scale_factor=0.37)),
    ((1, 2, 7, 7), dict(size=(3, 3), align_corners=True)),
    ((1, 1, 5, 5), dict(scale_factor=(2.5, 0.5), recompute_scale_factor=False)),
])
def test_interpolate_bilinear_antialias(shape, kw):
    torch.manual_seed(0)
    xc, xt = _pair(torch.randn(shape))
    yc = F.interpolate(xc, mode="bilinear", antialias=True, **kw)
    yt = F.interpolate(xt, mode="bilinear", antialias=True, **kw)
    g = torch.randn_like(yc)
    yc.backward(g)
    yt.backward(g.to(TPU))
    close(yt, yc)
    close(xt.grad, xc.grad)


# ------------------------------------------------------------------ linalg


@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("shapes", [((5, 3), (5, 2)), ((3, 5), (3, 2)), ((2, 5, 3), (2, 5, 2)),
                                    ((5, 3), (5,))])
def test_linalg_lstsq(driver, shapes):
    torch.manual_seed(0)
    (sa, sb) = shapes
    if driver == "gels" and sa[-2] < sa[-1]:
        pytest.skip("gels needs a full-rank tall or square A")
    A, B = torch.randn(sa), torch.randn(sb)
    exp = torch.linalg.lstsq(A, B, driver=driver)
    got = torch.linalg.lstsq(A.to(TPU), B.to(TPU), driver=driver)
    for g, e in zip(got, exp):
        assert g.shape == e.shape and g.dtype == e.dtype
        close(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("driver", [None, "gelsd", "gelss"])
def test_linalg_lstsq_rank_deficient(driver):
    torch.manual_seed(0)
    A = torch.randn(5, 2) @ torch.randn(2, 3)
    B = torch.randn(5, 2)
    exp = torch.linalg.lstsq(A, B, driver=driver)
    got = torch.linalg.lstsq(A.to(TPU), B.to(TPU), driver=driver)
    assert exp.rank.item() == got.rank.item() == 2
    assert got.residuals.shape == exp.residuals.shape == (0,)  # residuals need rank n
    close(got.solution, exp.solution, rtol=1e-4, atol=1e-5)
    if exp.singular_values.numel():
        close(got.singular_values, exp.singular_values, rtol=1e-4, atol=1e-5)


def test_linalg_lstsq_backward():
    torch.manual_seed(0)
    Ac, At = _pair(torch.randn(6, 4))
    Bc, Bt = _pair(torch.randn(6, 2))
    torch.linalg.lstsq(Ac, Bc).solution.sum().backward()
    torch.linalg.lstsq(At, Bt).solution.sum().backward()
    close(At.grad, Ac.grad, rtol=1e-4, atol=1e-5)
    close(Bt.grad, Bc.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_linalg_eig(dtype):
    # eigenvalues are unique only as a set and eigenvectors up to a phase: compare the
    # sorted eigenvalues and the reconstruction A V = V diag(L)
    torch.manual_seed(0)
    A = torch.randn(3, 5, 5, dtype=dtype)
    L, V = torch.linalg.eig(A)
    Lt, Vt = torch.linalg.eig(A.to(TPU))
    assert Lt.dtype == L.dtype and Vt.dtype == V.dtype and Vt.shape == V.shape
    tol = dict(rtol=1e-4, atol=1e-4) if dtype != torch.float64 else {}

    def srt(x):
        x = x.cpu()
        key = x.real * 1000 + x.imag
        return torch.gather(x, -1, key.argsort(-1))

    close(srt(Lt), srt(L), **tol)
    Ac = A.to(L.dtype)
    close(Ac.to(TPU) @ Vt, (Vt * Lt.unsqueeze(-2)).cpu(), **tol)
    close(torch.linalg.vector_norm(Vt, dim=-2), torch.ones(3, 5, dtype=L.real.dtype), **tol)


def test_linalg_eig_backward():
    torch.manual_seed(0)
    Ac, At = _pair(torch.randn(4, 4, dtype=torch.float64))
    # a phase-invariant function of the eigendecomposition
    Lc, Vc = torch.linalg.eig(Ac)
    Lt, Vt = torch.linalg.eig(At)
    (Lc.abs().sum() + (Vc.abs() ** 2).sum()).backward()
    (Lt.abs().sum() + (Vt.abs() ** 2).sum()).backward()
    close(At.grad, Ac.grad)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape,pad", [((2, 5), (3, 2)), ((1, 2, 5, 5), (3, 3, 2, 4)),
                                       ((1, 1, 4, 4, 4), (2, 1, 1, 2, 3, 1))])
def test_pad_backward_bfloat16_exact(mode, shape, pad):
    # CPU adds each gradient in bfloat16, in row-major output order: bit-exact here
    torch.manual_seed(0)
    xc, xt = _pair(torch.randn(shape, dtype=torch.bfloat16))
    yc = F.pad(xc, pad, mode=mode)
    g = torch.randn_like(yc) * 3
    yc.backward(g)
    F.pad(xt, pad, mode=mode).backward(g.to(TPU))
    close(xt.grad, xc.grad, rtol=0, atol=0)


# ------------------------------------------------------------------ resize backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,kw", [
    ((2, 3, 7), dict(mode="nearest", size=11)),
    ((2, 3, 7), dict(mode="nearest", scale_factor=0.6)),
    ((1, 2, 4, 5, 3), dict(mode="nearest", size=(6, 3, 7))),
    ((2, 3, 7), dict(mode="nearest-exact", size=11)),
    ((1, 2, 5, 6), dict(mode="nearest-exact", size=(7, 4))),
    ((1, 2, 4, 5, 3), dict(mode="nearest-exact", size=(6, 3, 7))),
    ((2, 3, 7), dict(mode="linear", size=11)),
    ((2, 3, 7), dict(mode="linear", size=4, align_corners=True)),
    ((1, 2, 4, 5, 3), dict(mode="trilinear", size=(6, 3, 7))),
    ((1, 2, 5, 6), dict(mode="bicubic", size=(9, 4))),
    ((1, 2, 5, 6), dict(mode="bicubic", size=(3, 11), align_corners=True)),
    ((1, 2, 5, 6), dict(mode="bicubic", scale_factor=1.7)),
])
def test_interpolate_backward(shape, kw, dtype):
    if (dtype == torch.bfloat16 and not _budget.FULL
            and kw["mode"] not in ("nearest", "bicubic")):
        pytest.skip("bfloat16: nearest and bicubic by default; TORCHTPU_FULL_TESTS=1: every mode")
    torch.manual_seed(0)
    xc, xt = _pair(torch.randn(shape, dtype=dtype))
    yc = F.interpolate(xc, **kw)
    yt = F.interpolate(xt, **kw)
    g = torch.randn_like(yc)
    yc.backward(g)
    yt.backward(g.to(TPU))
    tol = {} if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    close(yt, yc, **tol)
    close(xt.grad, xc.grad, **tol)


# ------------------------------------------------------------------ grid sampling


@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_backward(nd, mode, padding_mode, align_corners):
    if nd == 3 and mode == "bicubic":
        pytest.skip("bicubic is 2-D only")
    if not _budget.FULL and (
            ["bilinear", "nearest", "bicubic"].index(mode)
            + ["zeros", "border", "reflection"].index(padding_mode) + nd + align_corners) % 2:
        # (CI's time budget: each case compiles its own forward and backward; the default
        # run takes the half whose option indices sum to an even number, which still has
        # every pair of options: each mode with each padding, dimension and corner rule)
        pytest.skip("TORCHTPU_FULL_TESTS=1: every combination")
    torch.manual_seed(0)
    x = torch.randn((2, 3) + (5, 6, 4)[:nd])
    grid = torch.rand((2,) + (4, 3, 2)[:nd] + (nd,)) * 2.6 - 1.3  # some points outside
    xc, xt = _pair(x)
    gc, gt = _pair(grid)
    kw = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    yc = F.grid_sample(xc, gc, **kw)
    yt = F.grid_sample(xt, gt, **kw)
    w = torch.randn_like(yc)
    yc.backward(w)
    yt.backward(w.to(TPU))
    close(yt, yc, rtol=1e-5, atol=1e-5)
    close(xt.grad, xc.grad, rtol=1e-5, atol=1e-5)
    close(gt.grad, gc.grad, rtol=1e-4, atol=1e-4)


def test_grid_sample_backward_bfloat16_unsupported():
    x = torch.randn(1, 2, 4, 4, dtype=torch.bfloat16, device=TPU, requires_grad=True)
    grid = torch.rand(1, 3, 3, 2, dtype=torch.bfloat16, device=TPU)
    y = F.grid_sample(x, grid, align_corners=False)
    with pytest.raises(NotImplementedError, match="grid_sampler_2d_backward"):
        y.sum().backward()


# ------------------------------------------------------------------ gcd / lcm


@pytest.mark.parametrize("fn", [torch.gcd, torch.lcm])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_gcd_lcm_match_cpu_including_wraparound(fn, dtype):
    """CPU's Euclid in the operands' dtype: |INT64_MIN| and narrow-int products wrap the
    way its C++ kernel does (lcm of int8 100 and 3 is 44)."""
    g = torch.Generator().manual_seed(0)
    lo = 0 if dtype == torch.uint8 else -128
    a = torch.randint(lo, 127, (400,), dtype=dtype, generator=g)
    b = torch.randint(lo, 127, (400,), dtype=dtype, generator=g)
    if dtype == torch.int64:
        a[:3] = torch.tensor([-2**63, 0, -2**63])
        b[:3] = torch.tensor([2, 0, -2**63])
    assert torch.equal(fn(a.to(TPU), b.to(TPU)).cpu(), fn(a, b))
    a2, b2 = a.reshape(20, 20), b[:20]  # broadcasting
    assert torch.equal(fn(a2.to(TPU), b2.to(TPU)).cpu(), fn(a2, b2))
    x = a.clone()
    xt = a.to(TPU)
    getattr(x, fn.__name__ + "_")(b)
    getattr(xt, fn.__name__ + "_")(b.to(TPU))
    assert torch.equal(xt.cpu(), x)


@pytest.mark.parametrize("fn", [torch.gcd, torch.lcm])
def test_gcd_lcm_refuse_floats_as_cpu(fn):
    with pytest.raises(RuntimeError) as cpu:
        fn(torch.ones(2), torch.ones(2))
    with pytest.raises(RuntimeError) as tpu:
        fn(torch.ones(2, device=TPU), torch.ones(2, device=TPU))
    assert (type(tpu.value), str(tpu.value)) == (type(cpu.value), str(cpu.value))


# ------------------------------------------------------------------ integer convolution


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
@pytest.mark.parametrize("transposed", [False, True, "dilated"])
def test_integer_convolution_as_cpu(dtype, transposed):
    """CPU convolves integers exactly (int64 products wrap); its transposed kernels
    exist for int64 only and raise NotImplementedError for the other integer types."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50, (2, 3, 7, 6), dtype=dtype, generator=g)
    w = torch.randint(0, 5, (3, 4, 3, 2), dtype=dtype, generator=g)
    b = torch.randint(0, 5, (4,), dtype=dtype, generator=g)
    if transposed == "dilated":
        f = lambda x, w, b: F.conv2d(x, w.transpose(0, 1), b, dilation=2)  # noqa: E731
    elif transposed:
        f = lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1)  # noqa: E731
    else:
        f = lambda x, w, b: F.conv2d(x, w.transpose(0, 1), b, padding=1)  # noqa: E731
    try:
        want = f(x, w, b)
    except NotImplementedError as cpu:
        with pytest.raises(NotImplementedError) as tpu:
            f(x.to(TPU), w.to(TPU), b.to(TPU))
        assert str(tpu.value) == str(cpu)
        return
    got = f(x.to(TPU), w.to(TPU), b.to(TPU))
    assert got.dtype == want.dtype
    assert torch.equal(got.cpu(), want)


# ------------------------------------------------------------------ rrelu


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rrelu_eval_matches_cpu(dtype):
    x = torch.linspace(-3, 3, 13, dtype=dtype)
    c, d = _pair(x)
    yc, yd = F.rrelu(c, 0.1, 0.4, training=False), F.rrelu(d, 0.1, 0.4, training=False)
    close(yd, yc, rtol=0, atol=0)
    yc.sum().backward()
    yd.sum().backward()
    close(d.grad, c.grad, rtol=0, atol=0)


def test_rrelu_training_slopes_noise_gradient_and_replay():
    """Training: each x <= 0 is scaled by its own slope in [lower, upper), x > 0 passes;
    the gradient is that slope (CPU's noise); the in-place form and nn.RReLU agree;
    ``torch.manual_seed`` replays the slopes."""
    lo, up = 0.1, 0.3
    x = torch.linspace(-4, 4, 4001).to(TPU).requires_grad_()
    torch.manual_seed(3)
    y = F.rrelu(x, lo, up, training=True)
    y.sum().backward()
    xc, yc, gc = x.detach().cpu(), y.detach().cpu(), x.grad.cpu()
    pos = xc > 0
    assert torch.equal(yc[pos], xc[pos]) and torch.all(gc[pos] == 1)
    neg = xc < 0
    slope = yc[neg] / xc[neg]
    assert slope.min() >= lo and slope.max() < up
    assert slope.std() > 0.04  # one slope per element, not one for all
    torch.testing.assert_close(gc[neg], slope)
    torch.manual_seed(3)
    again = F.rrelu(x.detach(), lo, up, training=True).cpu()
    assert torch.equal(again, yc)
    torch.manual_seed(3)
    inplace = x.detach().clone()
    F.rrelu(inplace, lo, up, training=True, inplace=True)
    assert torch.equal(inplace.cpu(), yc)
    m = torch.nn.RReLU(lo, up).to(TPU).train()
    torch.manual_seed(3)
    assert torch.equal(m(x.detach()).cpu(), yc)


def test_rrelu_compiled():
    x = torch.linspace(-2, 2, 9)
    f = torch.compile(lambda t: F.rrelu(t, 0.2, 0.25, training=True), backend="tpu",
                      fullgraph=True)
    y = f(x.to(TPU)).cpu()
    slope = y[x < 0] / x[x < 0]
    assert torch.equal(y[x >= 0], x[x >= 0])
    assert slope.min() >= 0.2 and slope.max() < 0.25


# ------------------------------------------------------------------ cdist backward


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_cdist_backward(p):
    """``_cdist_backward`` with CPU's per-p rules, including zero distances (a row of x1
    equal to a row of x2) and broadcast batch dimensions."""
    torch.manual_seed(0)
    x1 = torch.randn(2, 1, 4, 3)
    x2 = torch.randn(3, 5, 3)
    x2[:, 0] = x1[0, 0, 0]  # zero distances
    c1, d1 = _pair(x1)
    c2, d2 = _pair(x2)
    mode = "donot_use_mm_for_euclid_dist"
    yc = torch.cdist(c1, c2, p=p, compute_mode=mode)
    yd = torch.cdist(d1, d2, p=p, compute_mode=mode)
    close(yd, yc)
    g = torch.randn(yc.shape)
    yc.backward(g)
    yd.backward(g.to(TPU))
    close(d1.grad, c1.grad)
    close(d2.grad, c2.grad)


@pytest.mark.parametrize("eps", [None, 0.2])
def test_logit_backward(eps):
    """``logit``'s backward: the structured ``logit_backward`` comes back to the backend
    as its ``grad_input`` overload, whose plan ran the functional op again (a
    RecursionError); it now runs the decomposition."""
    x = torch.rand(7)
    c, d = _pair(x)
    torch.logit(c, eps).sum().backward()
    torch.logit(d, eps).sum().backward()
    close(d.grad, c.grad)
