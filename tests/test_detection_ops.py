"""torchvision's detection ops on tpu (``torchtpu.ops.detection``) against the same calls
on CPU: ``nms`` / ``batched_nms`` keep CPU's boxes in CPU's order, ``roi_align`` and
its gradient (torchvision's autograd function calls ``_roi_align_backward``) equal
CPU's within float rounding, with no CPU fallback.

torchvision does not import beside ``torch==2.13.0+cpu`` (PyPI's wheels are CUDA builds
of later torches), so these run in the vision venv: ``make test-vision``.
"""

import pytest
import torch

torchvision = pytest.importorskip("torchvision")
from torchvision import ops as tvops  # noqa: E402

import torchtpu  # noqa: E402

TPU = "tpu"


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    monkeypatch.setattr(torch.tpu, "enable_cpu_fallback", False)
    torchtpu.reset_metrics()
    yield
    assert not torchtpu.metrics()["fallbacks"]


def _boxes(n, seed=0, dtype=torch.float32, scale=100.0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * scale
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * scale * 0.4 + 1
    return torch.cat([xy, xy + wh], 1).to(dtype)


def _scores(n, seed=1, dtype=torch.float32):
    # distinct scores: CPU orders equal scores by an unstable sort
    g = torch.Generator().manual_seed(seed)
    return (torch.randperm(n, generator=g).to(torch.float64) / max(n, 1)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n", [0, 1, 2, 63, 64, 65, 300])
def test_nms_keeps_cpus_boxes_in_cpus_order(n, dtype):
    b, s = _boxes(n, dtype=dtype), _scores(n, dtype=dtype)
    for thr in (0.0, 0.3, 0.5, 0.9):
        want = tvops.nms(b, s, thr)
        got = tvops.nms(b.to(TPU), s.to(TPU), thr)
        assert got.device.type == TPU and got.dtype == torch.int64
        assert torch.equal(got.cpu(), want), (thr, got.cpu()[:10], want[:10])


def test_nms_of_identical_and_degenerate_boxes_matches_cpu():
    b = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 10], [5, 5, 5, 5], [1, 1, 0, 0],
                      [0, 0, 10, 11]], dtype=torch.float32)
    s = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5])
    for thr in (0.0, 0.5, 1.0):
        assert torch.equal(tvops.nms(b.to(TPU), s.to(TPU), thr).cpu(), tvops.nms(b, s, thr))


def test_batched_nms_matches_cpu():
    n = 500
    b, s = _boxes(n, seed=3), _scores(n, seed=4)
    idx = torch.randint(0, 5, (n,), generator=torch.Generator().manual_seed(5))
    want = tvops.batched_nms(b, s, idx, 0.5)
    got = tvops.batched_nms(b.to(TPU), s.to(TPU), idx.to(TPU), 0.5)
    assert torch.equal(got.cpu(), want)


def test_nms_rejects_what_cpu_rejects():
    cases = [
        (torch.zeros(3, 5), torch.zeros(3)),  # boxes not (N, 4)
        (torch.zeros(3, 4), torch.zeros(3, 1)),  # scores not 1-D
        (torch.zeros(3, 4), torch.zeros(2)),  # counts differ
        (torch.zeros(3, 4), torch.zeros(3, dtype=torch.float64)),  # dtypes differ
    ]
    for b, s in cases:
        with pytest.raises(RuntimeError) as cpu_err:
            tvops.nms(b, s, 0.5)
        with pytest.raises(RuntimeError) as tpu_err:
            tvops.nms(b.to(TPU), s.to(TPU), 0.5)
        # (CPU's message starts with the kernel's source location)
        assert str(tpu_err.value).split(" (in ")[0] in str(cpu_err.value), (
            str(cpu_err.value), str(tpu_err.value))


def _rois(k, batch, seed=6, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, batch, (k, 1), generator=g).to(dtype)
    r = torch.cat([idx, _boxes(k, seed=seed, dtype=dtype, scale=20.0)], 1)
    r[0, 1:] = torch.tensor([-5.0, -6.0, 30.0, 41.0], dtype=dtype)  # partly off the map
    r[1, 1:] = torch.tensor([3.0, 3.0, 2.0, 2.5], dtype=dtype)  # malformed (x2 < x1)
    return r


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float64, 1e-12)],
                         ids=["float32", "float64"])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("spatial_scale,sampling_ratio,out", [(1.0, 2, (3, 4)),
                                                               (0.5, 1, (2, 2)),
                                                               (0.25, 3, (7, 7))])
def test_roi_align_and_its_gradient_match_cpu(dtype, tol, aligned, spatial_scale,
                                              sampling_ratio, out):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 20, 24, generator=g, dtype=dtype, requires_grad=True)
    rois = _rois(9, 2, dtype=dtype)
    want = tvops.roi_align(x, rois, out, spatial_scale, sampling_ratio, aligned)
    xt = x.detach().to(TPU).requires_grad_()
    got = tvops.roi_align(xt, rois.to(TPU), out, spatial_scale, sampling_ratio, aligned)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol)
    gout = torch.randn(want.shape, generator=g, dtype=dtype)
    (gx,) = torch.autograd.grad(want, x, gout)
    (gxt,) = torch.autograd.grad(got, xt, gout.to(TPU))
    torch.testing.assert_close(gxt.cpu(), gx, rtol=tol, atol=4 * tol)


def test_multiscale_roi_align_matches_cpu():
    torch.manual_seed(0)
    m = tvops.MultiScaleRoIAlign(["a", "b"], output_size=5, sampling_ratio=2)
    feats = {"a": torch.randn(2, 4, 32, 32), "b": torch.randn(2, 4, 16, 16)}
    boxes = [_boxes(6, seed=8, scale=200.0), _boxes(4, seed=9, scale=200.0)]
    sizes = [(256, 256), (256, 256)]
    want = m(feats, boxes, sizes)
    got = m({k: v.to(TPU) for k, v in feats.items()}, [b.to(TPU) for b in boxes], sizes)
    torch.testing.assert_close(got.cpu(), want, rtol=2e-6, atol=2e-6)


def test_adaptive_sampling_ratio_is_refused_by_name(monkeypatch):
    x = torch.randn(1, 1, 8, 8, device=TPU)
    rois = torch.tensor([[0.0, 1.0, 1.0, 6.0, 6.0]], device=TPU)
    with pytest.raises(NotImplementedError, match="roi_align.*sampling_ratio=0"):
        tvops.roi_align(x, rois, (2, 2), 1.0, 0, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("spatial_scale,out", [(1.0, (3, 4)), (0.5, (2, 2)), (0.25, (7, 7))])
def test_roi_pool_values_argmax_and_gradient_equal_cpu(dtype, spatial_scale, out):
    g = torch.Generator().manual_seed(10)
    x = torch.randn(2, 3, 20, 24, generator=g, dtype=dtype)
    x[0, 0, 3, 3] = float("nan")  # never the maximum (CPU's ``>`` skips it)
    x[1, 1, 5:8, 5:8] = 1.0  # ties: the first in row-major order
    rois = _rois(9, 2, seed=11, dtype=dtype)
    rois[2, 1:] = torch.tensor([4.5, 5.5, 8.5, 9.5], dtype=dtype)  # std::round's halves
    want, want_arg = torch.ops.torchvision.roi_pool(x, rois, spatial_scale, *out)
    got, got_arg = torch.ops.torchvision.roi_pool(x.to(TPU), rois.to(TPU), spatial_scale, *out)
    assert torch.equal(got.cpu(), want) and torch.equal(got_arg.cpu(), want_arg)
    xc = x.clone().requires_grad_()
    xt = x.to(TPU).requires_grad_()
    c = tvops.roi_pool(xc, rois, out, spatial_scale)
    t = tvops.roi_pool(xt, rois.to(TPU), out, spatial_scale)
    gout = torch.randn(c.shape, generator=g, dtype=dtype)
    (gc,) = torch.autograd.grad(c, xc, gout)
    (gt,) = torch.autograd.grad(t, xt, gout.to(TPU))
    torch.testing.assert_close(gt.cpu(), gc)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float64, 1e-12)],
                         ids=["float32", "float64"])
@pytest.mark.parametrize("op", ["ps_roi_align", "ps_roi_pool"])
@pytest.mark.parametrize("spatial_scale", [1.0, 0.5, 0.25])
def test_position_sensitive_ops_and_their_gradients_match_cpu(dtype, tol, op, spatial_scale):
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2, 2 * 3 * 4, 20, 24, generator=g, dtype=dtype)
    rois = _rois(9, 2, seed=13, dtype=dtype)
    rois[2, 1:] = torch.tensor([4.5, 5.5, 8.5, 9.5], dtype=dtype)
    args = (spatial_scale, 3, 4) + ((2,) if op == "ps_roi_align" else ())
    fn = getattr(torch.ops.torchvision, op)
    want, want_map = fn(x, rois, *args)
    got, got_map = fn(x.to(TPU), rois.to(TPU), *args)
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol)
    assert torch.equal(got_map.cpu(), want_map)
    f = getattr(tvops, op)
    xc, xt = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    extra = (spatial_scale, 2) if op == "ps_roi_align" else (spatial_scale,)
    c, t = f(xc, rois, (3, 4), *extra), f(xt, rois.to(TPU), (3, 4), *extra)
    gout = torch.randn(c.shape, generator=g, dtype=dtype)
    (gc,) = torch.autograd.grad(c, xc, gout)
    (gt,) = torch.autograd.grad(t, xt, gout.to(TPU))
    torch.testing.assert_close(gt.cpu(), gc, rtol=tol, atol=4 * tol)


def test_nms_puts_nan_scores_first_as_cpu():
    # CPU's descending sort puts a NaN score first: its box suppresses the others
    b = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [2, 2, 5, 5], [50, 50, 60, 60]])
    s = torch.tensor([0.9, float("nan"), 0.95, 0.7])
    assert torch.equal(tvops.nms(b.to(TPU), s.to(TPU), 0.5).cpu(), tvops.nms(b, s, 0.5))


@pytest.mark.parametrize("op", ["roi_align", "ps_roi_align"])
def test_adaptive_sampling_ratio_goes_through_the_cpu_fallback_when_enabled(monkeypatch, op):
    # (torchvision's default sampling_ratio is -1; the refusal used to come while
    # tracing, where the fallback was never tried)
    monkeypatch.setattr(torch.tpu, "enable_cpu_fallback", True)
    x = torch.randn(1, 12, 16, 16, generator=torch.Generator().manual_seed(14))
    rois = torch.tensor([[0.0, 1.0, 1.0, 10.0, 12.0]])
    f, size = getattr(tvops, op), ((3, 4) if op == "roi_align" else (2, 3))
    xc, xt = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    c, t = f(xc, rois, size, 1.0, -1), f(xt, rois.to(TPU), size, 1.0, -1)
    c.sum().backward()
    t.sum().backward()
    torch.testing.assert_close(t.detach().cpu(), c.detach())
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)
    assert torchtpu.metrics()["fallbacks"].get(f"torchvision.{op}.default") == 1
    torchtpu.reset_metrics()  # (the autouse fixture asserts no fallback otherwise)
