"""torchvision's detection ops on tpu (``torchtpu.ops.detection``) against the same calls
on CPU: ``nms`` / ``batched_nms`` keep CPU's boxes in CPU's order, ``roi_align`` and
its gradient (torchvision's autograd function calls ``_roi_align_backward``) equal
CPU's within float rounding, with no CPU fallback; so do ``deform_conv2d`` (function and
``DeformConv2d`` module) and the gradients of all its tensor arguments, samples at the
image border and off it included.

torchvision does not import beside ``torch==2.13.0+cpu`` (PyPI's wheels are CUDA builds
of later torches), so these run in the vision venv: ``make test-vision``.
"""

import warnings

import pytest
import torch

torchvision = pytest.importorskip("torchvision")
from torchvision import ops as tvops  # noqa: E402

import torchtpu  # noqa: E402

TPU = "tpu"


pytestmark = pytest.mark.usefixtures("no_cpu_fallback")


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
                                                               (0.25, 3, (7, 7)),
                                                               # CPU's adaptive grid
                                                               (1.0, -1, (3, 4)),
                                                               (0.5, 0, (2, 2)),
                                                               (2.0, -1, (2, 3))])
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


def test_adaptive_sampling_ratio_under_compile_is_refused_by_name():
    # (the bound on the grids needs the boxes' values: eager reads them, a graph cannot)
    f = torch.compile(lambda x, r: tvops.roi_align(x, r, (2, 2), 1.0, 0), backend="tpu")
    x = torch.randn(1, 1, 8, 8, device=TPU)
    rois = torch.tensor([[0.0, 1.0, 1.0, 6.0, 6.0]], device=TPU)
    with pytest.raises(NotImplementedError, match="roi_align.*sampling_ratio=0"):
        f(x, rois)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)],
                         ids=["float32", "float64"])
@pytest.mark.parametrize("sampling_ratio", [-1, 0])
def test_ps_roi_align_adaptive_grid_and_its_gradient_match_cpu(dtype, tol, sampling_ratio):
    """``ps_roi_align``'s adaptive grid: CPU divides by ``gh * gw`` without RoIAlign's
    ``max(.., 1)``, so an empty or inverted box gives NaN (0 / 0) there, as here."""
    g = torch.Generator().manual_seed(16)
    x = torch.randn(2, 24, 20, 24, generator=g, dtype=dtype)
    rois = torch.tensor([[0, 1, 1, 10, 12], [1, 3, 3, 2, 2.5], [0, -5, -6, 30, 41],
                         [1, 4, 4, 4, 4], [0, 5, 5, 4, 9]], dtype=dtype)
    want, want_map = torch.ops.torchvision.ps_roi_align(x, rois, 0.5, 3, 4, sampling_ratio)
    got, got_map = torch.ops.torchvision.ps_roi_align(x.to(TPU), rois.to(TPU), 0.5, 3, 4,
                                                     sampling_ratio)
    assert want.isnan().any()  # (the empty boxes)
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol, equal_nan=True)
    assert torch.equal(got_map.cpu(), want_map)
    xc, xt = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    c = tvops.ps_roi_align(xc, rois, (3, 4), 0.5, sampling_ratio)
    t = tvops.ps_roi_align(xt, rois.to(TPU), (3, 4), 0.5, sampling_ratio)
    gout = torch.randn(c.shape, generator=g, dtype=dtype)
    (gc,) = torch.autograd.grad(c, xc, gout)
    (gt,) = torch.autograd.grad(t, xt, gout.to(TPU))
    torch.testing.assert_close(gt.cpu(), gc, rtol=tol, atol=4 * tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)],
                         ids=["float32", "float64"])
def test_roi_align_adaptive_grid_of_boxes_of_many_sizes_matches_cpu(dtype, tol):
    """Mask R-CNN's mask targets: ``roi_align`` with the default ``sampling_ratio=-1`` of
    full-image masks, where each box has its own grid (1 to 27 samples a side here: one
    executable loops over 32 x 32 grid points, each box uses its own)."""
    g = torch.Generator().manual_seed(15)
    x = torch.randn(2, 1, 60, 80, generator=g, dtype=dtype, requires_grad=True)
    rois = torch.tensor([[0, 0, 0, 79, 59], [1, 10, 5, 12, 6], [0, 3, 4, 3, 4],
                         [1, -20, -15, 100, 90], [0, 5.5, 7.25, 50.5, 33.75],
                         [1, 70, 50, 200, 52]], dtype=dtype)
    want = tvops.roi_align(x, rois, (4, 3), 1.0, -1, True)
    xt = x.detach().to(TPU).requires_grad_()
    rt = rois.to(TPU)
    before = sum(torchtpu.metrics()["host_syncs"].values())
    got = tvops.roi_align(xt, rt, (4, 3), 1.0, -1, True)
    assert sum(torchtpu.metrics()["host_syncs"].values()) - before <= 1  # the largest grid
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol)
    gout = torch.randn(want.shape, generator=g, dtype=dtype)
    (gx,) = torch.autograd.grad(want, x, gout)
    (gxt,) = torch.autograd.grad(got, xt, gout.to(TPU))
    torch.testing.assert_close(gxt.cpu(), gx, rtol=tol, atol=4 * tol)


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


# ------------------------------------------------------------------- deform_conv2d


def _deform_inputs(dtype, b=2, c=4, o=6, h=7, w=8, kernel=(3, 3), stride=(1, 1),
                   padding=(0, 0), dilation=(1, 1), groups=1, offset_groups=1,
                   mask=True, bias=True, seed=20):
    """Inputs of ``deform_conv2d`` whose offsets move some samples off the image (large
    offsets) and put some exactly on integer coordinates (integer offsets on the integer
    grid: among them the borders -1, 0, H - 1 and H)."""
    g = torch.Generator().manual_seed(seed)
    kh, kw = kernel
    oh = (h + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (w + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    x = torch.randn(b, c, h, w, generator=g, dtype=dtype)
    weight = torch.randn(o, c // groups, kh, kw, generator=g, dtype=dtype)
    shape = (b, offset_groups * 2 * kh * kw, oh, ow)
    off = torch.randn(shape, generator=g, dtype=dtype) * 2
    pick = torch.rand(shape, generator=g)
    off = torch.where(pick < 0.4, torch.randint(-4, 5, shape, generator=g).to(dtype), off)
    off = torch.where(pick > 0.9, off * 5, off)  # far off the image
    m = (torch.rand(b, offset_groups * kh * kw, oh, ow, generator=g, dtype=dtype) * 2 - 0.5
         if mask else None)
    bs = torch.randn(o, generator=g, dtype=dtype) if bias else None
    return x, off, weight, bs, m


def _deform_run(args, **kw):
    x, off, weight, bias, mask = args
    return tvops.deform_conv2d(x, off, weight, bias, mask=mask, **kw)


def _assert_near(got, want, tol, what):
    # error relative to the array's largest magnitude (at least 1)
    got = got.detach().cpu()
    assert got.shape == want.shape and got.dtype == want.dtype, what
    err = (got - want.detach()).abs().max().item() if want.numel() else 0.0
    scale = max(1.0, want.detach().abs().max().item()) if want.numel() else 1.0
    assert err <= tol * scale, (what, err, scale)


def _deform_compare(args, tol, seed=21, **kw):
    """``deform_conv2d`` on CPU and tpu from the same leaves; the forward values and the
    gradient of every tensor argument (through torch.autograd, i.e.
    ``_deform_conv2d_backward``) compared.  Returns the CPU output and gradients."""
    names = ["input", "offset", "weight", "bias", "mask"]
    cpu = [None if a is None else a.clone().requires_grad_() for a in args]
    tpu = [None if a is None else a.to(TPU).requires_grad_() for a in args]
    want, got = _deform_run(cpu, **kw), _deform_run(tpu, **kw)
    assert got.device.type == TPU
    _assert_near(got, want, tol, "output")
    gout = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed),
                       dtype=want.dtype)
    leaves = [i for i, a in enumerate(args) if a is not None]
    gc = torch.autograd.grad(want, [cpu[i] for i in leaves], gout)
    gt = torch.autograd.grad(got, [tpu[i] for i in leaves], gout.to(TPU))
    for i, a, b in zip(leaves, gt, gc):
        _assert_near(a, b, tol, "grad " + names[i])
    return want, dict(zip([names[i] for i in leaves], gc))


_DEFORM_TOL = [(torch.float32, 2e-6), (torch.float64, 1e-12)]
_DEFORM_CASES = {
    "plain": dict(),
    "no_mask": dict(mask=False),
    "no_bias": dict(bias=False),
    "groups": dict(c=6, o=4, groups=2),
    "offset_groups": dict(c=6, offset_groups=3),
    "both_groups_no_mask": dict(c=4, o=6, groups=2, offset_groups=2, mask=False),
    "stride2_pad_dilation": dict(h=9, w=10, stride=(2, 2), padding=(1, 2), dilation=(2, 1),
                                 groups=2, offset_groups=2),
    "rect_kernel": dict(kernel=(2, 3), stride=(1, 2), padding=(1, 0), dilation=(1, 2)),
    "kernel_1x1": dict(kernel=(1, 1), padding=(1, 1)),
    # CPU runs blocks of up to 32 images (n_parallel_imgs): 40 = 2 blocks of 20, 33 = 33
    # blocks of 1; the results must not depend on it
    "batch_40": dict(b=40, c=2, o=3, h=5, w=6),
    "batch_33": dict(b=33, c=2, o=3, h=5, w=5, mask=False),
}


@pytest.mark.parametrize("dtype,tol", _DEFORM_TOL, ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(_DEFORM_CASES))
def test_deform_conv2d_and_its_gradients_match_cpu(dtype, tol, case):
    kw = dict(_DEFORM_CASES[case])
    conv = {k: kw[k] for k in ("stride", "padding", "dilation") if k in kw}
    _deform_compare(_deform_inputs(dtype, **kw), tol, **conv)


@pytest.mark.parametrize("dtype,tol", _DEFORM_TOL, ids=["float32", "float64"])
@pytest.mark.parametrize("mask", [False, True])
def test_deform_conv2d_at_the_image_border_matches_cpu(dtype, tol, mask):
    # a 1x1 kernel sampling a 4x4 image at every pair of these coordinates: off the
    # image, on its border (-1, 0, 3, 4), inside, on and between integers
    vals = torch.tensor([-2.0, -1.5, -1.0, -0.5, 0.0, 0.25, 1.0, 2.5, 3.0, 3.5, 4.0, 4.5],
                        dtype=dtype)
    n, pad = len(vals), 4  # output n x n: (4 + 2 * 4 - 1) + 1
    base = torch.arange(n, dtype=dtype) - pad
    yy, xx = torch.meshgrid(vals, vals, indexing="ij")
    off = torch.stack([yy - base[:, None], xx - base[None, :]])[None].repeat(2, 1, 1, 1)
    g = torch.Generator().manual_seed(22)
    x = torch.randn(2, 3, 4, 4, generator=g, dtype=dtype)
    weight = torch.randn(2, 3, 1, 1, generator=g, dtype=dtype)
    m = torch.rand(2, 1, n, n, generator=g, dtype=dtype) + 0.5 if mask else None
    want, grads = _deform_compare((x, off, weight, None, m), tol, padding=pad)
    # CPU's coordinate gradient is not the derivative of its forward at -1: the value
    # there is 0, the offset's gradient is not (the case is exercised)
    row = vals.tolist().index(-1.0)
    inner = [vals.tolist().index(v) for v in (0.25, 2.5)]
    assert torch.all(want[:, :, row] == 0)
    assert torch.all(grads["offset"][:, 0, row, inner] != 0)


@pytest.mark.parametrize("mask", [False, True])
def test_deform_conv2d_of_an_empty_batch_matches_cpu(mask):
    _deform_compare(_deform_inputs(torch.float64, b=0, mask=mask), 0.0)


@pytest.mark.parametrize("dtype,tol", _DEFORM_TOL, ids=["float32", "float64"])
def test_deform_conv2d_module_matches_cpu(dtype, tol):
    torch.manual_seed(23)
    cpu = tvops.DeformConv2d(4, 6, 3, stride=2, padding=1, dilation=1, groups=2).to(dtype)
    tpu = tvops.DeformConv2d(4, 6, 3, stride=2, padding=1, dilation=1, groups=2).to(dtype)
    tpu.load_state_dict(cpu.state_dict())
    tpu = tpu.to(TPU)
    x, off, _, _, m = _deform_inputs(dtype, c=4, h=9, w=9, stride=(2, 2), padding=(1, 1),
                                     offset_groups=2)
    xc, oc, mc = (t.clone().requires_grad_() for t in (x, off, m))
    xt, ot, mt = (t.to(TPU).requires_grad_() for t in (x, off, m))
    want, got = cpu(xc, oc, mc), tpu(xt, ot, mt)
    _assert_near(got, want, tol, "output")
    gout = torch.randn(want.shape, generator=torch.Generator().manual_seed(24), dtype=dtype)
    want.backward(gout)
    got.backward(gout.to(TPU))
    for name, a, b in [("input", xt, xc), ("offset", ot, oc), ("mask", mt, mc),
                       ("weight", tpu.weight, cpu.weight), ("bias", tpu.bias, cpu.bias)]:
        assert a.grad.device.type == TPU
        _assert_near(a.grad, b.grad, tol, name)


def test_deform_conv2d_runs_on_the_device_with_the_fallback_enabled(monkeypatch):
    # with the CPU fallback on, an op without a lowering would still give CPU's values:
    # the fallback counter (asserted empty by the fixture too) and its warning tell
    monkeypatch.setattr(torch.tpu, "enable_cpu_fallback", True)
    x, off, weight, bias, m = (t.to(TPU).requires_grad_()
                               for t in _deform_inputs(torch.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = tvops.deform_conv2d(x, off, weight, bias, mask=m)
        out.sum().backward()
    assert not torchtpu.metrics()["fallbacks"]
    assert all(t.grad is not None and t.grad.device.type == TPU
               for t in (x, off, weight, bias, m))


def test_deform_conv2d_rejects_what_cpu_rejects():
    x, off, weight, bias, m = _deform_inputs(torch.float32, b=2, h=6, w=6)  # out 4 x 4
    ops = torch.ops.torchvision
    conv = (1, 1, 0, 0, 1, 1, 1, 1)
    cases = [
        (x, weight, torch.zeros(2, 19, 4, 4), m, bias),  # offset channels: not 2 * 9
        (x, weight, torch.zeros(2, 36, 4, 4), m, bias),  # 2 offset groups, 1 declared
        (x, weight, torch.zeros(2, 18, 4, 5), m, bias),  # offset's width: not the output's
        (x, weight, torch.zeros(3, 18, 4, 4), m, bias),  # offset's batch
        (x, weight, off, torch.zeros(2, 8, 4, 4), bias),  # mask channels
        (x, weight, off, torch.zeros(2, 9, 3, 4), bias),  # mask's height
    ]
    for args in cases:
        with pytest.raises(RuntimeError) as cpu_err:
            ops.deform_conv2d(*args, *conv, True)
        with pytest.raises(RuntimeError) as tpu_err:
            ops.deform_conv2d(*(a.to(TPU) for a in args), *conv, True)
        # (NotImplementedError, a RuntimeError too, would mean no lowering)
        assert type(tpu_err.value) is type(cpu_err.value)
        assert str(tpu_err.value) in str(cpu_err.value), (str(cpu_err.value),
                                                          str(tpu_err.value))
    # the backward, and torchvision's function (which derives offset_groups from the
    # offset's channels), raise as CPU's kernels do for a wrong offset
    grad = torch.zeros(2, weight.shape[0], 4, 4)
    bad = torch.zeros(2, 19, 4, 4)
    for call in (lambda d: ops._deform_conv2d_backward(
                     *(t.to(d) for t in (grad, x, weight, bad, m, bias)), *conv, True),
                 lambda d: tvops.deform_conv2d(x.to(d), bad.to(d), weight.to(d), mask=m.to(d)),
                 lambda d: tvops.deform_conv2d(x.to(d), bad[:, :5].to(d), weight.to(d))):
        with pytest.raises(RuntimeError) as cpu_err:
            call("cpu")
        with pytest.raises(RuntimeError) as tpu_err:
            call(TPU)
        assert type(tpu_err.value) is type(cpu_err.value), tpu_err.value
    # dtypes CPU's kernel does not take
    for dt in (torch.bfloat16, torch.int32):
        args = [t.to(dt) for t in (x, weight, off, m, bias)]
        with pytest.raises(RuntimeError) as cpu_err:
            ops.deform_conv2d(*args, *conv, True)
        with pytest.raises(RuntimeError) as tpu_err:
            ops.deform_conv2d(*(a.to(TPU) for a in args), *conv, True)
        assert type(tpu_err.value) is type(cpu_err.value)
        assert str(tpu_err.value) in str(cpu_err.value), (str(cpu_err.value),
                                                          str(tpu_err.value))
