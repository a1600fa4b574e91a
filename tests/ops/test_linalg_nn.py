"""linalg / nn lowerings: each case runs on CPU and on tpu; results (values and dtype) and
gradients must match."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import torchtpu  # noqa: F401
from torchtpu import _metrics

TPU = "tpu"


def _to(v, dev, rg):
    if isinstance(v, torch.Tensor):
        t = v.detach().to(dev)
        if rg and v.is_floating_point():
            t.requires_grad_(True)
        return t
    return v


def _mine():
    """Base names of the ops this file's lowerings cover (they must never fall back)."""
    from torchtpu.ops import table

    names = {op._schema.name.split("::")[1] for op, low in table().items()
             if low.fn.__module__ in ("torchtpu.ops.nn", "torchtpu.ops.linalg")}
    return names | {"native_batch_norm", "_native_batch_norm_legit", "convolution_backward",
                    "convolution_backward_overrideable", "native_layer_norm_backward",
                    "native_group_norm_backward", "native_batch_norm_backward"}


def check(fn, *args, grad=True, atol=None, rtol=None):
    """fn(*args) on cpu and tpu; compare outputs and (if grad) input gradients.

    Ops of other families (reductions...) may still run through the CPU fallback; the ops
    lowered in ops/nn.py and ops/linalg.py must not."""
    with cpu_fallback():
        return _check(fn, *args, grad=grad, atol=atol, rtol=rtol)


def _check(fn, *args, grad=True, atol=None, rtol=None):
    cpu_args = [_to(a, "cpu", grad) for a in args]
    tpu_args = [_to(a, TPU, grad) for a in args]
    _metrics.METRICS.fallbacks.clear()
    exp = fn(*cpu_args)
    got = fn(*tpu_args)
    exp_t = exp if isinstance(exp, (tuple, list)) else (exp,)
    got_t = got if isinstance(got, (tuple, list)) else (got,)
    kw = {} if atol is None else {"atol": atol, "rtol": rtol}
    for e, g in zip(exp_t, got_t):
        if isinstance(e, torch.Tensor):
            assert g.device.type == TPU
            torch.testing.assert_close(g.detach().cpu(), e.detach(), equal_nan=True, **kw)
    if grad:
        gen = torch.Generator().manual_seed(1)
        outs = [(e, g) for e, g in zip(exp_t, got_t)
                if isinstance(e, torch.Tensor) and e.requires_grad]
        gouts = [torch.randn(e.shape, generator=gen, dtype=e.dtype) for e, _ in outs]
        torch.autograd.backward([e for e, _ in outs], gouts)
        torch.autograd.backward([g for _, g in outs], [x.to(TPU) for x in gouts])
        for a, b in zip(cpu_args, tpu_args):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                assert b.grad is not None
                torch.testing.assert_close(b.grad.cpu(), a.grad, equal_nan=True, **kw)
    fell = {k.split(".")[1] for k in _metrics.METRICS.fallbacks}
    assert not (fell & _mine()), fell & _mine()
    return got


@contextlib.contextmanager
def cpu_fallback():
    old = torch.tpu.enable_cpu_fallback
    torch.tpu.enable_cpu_fallback = True
    try:
        yield
    finally:
        torch.tpu.enable_cpu_fallback = old


def r(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ------------------------------------------------------------------ linalg

A = torch.ops.aten


def test_mm_bmm_mv_dot():
    check(torch.mm, r(3, 4), r(4, 5, seed=1))
    check(torch.bmm, r(2, 3, 4), r(2, 4, 5, seed=1))
    check(torch.mv, r(3, 4), r(4, seed=1))
    check(torch.dot, r(5), r(5, seed=1))
    check(torch.vdot, r(5), r(5, seed=1), grad=False)
    check(torch.mm, r(3, 4, dtype=torch.bfloat16), r(4, 5, seed=1, dtype=torch.bfloat16), grad=False)
    check(torch.mm, torch.arange(12).reshape(3, 4), torch.arange(8).reshape(4, 2), grad=False)


def test_addmm_family():
    check(lambda s, a, b: torch.addmm(s, a, b, beta=0.5, alpha=2.0), r(5), r(3, 4), r(4, 5, seed=1))
    nan = torch.full((3, 5), float("nan"))
    check(lambda s, a, b: torch.addmm(s, a, b, beta=0), nan, r(3, 4), r(4, 5, seed=1), grad=False)
    check(lambda s, a, b: torch.addmv(s, a, b, alpha=3), r(3), r(3, 4), r(4, seed=1))
    check(lambda s, a, b: torch.baddbmm(s, a, b, beta=2), r(2, 3, 5), r(2, 3, 4), r(2, 4, 5, seed=1))
    check(lambda s, a, b: torch.addbmm(s, a, b), r(3, 5), r(2, 3, 4), r(2, 4, 5, seed=1), grad=False)


def test_matmul_linear():
    check(torch.matmul, r(2, 3, 4), r(4, 5, seed=1))
    check(torch.matmul, r(2, 1, 3, 4), r(5, 4, 2, seed=1))
    check(F.linear, r(2, 3), r(5, 3, seed=1), r(5, seed=2))


def test_matmul_float32_full_precision():
    # values whose bf16-pass products would lose digits
    a = torch.full((4, 64), 1.0 + 2 ** -20)
    b = torch.full((64, 4), 1.0 - 2 ** -20)
    check(torch.mm, a, b, grad=False, atol=0, rtol=0)


# ------------------------------------------------------------------ convolution

@pytest.mark.parametrize("case", [
    dict(nd=1, stride=2, padding=1),
    dict(nd=2, stride=1, padding=1, dilation=2, groups=2),
    dict(nd=2, stride=2, padding=0, bias=False),
    dict(nd=3, stride=1, padding=1, tol=1e-4),
])
def test_conv(case):
    nd = case["nd"]
    g = case.get("groups", 1)
    x = r(2, 4, *([6] * nd))
    w = r(6, 4 // g, *([3] * nd), seed=1)
    b = r(6, seed=2) if case.get("bias", True) else None
    f = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    kw = dict(stride=case["stride"], padding=case["padding"], dilation=case.get("dilation", 1), groups=g)
    if b is None:
        check(lambda x, w: f(x, w, None, **kw), x, w)
    else:
        check(lambda x, w, b: f(x, w, b, **kw), x, w, b, atol=case.get("tol"), rtol=case.get("tol"))


def test_conv_transpose():
    x = r(2, 4, 5, 5)
    w = r(4, 3, 3, 3, seed=1)
    b = r(6, seed=2)
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2),
          x, w, b)
    check(lambda x, w: F.conv_transpose1d(x, w, stride=3, dilation=2), r(1, 4, 5), r(4, 2, 3, seed=1))


def test_conv_weight_only_grad():
    # input does not require grad: convolution_backward output_mask = [False, True, True]
    x = r(1, 2, 5, 5)
    w = r(3, 2, 3, 3, seed=1).requires_grad_()
    wt = w.detach().to(TPU).requires_grad_()
    out_c = F.conv2d(x, w)
    out_t = F.conv2d(x.to(TPU), wt)
    go = r(*out_c.shape, seed=3)
    out_c.backward(go)
    out_t.backward(go.to(TPU))
    torch.testing.assert_close(wt.grad.cpu(), w.grad)


# ------------------------------------------------------------------ pooling

def test_max_pool():
    x = r(2, 3, 7, 7)
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x)
    check(lambda x: F.max_pool2d(x, 2, ceil_mode=True, return_indices=True), x)
    check(lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2, return_indices=True), x)
    check(lambda x: F.max_pool3d(x, 2, return_indices=True), r(1, 2, 4, 5, 5), grad=False)
    xi = torch.tensor([[[1.0, float("nan"), 2.0, 3.0]]])
    check(lambda x: F.max_pool1d(x, 2, return_indices=True), xi, grad=False)


def test_avg_pool():
    x = r(2, 3, 7, 7)
    check(lambda x: F.avg_pool2d(x, 3, 2, 1), x)
    check(lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), x)
    check(lambda x: F.avg_pool2d(x, 2, divisor_override=3), x)
    check(lambda x: F.avg_pool1d(x, 3, 2, 1), r(2, 3, 8))
    check(lambda x: F.avg_pool3d(x, 2, ceil_mode=True), r(1, 2, 5, 5, 5))


def test_adaptive_avg_pool():
    check(lambda x: F.adaptive_avg_pool2d(x, (3, 2)), r(2, 3, 7, 5))
    check(lambda x: F.adaptive_avg_pool2d(x, 1), r(2, 3, 4, 4))
    check(lambda x: F.adaptive_avg_pool1d(x, 3), r(2, 3, 7))
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)), r(1, 2, 5, 4, 3))


# ------------------------------------------------------------------ softmax / norms

def test_softmax():
    check(lambda x: torch.softmax(x, 1), r(3, 4, 5))
    check(lambda x: torch.log_softmax(x, -1), r(3, 4))
    check(lambda x: torch.softmax(x, 0, dtype=torch.float32), r(3, 4, dtype=torch.float16), grad=False)
    check(lambda x: torch.log_softmax(x, 1), r(3, 4, dtype=torch.bfloat16))


def test_layer_norm():
    check(lambda x, w, b: F.layer_norm(x, (4, 5), w, b), r(2, 3, 4, 5), r(4, 5, seed=1), r(4, 5, seed=2))
    check(lambda x: F.layer_norm(x, (5,)), r(3, 5))
    check(lambda x, w, b: F.layer_norm(x, (8,), w, b), r(2, 8, dtype=torch.bfloat16),
          r(8, seed=1, dtype=torch.bfloat16), r(8, seed=2, dtype=torch.bfloat16), atol=2e-2, rtol=2e-2)


def test_group_norm():
    check(lambda x, w, b: F.group_norm(x, 2, w, b), r(2, 4, 3, 3), r(4, seed=1), r(4, seed=2))
    check(lambda x: F.group_norm(x, 3), r(2, 6, 5))


def test_batch_norm_train_updates_running_stats():
    x, w, b = r(4, 3, 5, 5), r(3, seed=1), r(3, seed=2)
    rm_c, rv_c = r(3, seed=3), r(3, seed=4).abs()
    rm_t, rv_t = rm_c.to(TPU), rv_c.to(TPU)
    check(lambda x, w, b: F.batch_norm(x, rm_c if x.device.type == "cpu" else rm_t,
                                       rv_c if x.device.type == "cpu" else rv_t, w, b,
                                       training=True, momentum=0.3), x, w, b)
    torch.testing.assert_close(rm_t.cpu(), rm_c)
    torch.testing.assert_close(rv_t.cpu(), rv_c)


def test_batch_norm_eval_and_no_stats():
    x, w, b = r(4, 3, 5), r(3, seed=1), r(3, seed=2)
    rm, rv = r(3, seed=3), r(3, seed=4).abs()
    check(lambda x, w, b: F.batch_norm(x, rm.to(x.device), rv.to(x.device), w, b, training=False),
          x, w, b)
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b)


def test_batch_norm_module():
    torch.manual_seed(0)
    m = torch.nn.BatchNorm2d(3)
    mt = torch.nn.BatchNorm2d(3).to(TPU)
    x = r(2, 3, 4, 4)
    for _ in range(2):
        torch.testing.assert_close(mt(x.to(TPU)).cpu(), m(x))
    torch.testing.assert_close(mt.running_mean.cpu(), m.running_mean)
    torch.testing.assert_close(mt.running_var.cpu(), m.running_var)
    assert mt.num_batches_tracked.cpu().item() == 2


# ------------------------------------------------------------------ activations

@pytest.mark.parametrize("fn", [
    F.relu, F.gelu, lambda x: F.gelu(x, approximate="tanh"), F.silu, F.mish,
    lambda x: F.hardtanh(x, -0.5, 0.7), lambda x: F.leaky_relu(x, 0.2),
    lambda x: F.elu(x, 1.3), F.selu, lambda x: F.softplus(x, 2.0, 1.0),
    F.hardswish, F.hardsigmoid, lambda x: F.threshold(x, 0.1, -2.0),
])
def test_activation(fn):
    check(fn, r(4, 5) * 3)


def test_activation_bf16():
    # CPU's bf16 backward kernels round some intermediates to bf16: a few ulps apart
    check(F.gelu, r(8, dtype=torch.bfloat16), atol=2e-2, rtol=2e-2)
    check(F.silu, r(8, dtype=torch.bfloat16), atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------ embedding / losses

@pytest.mark.parametrize("kw", [dict(), dict(padding_idx=1), dict(scale_grad_by_freq=True)])
def test_embedding_backward(kw):
    idx = torch.tensor([[1, 2, 1], [0, 3, 1]])
    check(lambda w, i: F.embedding(i, w, **kw), r(5, 3), idx)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss(reduction):
    x = torch.log_softmax(r(4, 5), 1)
    t = torch.tensor([1, 0, 4, 2])
    check(lambda x, t: F.nll_loss(x, t, reduction=reduction), x, t)
    w = r(5, seed=2).abs()
    check(lambda x, t: F.nll_loss(x, t, w.to(x.device), reduction=reduction, ignore_index=4), x, t)


def test_nll_loss2d_and_cross_entropy():
    x = r(2, 3, 4, 4)
    t = torch.randint(0, 3, (2, 4, 4), generator=torch.Generator().manual_seed(0))
    check(lambda x, t: F.nll_loss(x, t), x, t)
    check(lambda x, t: F.cross_entropy(x, t), r(4, 5), torch.tensor([1, 0, 4, 2]))


def test_mse_bce():
    check(lambda a, b: F.mse_loss(a, b), r(3, 4), r(3, 4, seed=1))
    check(lambda a, b: F.mse_loss(a, b, reduction="none"), r(3, 4), r(3, 4, seed=1))
    p = torch.sigmoid(r(3, 4))
    t = torch.rand(3, 4, generator=torch.Generator().manual_seed(1))
    check(lambda a, b: F.binary_cross_entropy(a, b), p, t)
    w = r(3, 4, seed=2).abs()
    check(lambda a, b: F.binary_cross_entropy(a, b, w.to(a.device), reduction="sum"), p, t)


# ------------------------------------------------------------------ upsampling

def test_upsample():
    x = r(1, 2, 3, 4)
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), x)
    check(lambda x: F.interpolate(x, size=(5, 7), mode="nearest"), x)
    check(lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=False), x)
    check(lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear", align_corners=True), x)
    check(lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear", align_corners=False), x)
    check(lambda x: F.interpolate(x, scale_factor=1.7, mode="nearest"), x)
    check(lambda x: F.interpolate(x, size=(2, 3), mode="bilinear"), r(1, 2, 5, 7))


# ------------------------------------------------------------------ attention

def test_sdpa():
    q, k, v = r(2, 2, 4, 8), r(2, 2, 4, 8, seed=1), r(2, 2, 5, 8, seed=2)[:, :, :4]
    mask = r(4, 4, seed=3) > 0
    check(F.scaled_dot_product_attention, q, k, v)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3), q, k, v)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device)), q, k, v)


# ------------------------------------------------------------------ training steps

class _CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.flatten(1))


def _train_compare(make, x, y, loss_fn, steps=2):
    torch.manual_seed(0)
    mc = make()
    mt = make()
    mt.load_state_dict(mc.state_dict())
    mt = mt.to(TPU)
    oc = torch.optim.SGD(mc.parameters(), lr=0.1, momentum=0.9)
    ot = torch.optim.SGD(mt.parameters(), lr=0.1, momentum=0.9)
    xt, yt = x.to(TPU), y.to(TPU)
    for _ in range(steps):
        oc.zero_grad()
        ot.zero_grad()
        lc = loss_fn(mc(x), y)
        lt = loss_fn(mt(xt), yt)
        lc.backward()
        lt.backward()
        torch.testing.assert_close(lt.cpu(), lc, atol=1e-5, rtol=1e-4)
        for (n, pc), pt in zip(mc.named_parameters(), mt.parameters()):
            torch.testing.assert_close(pt.grad.cpu(), pc.grad, atol=1e-5, rtol=1e-4, msg=n)
        oc.step()
        ot.step()
    for bc, bt in zip(mc.buffers(), mt.buffers()):
        torch.testing.assert_close(bt.cpu(), bc, atol=1e-5, rtol=1e-4)


def test_cnn_training_step():
    with cpu_fallback():
        _train_compare(_CNN, r(2, 3, 8, 8), torch.tensor([1, 3]), F.cross_entropy)


def test_transformer_training_step():
    def make():
        return torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0,
                                                activation="gelu", batch_first=True)

    with cpu_fallback():
        _train_compare(make, r(2, 5, 16), r(2, 5, 16, seed=1), F.mse_loss)
