"""Training recipes that must give the same results on tpu as on CPU PyTorch.

* An optimizer built *before* ``model.to("tpu")`` (accelerate's ``prepare(model, optimizer)``,
  Lightning Fabric, many scripts) must train the moved model: ``Module.to`` keeps every
  Parameter object, as ``model.to("cuda")`` does.
* ``torch.amp.GradScaler("tpu")`` with float16/bfloat16 autocast: same losses, scales and
  parameters as the same loop on CPU, skipped steps and scale growth included.
"""

import copy

import pytest
import torch

# eager_mode tests run in DEFER_AND_FUSE too in the default run (tests/conftest.py)
DEFER_BY_DEFAULT = True

TPU = "tpu"


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _opt(name, params):
    if name == "SGD":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.05)


# ------------------------------------------------- parameter identity across Module.to


@pytest.mark.parametrize("opt_name", ["SGD", "AdamW"])
def test_optimizer_built_before_module_to_trains(eager_mode, opt_name):
    torch.manual_seed(1)
    x, y = torch.randn(8, 6), torch.randn(8, 3)

    def run(dev):
        model = _mlp()
        opt = _opt(opt_name, model.parameters())  # before the move
        model.to(dev)
        xs, ys = x.to(dev), y.to(dev)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xs), ys)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in model.parameters()]

    cpu_losses, cpu_params = run("cpu")
    tpu_losses, tpu_params = run(TPU)
    assert cpu_losses[-1] < cpu_losses[0]
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(tpu_params, cpu_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_module_to_and_back_keeps_parameters_and_grads():
    model = _mlp()
    model[0].bias.requires_grad_(False)
    before = list(model.parameters())
    model(torch.randn(2, 6)).sum().backward()
    grads = [p.grad for p in before]
    w = model[0].weight
    w.my_attr = "kept"  # Python attributes stay with the object, as with .data =
    with torch.no_grad():
        w.mul_(1.0)  # version 1
    version = w._version

    model.tpu()
    assert all(p is q for p, q in zip(model.parameters(), before))
    assert all(p.device.type == TPU for p in before)
    for p, g in zip(before, grads):
        assert p.grad is g  # the gradient object too, moved
        if g is not None:
            assert g.device.type == TPU
    assert model[0].bias.requires_grad is False and w.requires_grad is True
    assert isinstance(w, torch.nn.Parameter) and w.my_attr == "kept"
    assert w._version == version
    assert w.is_leaf and w.grad_fn is None

    model.to("cpu")
    assert all(p is q for p, q in zip(model.parameters(), before))
    assert all(p.device.type == "cpu" for p in before)
    assert all(p.grad is g for p, g in zip(before, grads))
    assert w.grad.device.type == "cpu"
    # the values survived the round trip
    ref = _mlp()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach())


def test_module_to_dtype_on_tpu_keeps_parameters():
    model = _mlp()
    before = list(model.parameters())
    model.to(TPU)
    model(torch.randn(2, 6, device=TPU)).sum().backward()
    g = before[0].grad
    model.to(torch.float64)
    ref = _mlp().to(torch.float64)  # CPU: .to(dtype) keeps the objects too
    assert all(p is q for p, q in zip(model.parameters(), before))
    assert all(p.dtype == torch.float64 and p.device.type == TPU for p in before)
    assert before[0].grad is g and g.dtype == torch.float64
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach())


def test_tensor_hooks_survive_module_to():
    def run(dev):
        model = _mlp()
        seen = []
        model[0].weight.register_hook(lambda g: seen.append(("pre", g.sum().item())))
        model[0].weight.register_post_accumulate_grad_hook(
            lambda p: seen.append(("post", p.grad.sum().item())))
        model.to(dev)
        model(torch.ones(2, 6, device=dev)).sum().backward()
        return seen

    cpu, tpu = run("cpu"), run(TPU)
    assert [k for k, _ in tpu] == [k for k, _ in cpu] == ["pre", "post"]
    # float32 sums read as Python floats: float32's tolerance (the summation order of
    # XLA's reduction is not CPU's)
    torch.testing.assert_close([v for _, v in tpu], [v for _, v in cpu], rtol=1.3e-6,
                               atol=1e-5)


@pytest.mark.parametrize("opt_name", ["SGD", "AdamW"])
def test_load_state_dict_after_module_to(opt_name):
    torch.manual_seed(3)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    src = _mlp(seed=7)
    src_opt = _opt(opt_name, src.parameters())
    torch.nn.functional.mse_loss(src(x), y).backward()
    src_opt.step()

    def run(dev):
        model = _mlp()
        opt = _opt(opt_name, model.parameters())
        model.to(dev)
        model.load_state_dict(src.state_dict())
        opt.load_state_dict(copy.deepcopy(src_opt.state_dict()))
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in model.parameters()]

    (cl, cp), (tl, tp) = run("cpu"), run(TPU)
    torch.testing.assert_close(tl, cl, rtol=1e-5, atol=1e-6)
    for a, b in zip(tp, cp):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_tied_weights_stay_tied_with_optimizer_built_before():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(20, 8)
            self.head = torch.nn.Linear(8, 20, bias=False)
            self.head.weight = self.emb.weight

    ids = torch.randint(0, 20, (3, 5), generator=torch.Generator().manual_seed(0))

    def run(dev):
        m = Tied()
        w = m.emb.weight
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        m.to(dev)
        assert m.emb.weight is w and m.head.weight is w
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(
                m.head(m.emb(ids.to(dev))).view(-1, 20), ids.view(-1).to(dev))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, w.detach().cpu()

    (cl, cw), (tl, tw) = run("cpu"), run(TPU)
    torch.testing.assert_close(tl, cl, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tw, cw, rtol=1e-5, atol=1e-6)


def test_buffers_move_as_on_cpu():
    def run(dev):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m.to(dev)
        for _ in range(2):
            opt.zero_grad()
            m(torch.arange(32.0).view(8, 4).to(dev) / 10).sum().backward()
            opt.step()
        return {k: v.cpu() for k, v in m.state_dict().items()}

    cpu, tpu = run("cpu"), run(TPU)
    assert cpu.keys() == tpu.keys()
    for k in cpu:
        torch.testing.assert_close(tpu[k], cpu[k], rtol=1e-4, atol=1e-5)


def test_backward_through_graph_built_before_the_move_raises():
    # CPU->CUDA would misbehave too; here the old graph must not silently lose gradients
    model = torch.nn.Linear(3, 1)
    loss = model(torch.randn(2, 3)).sum()
    model.to(TPU)
    with pytest.raises(RuntimeError, match="moved between cpu and tpu"):
        loss.backward()


# ------------------------------------------------------------------ GradScaler ("tpu")


def _scaler_loop(dev, dtype, steps=7, inf_at=(2,), growth_interval=2):
    """A small autocast + GradScaler training loop; an inf is injected into one gradient
    at the steps in ``inf_at`` (those steps must be skipped and the scale backed off)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(dev, init_scale=2.0**10, growth_interval=growth_interval)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(6, 8, generator=g).to(dev) for _ in range(steps)]
    ys = [torch.randn(6, 4, generator=g).to(dev) for _ in range(steps)]
    losses, scales, params = [], [], []
    for step in range(steps):
        opt.zero_grad()
        with torch.autocast(dev, dtype=dtype):
            out = model(xs[step])
        loss = torch.nn.functional.mse_loss(out.float(), ys[step])
        scaler.scale(loss).backward()
        if step in inf_at:
            with torch.no_grad():
                model[2].bias.grad[1] = float("inf")
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
        params.append([p.detach().float().cpu().clone() for p in model.parameters()])
    return losses, scales, params, scaler.state_dict()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_grad_scaler_matches_cpu(eager_mode, dtype):
    cl, cs, cp, cstate = _scaler_loop("cpu", dtype)
    tl, ts, tp, tstate = _scaler_loop(TPU, dtype)
    # the loop exercised what it should: a skipped step (scale halved) and growth
    assert cs[2] == cs[1] / 2 and max(cs) > cs[0] * 1.5
    assert all(torch.equal(a, b) for a, b in zip(cp[2], cp[1]))  # step 2 skipped
    assert ts == cs  # scale values exactly
    assert tstate == cstate  # scale, growth tracker, factors
    tol = dict(rtol=1e-2, atol=1e-3) if dtype == torch.bfloat16 else dict(rtol=2e-3, atol=2e-4)
    torch.testing.assert_close(tl, cl, **tol)
    for step_t, step_c in zip(tp, cp):
        for a, b in zip(step_t, step_c):
            torch.testing.assert_close(a, b, **tol)
    assert all(torch.equal(a, b) for a, b in zip(tp[2], tp[1]))  # skipped on tpu too


def test_torch_tpu_amp_namespace():
    from torch.tpu.amp import GradScaler, autocast

    assert isinstance(GradScaler(), torch.amp.GradScaler) and GradScaler()._device == TPU
    with autocast(dtype=torch.bfloat16):
        y = torch.nn.functional.linear(torch.randn(2, 3, device=TPU), torch.randn(4, 3, device=TPU))
    assert y.dtype == torch.bfloat16


@pytest.mark.parametrize("inv", [0.25, 1.0])
def test_amp_foreach_non_finite_check_and_unscale_matches_cpu(inv):
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, 3, generator=g) * 1000, torch.randn(7, generator=g, dtype=torch.float64),
             (torch.randn(4, generator=g) * 100).half(), torch.randn(2, 2, generator=g).bfloat16(),
             torch.randn(6, 4, generator=g).t()]  # a non-contiguous one
    for bad in (None, float("inf"), float("nan"), -float("inf")):
        cpu = [t.clone() for t in grads]
        if bad is not None:
            cpu[2][1] = bad
        tpu = [t.to(TPU) for t in cpu]
        tpu[4] = cpu[4].t().contiguous().to(TPU).t()  # same view as on CPU
        cf, tf = torch.zeros(1), torch.zeros(1, device=TPU)
        ci, ti = torch.full((1,), inv), torch.full((1,), inv, device=TPU)
        r = torch._amp_foreach_non_finite_check_and_unscale_(cpu, cf, ci)
        rt = torch._amp_foreach_non_finite_check_and_unscale_(tpu, tf, ti)
        assert r is None and rt is None
        assert torch.equal(tf.cpu(), cf)
        for a, b in zip(tpu, cpu):
            assert a.dtype == b.dtype and a.stride() == b.stride()
            torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0, equal_nan=True)
    # found_inf is never reset by the op (zeroing it is the caller's job)
    tf = torch.ones(1, device=TPU)
    torch._amp_foreach_non_finite_check_and_unscale_([torch.ones(2, device=TPU)], tf, ti)
    assert tf.item() == 1.0


def test_amp_foreach_unscale_of_views_writes_the_base():
    # gradients that are views of one flat buffer (DDP buckets, flat-parameter wrappers)
    base_c = torch.arange(12.0).view(3, 4)
    base_t = base_c.to(TPU)
    fc, ft = torch.zeros(()), torch.zeros((), device=TPU)
    torch._amp_foreach_non_finite_check_and_unscale_([base_c[0], base_c[1:, 0], base_c[2, 1:]],
                                                     fc, torch.full((), 0.5))
    torch._amp_foreach_non_finite_check_and_unscale_([base_t[0], base_t[1:, 0], base_t[2, 1:]],
                                                     ft, torch.full((), 0.5, device=TPU))
    torch.testing.assert_close(base_t.cpu(), base_c, rtol=0, atol=0)
    # overlapping views are updated one after the other on CPU: refused, not approximated
    with pytest.raises(NotImplementedError, match="overlapping"):
        torch._amp_foreach_non_finite_check_and_unscale_([base_t[1], base_t[:, 3]], ft,
                                                         torch.full((), 0.5, device=TPU))


def test_amp_update_scale_matches_cpu():
    def run(dev, found, scale0=1024.0, interval=3, growth=2.0, backoff=0.5):
        s = torch.full((1,), scale0, device=dev)
        t = torch.zeros(1, dtype=torch.int32, device=dev)
        out = []
        for f in found:
            r = torch._amp_update_scale_(s, t, torch.full((1,), float(f), device=dev),
                                         growth, backoff, interval)
            assert r is s
            out.append((s.item(), t.item()))
        return out

    seq = [0, 0, 0, 1, 0, 0, 0, 0, float("nan"), 0, 0, 0]
    assert run(TPU, seq) == run("cpu", seq)
    # growth past float32's range keeps the scale; odd factors round like float*double
    big = [0] * 6
    assert run(TPU, big, scale0=3e38, interval=1) == run("cpu", big, scale0=3e38, interval=1)
    assert run(TPU, seq, scale0=3.3, growth=1.1, backoff=0.3) == \
        run("cpu", seq, scale0=3.3, growth=1.1, backoff=0.3)


def test_amp_ops_errors_match_cpu():
    def err(dev, fn):
        with pytest.raises(Exception) as e:
            fn(dev)
            if dev != "cpu":
                torch.tpu.synchronize()
        return type(e.value), str(e.value)

    cases = [
        lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
            [torch.ones(2, device=d)], torch.zeros(1, dtype=torch.float64, device=d),
            torch.ones(1, device=d)),
        lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
            [torch.ones(2, device=d)], torch.zeros(2, device=d), torch.ones(1, device=d)),
        lambda d: torch._amp_update_scale_(torch.ones(1, device=d), torch.zeros(1, device=d),
                                           torch.zeros(1, device=d), 2.0, 0.5, 3),
    ]
    for case in cases:
        assert err(TPU, case) == err("cpu", case)


def test_parameter_that_cannot_be_kept_warns():
    # a C++ weak reference forbids taking over the TensorImpl: the parameter is replaced
    # (PyTorch's behaviour without our patch), loudly
    model = torch.nn.Linear(3, 2)
    ref = torch._C._WeakTensorRef(model.weight)
    with pytest.warns(UserWarning, match="could not keep a Parameter object"):
        model.to(TPU)
    assert model.weight.device.type == TPU and model.bias.device.type == TPU
    del ref
