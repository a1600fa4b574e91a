"""Regressions found by trying to break the backend like a user; each vs CPU."""

import torch


def both(fn):
    return fn("cpu"), fn("tpu")


def assert_same_result_or_error(run):
    """``run(device)`` returns tensors or an error message: tpu must give CPU's."""
    c, t = both(run)
    if isinstance(c, str):
        assert t == c
    else:
        for a, b in zip(c, t):
            torch.testing.assert_close(b, a)


def test_batchnorm_backward_when_input_needs_no_grad():
    def run(dev):
        torch.manual_seed(0)
        bn = torch.nn.BatchNorm2d(3).to(dev)
        x = torch.randn(4, 3, 5, 5).to(dev)  # a first layer: input needs no grad
        bn(x).pow(2).sum().backward()
        return bn.weight.grad.cpu(), bn.bias.grad.cpu(), bn.running_mean.cpu()

    c, t = both(run)
    for a, b in zip(c, t):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-5)


def test_sign_of_nan_and_negative_zero():
    c, t = both(lambda d: torch.sign(torch.tensor([float("nan"), -0.0, -2.0, 3.0], device=d)))
    assert t.cpu().tolist() == c.tolist()


def test_shift_operators():
    def run(d):
        x = torch.tensor([1, -8, 3, 100], device=d)
        return [(x << 2).cpu(), (x >> 1).cpu(), (x << torch.tensor([1, 2, 3, 70], device=d)).cpu()]

    c, t = both(run)
    for a, b in zip(c, t):
        assert torch.equal(a, b)


import pytest  # noqa: E402


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
@pytest.mark.parametrize("case", ["index", "index_neg", "index_select", "gather", "embedding",
                                  "scatter_add", "index_put"])
def test_out_of_range_index_raises_never_a_value(mode, case):
    """CPU raises for each; tpu raises too (at the op in DEBUG, else at the next sync)."""
    def run(dev):
        x = torch.arange(5.0, device=dev)
        i = torch.tensor([7], device=dev)
        if case == "index":
            return x[i]
        if case == "index_neg":
            return x[torch.tensor([-7], device=dev)]
        if case == "index_select":
            return x.index_select(0, i)
        if case == "gather":
            return x.gather(0, i)
        if case == "embedding":
            return torch.nn.functional.embedding(i, x.view(5, 1))
        if case == "scatter_add":
            return torch.zeros(3, device=dev).scatter_add_(0, i, torch.ones(1, device=dev))
        x[torch.tensor([-6], device=dev)] = 1.0
        return x

    with pytest.raises((IndexError, RuntimeError)):
        run("cpu")
    with torch.tpu.set_eager_mode(mode):
        with pytest.raises((IndexError, RuntimeError), match="out of (bounds|range)"):
            run("tpu").cpu()
    # the error was consumed: the next program runs normally
    assert torch.arange(3.0, device="tpu")[torch.tensor([2], device="tpu")].item() == 2.0


def test_module_to_tpu_keeps_tied_parameters():
    """Tied weights (embedding / LM head) stay one Parameter after .to("tpu")."""
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(20, 8)
            self.head = torch.nn.Linear(8, 20, bias=False)
            self.head.weight = self.emb.weight

    torch.manual_seed(0)
    ids = torch.randint(0, 20, (3, 5))
    grads = {}
    for dev in ("cpu", "tpu"):
        m = Tied().to(dev) if dev == "cpu" else Tied().to(dev)
        torch.manual_seed(0)
        m = Tied()
        m.to(dev)
        assert m.head.weight is m.emb.weight
        assert len(list(m.parameters())) == 1
        torch.nn.functional.cross_entropy(m.head(m.emb(ids.to(dev))).view(-1, 20),
                                          ids.view(-1).to(dev)).backward()
        grads[dev] = m.emb.weight.grad.cpu()
    torch.testing.assert_close(grads["tpu"], grads["cpu"])


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
def test_recurrent_layers_forward_backward(cls):
    import copy

    torch.manual_seed(0)
    m = cls(5, 7, num_layers=2, batch_first=True)
    x = torch.randn(3, 4, 5)
    res = {}
    for dev in ("cpu", "tpu"):
        mm = copy.deepcopy(m).to(dev)
        xx = x.clone().to(dev).requires_grad_(True)
        out, h = mm(xx)
        (out.pow(2).sum() + (h[0] if isinstance(h, tuple) else h).sum()).backward()
        res[dev] = [out.detach().cpu(), xx.grad.cpu()] + [p.grad.cpu() for p in mm.parameters()]
    for a, b in zip(res["cpu"], res["tpu"]):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_repeat_interleave_tensor_repeats():
    for dev in ("cpu", "tpu"):
        x = torch.tensor([[1, 2], [3, 4]], device=dev)
        r = torch.tensor([1, 2], device=dev)
        assert torch.repeat_interleave(x, r, dim=0).tolist() == [[1, 2], [3, 4], [3, 4]]
        assert torch.repeat_interleave(torch.tensor([2, 0, 3], device=dev)).tolist() == \
            [0, 0, 2, 2, 2]


def test_bincount():
    for weights in (None, torch.tensor([0.5, 1.0, 2.0, 3.0]),
                    torch.tensor([0.5, 1.0, 2.0, 3.0], dtype=torch.float64)):
        x = torch.tensor([0, 2, 2, 5])
        c = torch.bincount(x, weights, minlength=7)
        t = torch.bincount(x.to("tpu"), None if weights is None else weights.to("tpu"),
                           minlength=7)
        torch.testing.assert_close(t.cpu(), c)


@pytest.mark.parametrize("cls,kw", [(torch.optim.Adam, {}),
                                    (torch.optim.AdamW, {"weight_decay": 0.1}),
                                    (torch.optim.Adam, {"amsgrad": True, "weight_decay": 0.01})])
def test_fused_adam(cls, kw):
    import copy

    torch.manual_seed(0)
    m = torch.nn.Linear(6, 3)
    res = {}
    for dev in ("cpu", "tpu"):
        mm = copy.deepcopy(m).to(dev)
        opt = cls(mm.parameters(), lr=1e-2, fused=True, **kw)
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1)).to(dev)
        for _ in range(3):
            opt.zero_grad()
            mm(x).pow(2).sum().backward()
            opt.step()
        res[dev] = mm.weight.detach().cpu()
    torch.testing.assert_close(res["tpu"], res["cpu"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", [torch._fused_adam_, torch._fused_adamw_])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_fused_adam_float64_bias_correction(op, amsgrad):
    # float64 parameters: the bias corrections were computed in float32, which put the
    # updated parameters ~6.5e-9 off CPU's (0.49900000663 instead of 0.49900000010 for
    # lr 1e-3 at step 1)
    def run(dev):
        f64 = dict(dtype=torch.float64, device=dev)
        p = [torch.tensor([0.5, -0.25], **f64), torch.tensor([[1.5, 2.0]], **f64)]
        g = [torch.tensor([0.1, 0.2], **f64), torch.tensor([[-0.3, 1e-3]], **f64)]
        m, v = [torch.zeros_like(t) for t in p], [torch.zeros_like(t) for t in p]
        vmax = [torch.zeros_like(t) for t in p] if amsgrad else []
        steps = [torch.tensor(0.0, device=dev) for _ in p]
        for _ in range(3):
            for s in steps:
                s.add_(1)
            op(p, g, m, v, vmax, steps, lr=0.001, beta1=0.9, beta2=0.999, weight_decay=0.01,
               eps=1e-8, amsgrad=amsgrad, maximize=False)
        return [t.cpu() for t in p + m + v + vmax]

    torch.testing.assert_close(run("tpu"), run("cpu"), atol=1e-14, rtol=1e-12)


@pytest.mark.parametrize("cls,kw", [
    (torch.optim.SGD, {}),
    (torch.optim.SGD, {"momentum": 0.9, "dampening": 0.5, "weight_decay": 0.1}),
    (torch.optim.SGD, {"momentum": 0.9, "nesterov": True, "maximize": True}),
    (torch.optim.SGD, {"lr": torch.tensor(0.05), "momentum": 0.5}),
    (torch.optim.Adagrad, {}),
    (torch.optim.Adagrad, {"lr_decay": 0.5, "weight_decay": 0.1, "maximize": True}),
    (torch.optim.Adagrad, {"initial_accumulator_value": 0.1, "lr": torch.tensor(0.05)}),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_sgd_adagrad(cls, kw, dtype):
    # _fused_sgd_ / _fused_adagrad_ (SGD/Adagrad(fused=True)): parameters and state
    # after 3 steps equal CPU's fused kernels
    import copy

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3)).to(dtype)
    res = {}
    for dev in ("cpu", "tpu"):
        mm = copy.deepcopy(m).to(dev)
        kwd = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        opt = cls(mm.parameters(), **{"lr": 0.1, **kwd}, fused=True)
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1)).to(dev, dtype)
        for _ in range(3):
            opt.zero_grad()
            mm(x).pow(2).sum().backward()
            opt.step()
        res[dev] = [p.detach().cpu() for p in mm.parameters()] + \
            [v.detach().cpu() for p in mm.parameters() for v in opt.state[p].values()]
    tol = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-10}
    torch.testing.assert_close(res["tpu"], res["cpu"], **tol)


@pytest.mark.parametrize("inf", [False, True])
def test_fused_optimizers_grad_scale_found_inf(inf):
    # AMP arguments of _fused_sgd_ / _fused_adagrad_ / _fused_adamw_: gradients divided by
    # grad_scale, in place; found_inf != 0 leaves every parameter, state tensor and
    # gradient as it was
    def run(dev):
        g = torch.Generator().manual_seed(2)
        ps = [torch.randn(4, 3, generator=g).to(dev), torch.randn(5, generator=g).to(dev)]
        gs = [torch.randn(4, 3, generator=g).to(dev) * 8, torch.randn(5, generator=g).to(dev) * 8]
        bufs = [torch.randn(4, 3, generator=g).to(dev), torch.randn(5, generator=g).to(dev)]
        sums = [torch.rand(4, 3, generator=g).to(dev), torch.rand(5, generator=g).to(dev)]
        steps = [torch.tensor(3.0).to(dev), torch.tensor(3.0).to(dev)]
        amp = dict(grad_scale=torch.tensor(8.0).to(dev), found_inf=torch.tensor(float(inf)).to(dev))
        sp = [p.clone() for p in ps]
        torch._fused_sgd_(sp, gs, bufs, weight_decay=0.1, momentum=0.9, lr=0.1, dampening=0.0,
                          nesterov=True, maximize=False, is_first_step=False, **amp)
        ap = [p.clone() for p in ps]
        torch._fused_adagrad_(ap, gs, sums, steps, lr=0.1, lr_decay=0.01, weight_decay=0.1,
                              eps=1e-10, maximize=True, **amp)
        gs2 = [t * 64 for t in gs]
        mp = [p.clone() for p in ps]
        ms = [torch.zeros_like(p) for p in ps]
        torch._fused_adamw_(mp, gs2, ms, [m.clone() for m in ms], [], steps, lr=0.1, beta1=0.9,
                            beta2=0.99, weight_decay=0.1, eps=1e-8, amsgrad=False,
                            maximize=False, **amp)
        # the gradients come back unscaled (each op divided them once), unless found_inf
        return [t.cpu() for t in sp + bufs + ap + sums + mp + ms + gs + gs2]

    torch.testing.assert_close(run("tpu"), run("cpu"), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("pad", [None, 2])
def test_embedding_bag_forward_backward(mode, pad):
    import copy

    torch.manual_seed(0)
    eb = torch.nn.EmbeddingBag(10, 3, mode=mode, padding_idx=pad)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    off = torch.tensor([0, 4, 4, 6])  # includes an empty bag
    res = {}
    for dev in ("cpu", "tpu"):
        m = copy.deepcopy(eb).to(dev)
        o = m(idx.to(dev), off.to(dev))
        (o * torch.arange(3.0, device=dev)).sum().backward()
        res[dev] = (o.detach().cpu(), m.weight.grad.cpu())
    for a, b in zip(res["cpu"], res["tpu"]):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("transposed", [False, True])
def test_linalg_solve_gradients(transposed):
    torch.manual_seed(0)
    a0, b0 = torch.randn(4, 4), torch.randn(4, 2)
    grads = {}
    for dev in ("cpu", "tpu"):
        a = (a0.t() if transposed else a0).detach().to(dev).requires_grad_()
        b = b0.detach().to(dev).requires_grad_()
        x = torch.linalg.solve(a, b)
        (x * torch.arange(8.0, device=dev).view(4, 2)).sum().backward()
        grads[dev] = (x.detach().cpu(), a.grad.cpu(), b.grad.cpu())
    for c, t in zip(grads["cpu"], grads["tpu"]):
        torch.testing.assert_close(t, c, atol=1e-5, rtol=1e-5)


def _on_tpu_like(t):
    """``t`` on tpu with the same sizes, strides and storage offset (whole storage moved)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    base = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
    return base.to("tpu").as_strided(t.shape, t.stride(), t.storage_offset())


@pytest.mark.parametrize("case", ["strided", "offset_outside", "offset_inside", "transposed",
                                  "overlapping"])
def test_as_strided_scatter_addresses_the_storage(case):
    """as_strided_scatter's geometry is relative to self's storage (PyTorch clones self
    preserving strides and storage offset), not to self's elements."""
    b = torch.arange(20.0)
    src = -torch.arange(1.0, 5.0).view(2, 2)
    self_, geo = {
        "strided": (b[::2], ((2, 2), (1, 2), 1)),
        "offset_outside": (b[5:15], ((2, 2), (1, 2), 0)),
        "offset_inside": (b[5:15], ((2, 2), (1, 2), 6)),
        "transposed": (b[:6].view(2, 3).t(), ((2, 2), (1, 2), 1)),
        "overlapping": (b[:3].expand(2, 3), ((2, 2), (1, 1), 0)),
    }[case]
    expected = torch.as_strided_scatter(self_, src, *geo)
    got = torch.as_strided_scatter(_on_tpu_like(self_), src.to("tpu"), *geo)
    assert got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected)


def test_as_strided_gradient_of_an_offset_leaf():
    """as_strided of a leaf that starts at storage offset 5 reads storage elements before
    the leaf: its gradient is zero (CPU), not the gradient of an offset-0 tensor."""
    base = torch.randn(15)
    g = torch.randn(2, 2)
    grads = []
    for x in (base[5:].detach().requires_grad_(), _on_tpu_like(base[5:]).detach().requires_grad_()):
        y = torch.as_strided(x, (2, 2), (1, 2), 0)
        gx, = torch.autograd.grad(y, x, g.to(x.device))
        grads.append(gx.cpu())
    assert torch.equal(grads[1], grads[0])


def test_logcumsumexp_matches_cpu_at_large_magnitude():
    """CPU accumulates float32 logcumsumexp in double: at |x| ~ 1e4 a float32 scan is an
    ulp off, and the backward (exp of differences of such values) 1e-3 off."""
    torch.manual_seed(0)
    x0 = torch.randn(5, 5, 5) + 1e4
    g = torch.randn(5, 5, 5)
    res = {}
    for dev in ("cpu", "tpu"):
        x = x0.to(dev).requires_grad_()
        y = torch.logcumsumexp(x, 1)
        gx, = torch.autograd.grad(y, x, g.to(dev))
        res[dev] = (y.detach().cpu(), gx.cpu())
    assert torch.equal(res["tpu"][0], res["cpu"][0])
    torch.testing.assert_close(res["tpu"][1], res["cpu"][1], atol=1e-5, rtol=1.3e-6)


def test_erfinv_near_one_forward_and_gradient():
    """XLA's float32 erf_inv is tens of ulps off near +-1; CPU's is within one."""
    x0 = torch.cat([torch.linspace(-0.9999, 0.9999, 4001),
                    torch.tensor([-0.9987144470214844, 1.0, -1.0, 1.5])])
    res = {}
    for dev in ("cpu", "tpu"):
        x = x0.to(dev).requires_grad_()
        y = torch.erfinv(x)
        gx, = torch.autograd.grad(y, x, torch.ones_like(y))
        res[dev] = (y.detach().cpu(), gx.cpu())
    torch.testing.assert_close(res["tpu"][0], res["cpu"][0], atol=0, rtol=1.2e-7,
                               equal_nan=True)
    torch.testing.assert_close(res["tpu"][1], res["cpu"][1], atol=1e-4, rtol=1.3e-6,
                               equal_nan=True)


def _tiny_afmoe_experts():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AfmoeConfig(hidden_size=16, moe_intermediate_size=24, num_experts=4,
                                   num_experts_per_tok=2, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, vocab_size=50)
    cfg._experts_implementation = "grouped_mm"
    from transformers.models.afmoe.modeling_afmoe import AfmoeExperts

    torch.manual_seed(0)
    m = AfmoeExperts(cfg)
    with torch.no_grad():
        m.gate_up_proj.normal_(0, 0.2)
        m.down_proj.normal_(0, 0.2)
    return m


def test_moe_grouped_mm_experts_path_matches_cpu(eager_mode):
    """transformers' ``grouped_mm`` experts forward takes a tpu-only branch
    (``_can_use_grouped_mm``: grouped_mm for any dtype; ``histc`` on int expert ids where
    CPU uses float): same output and gradients as CPU's run of the same function, with
    uneven expert loads (expert 1 gets no token)."""
    import copy

    from transformers.integrations.moe import _can_use_grouped_mm

    m = _tiny_afmoe_experts()
    assert _can_use_grouped_mm(None, m.down_proj.to("tpu"), None)  # the tpu branch
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 16, generator=g)
    idx = torch.tensor([[0, 2], [3, 0], [2, 3], [0, 3], [2, 0], [3, 2]])
    w = torch.rand(6, 2, generator=g)
    res = {}
    for dev in ("cpu", "tpu"):
        mm = copy.deepcopy(m).to(dev)
        xx = x.clone().to(dev).requires_grad_(True)
        out = mm(xx, idx.to(dev), w.to(dev))
        (out * torch.arange(16.0, device=dev)).sum().backward()
        res[dev] = (out.detach().cpu(), xx.grad.cpu(), mm.gate_up_proj.grad.cpu(), mm.down_proj.grad.cpu())
    for c, t in zip(res["cpu"], res["tpu"]):
        torch.testing.assert_close(t, c, atol=1e-5, rtol=1e-5)


def test_topk_with_ties_returns_tied_elements():
    """Afmoe's tiny random model zero-initializes its router gate: every expert scores 0.5
    and ``topk`` picks among exact ties.  CPU returns indices [2, 3] of four equal values
    (libstdc++'s nth_element), tpu [0, 1]: PyTorch leaves the choice among ties open, so
    only the values, and that the indices point at them, are the defined result.  (The
    model sweep runs such architectures with a stable topk on both sides.)"""
    s = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.1, 0.7, 0.7, 0.2], [3.0, 1.0, 2.0, 2.0]])
    for k in (1, 2, 3):
        c = torch.topk(s, k, dim=1)
        t = torch.topk(s.to("tpu"), k, dim=1)
        assert torch.equal(t.values.cpu(), c.values)
        assert torch.equal(s.gather(1, t.indices.cpu()), c.values)
        assert all(len(set(row)) == k for row in t.indices.cpu().tolist())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("variant", ["plain", "weights", "padding_idx", "transposed"])
def test_embedding_bag_half_types_round_as_cpu(dtype, mode, variant):
    """CPU sums half-type bags in float32 and rounds once (bfloat16 on its fast path:
    halfway cases away from zero), then divides a mean in the half type."""
    if variant == "weights" and mode == "mean":
        pytest.skip("per_sample_weights need mode='sum'")
    torch.manual_seed(0)
    for _ in range(5):
        w = (torch.randn(7, 20) * 5).to(dtype).t() if variant == "transposed" else \
            (torch.randn(20, 7) * 5).to(dtype)
        idx = torch.randint(0, 20, (15,))
        off = torch.tensor([0, 3, 3, 9])
        psw = (torch.randn(15) * 3).to(dtype) if variant == "weights" else None
        pad = 4 if variant == "padding_idx" else None
        kw = dict(mode=mode, padding_idx=pad)
        expected = torch.nn.functional.embedding_bag(idx, w, off, per_sample_weights=psw, **kw)
        wt = _on_tpu_like(w)
        got = torch.nn.functional.embedding_bag(
            idx.to("tpu"), wt, off.to("tpu"),
            per_sample_weights=None if psw is None else psw.to("tpu"), **kw)
        assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("pad", [None, 12])
def test_embedding_bag_indices_past_the_last_offset(mode, pad):
    """include_last_offset with indices past offsets[-1] (outside the documented
    contract): CPU's fast path ignores them in sums, its other paths add them to the last
    bag; forward and gradients as CPU's."""
    torch.manual_seed(1)
    w0 = torch.randn(20, 3)
    idx = torch.tensor([5, 19, 9, 10, 11, 12, 12, 5])
    off = torch.tensor([0, 2, 2, 5])
    res = {}
    for dev in ("cpu", "tpu"):
        w = w0.detach().clone().to(dev).requires_grad_()
        o = torch.nn.functional.embedding_bag(idx.to(dev), w, off.to(dev), mode=mode,
                                              include_last_offset=True, padding_idx=pad)
        (o * torch.arange(9.0).view(3, 3).to(dev)).sum().backward()
        res[dev] = (o.detach().cpu(), w.grad.cpu())
    torch.testing.assert_close(res["tpu"][0], res["cpu"][0])
    if mode == "sum" and pad is None:
        # CPU's backward reads past its bag buffer for those indices (undefined values):
        # they get no gradient, as they added to no bag; rows 5 and 12 are theirs
        g = res["tpu"][1]
        assert torch.equal(g[12], torch.zeros(3))
        assert torch.equal(g[5], torch.tensor([0.0, 1.0, 2.0]))  # from position 0 only
        rest = [i for i in range(20) if i not in (5, 12)]
        torch.testing.assert_close(g[rest], res["cpu"][1][rest])
    else:
        torch.testing.assert_close(res["tpu"][1], res["cpu"][1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_adaptive_avg_pool3d_half_types_as_cpu(dtype):
    """CPU sums each window in the half type (rounding every addition) and divides by
    kT, kH, kW in turn."""
    torch.manual_seed(0)
    for shape, out in [((3, 7, 9, 11), (2, 4, 3)), ((2, 2, 5, 6, 7), (3, 3, 3)),
                       ((8, 8, 8, 8), (5, 7, 4))]:
        x = (torch.randn(shape) * 3).to(dtype)
        expected = torch.nn.functional.adaptive_avg_pool3d(x, out)
        got = torch.nn.functional.adaptive_avg_pool3d(x.to("tpu"), out)
        assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sampler_2d_half_types_as_cpu(dtype, mode, padding, align):
    """CPU's vectorized grid sampler rounds every step in the half type; float32 math
    rounded once differs by up to 0.16."""
    torch.manual_seed(0)
    inp = torch.randn(2, 3, 5, 20).to(dtype)
    grid = ((torch.rand(2, 13, 10, 2) * 2 - 1) * 1.2).to(dtype)
    expected = torch.ops.aten.grid_sampler_2d(inp, grid, mode, padding, align)
    got = torch.ops.aten.grid_sampler_2d(inp.to("tpu"), grid.to("tpu"), mode, padding, align)
    assert torch.equal(got.cpu(), expected)


def test_convolution_dtype_mismatch_raises_as_cpu():
    # (integer convolutions are supported where CPU has them: tests/ops/test_missing_ops.py)
    x = torch.ones(1, 1, 3, 3, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError, match="expected scalar type Float but found Double"):
        torch.nn.functional.conv2d(x.float(), x.double())


@pytest.mark.parametrize("qkv", ["self", "kv_shared", "separate"])
@pytest.mark.parametrize("mask", [None, "key_padding", "src", "full", "float_src"])
@pytest.mark.parametrize("weights", ["none", "per_head", "averaged"])
def test_native_multi_head_attention(qkv, mask, weights):
    """nn.MultiheadAttention's inference fast path (torchvision's ViT) vs CPU's kernel."""
    torch.manual_seed(0)
    B, T, D, H = 2, 5, 8, 2
    x, y, z = torch.randn(B, T, D), torch.randn(B, T, D), torch.randn(B, T, D)
    q, k, v = {"self": (x, x, x), "kv_shared": (x, y, y), "separate": (x, y, z)}[qkv]
    params = [torch.randn(3 * D, D), torch.randn(3 * D), torch.randn(D, D), torch.randn(D)]
    m, mt = None, None
    if mask == "key_padding":
        m, mt = torch.zeros(B, T, dtype=torch.bool), 1
        m[1, -2:] = True
    elif mask in ("src", "float_src"):
        m, mt = torch.rand(T, T) > 0.7, 0
        m.fill_diagonal_(False)
        if mask == "float_src":
            m = m.float()  # non-zero: masked, as CPU converts it
    elif mask == "full":
        m, mt = torch.rand(B, H, T, T) > 0.6, 2
        m[..., 0] = False
    need, avg = {"none": (False, True), "per_head": (True, False), "averaged": (True, True)}[weights]

    def run(dev):
        d = {id(t): t.to(dev) for t in (x, y, z)}  # keep query/key/value identity
        ps = [p.to(dev) for p in params]
        out, w = torch._native_multi_head_attention(
            d[id(q)], d[id(k)], d[id(v)], D, H, *ps, None if m is None else m.to(dev), need, avg, mt)
        return out.cpu(), None if w is None else w.cpu()

    c, t = both(run)
    torch.testing.assert_close(t[0], c[0], atol=1e-5, rtol=1e-5)
    assert (t[1] is None) == (c[1] is None)
    if c[1] is not None:
        torch.testing.assert_close(t[1], c[1], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer_inference_fast_path(norm_first, activation):
    import copy

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=activation,
                                             batch_first=True, norm_first=norm_first).eval()
    x = torch.randn(2, 5, 8)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, -2:] = True
    with torch.no_grad():
        c = layer(x, src_key_padding_mask=pad)
        t = copy.deepcopy(layer).to("tpu")(x.to("tpu"), src_key_padding_mask=pad.to("tpu"))
    torch.testing.assert_close(t.cpu(), c, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fill_value", [None, 7])
def test_nonzero_static_of_empty_input_is_all_fill_rows(fill_value):
    """OpInfo sweep: nonzero_static of a [5, 0, 5] input gave zeros, not fill_value rows."""
    kw = {} if fill_value is None else {"fill_value": fill_value}

    def run(d):
        x = torch.randn(5, 0, 5, generator=torch.Generator().manual_seed(0)).to(d)
        return [torch.nonzero_static(x, size=n, **kw).cpu() for n in (0, 1, 3, 10)]

    c, t = both(run)
    for a, b in zip(c, t):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("fn", ["unique", "unique_consecutive"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_unique_dim_of_input_with_a_zero_sized_dim(fn, dim):
    """OpInfo sweep: unique(dim=1) of a [5, 0, 5] input raised a numpy reshape error; the
    other dims must raise PyTorch's RuntimeError."""
    def run(d):
        x = torch.ones(5, 0, 5, device=d)
        try:
            out = getattr(torch, fn)(x, dim=dim, return_inverse=True, return_counts=True)
        except RuntimeError as e:
            return str(e)
        return [o.cpu() for o in out]

    assert_same_result_or_error(run)


@pytest.mark.parametrize("shape", [(0, 0), (0, 0, 0), (2, 0), (0, 3)])
def test_searchsorted_batched_with_empty_dims(shape):
    """OpInfo sweep: searchsorted of [0, 0] sorted sequences raised ZeroDivisionError."""
    def run(d):
        g = torch.Generator().manual_seed(0)
        s = torch.randn(shape, generator=g).sort(-1).values.to(d)
        v = torch.randn(shape, generator=g).to(d)
        w = torch.randn(shape[:-1] + (4,), generator=g).to(d)
        return [torch.searchsorted(s, v).cpu(), torch.searchsorted(s, w, right=True).cpu(),
                torch.searchsorted(s, v, out_int32=True).cpu()]

    c, t = both(run)
    for a, b in zip(c, t):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("kw", [{}, {"range": (-2.0, 2.0)}, {"density": True}, {"weight": True},
                                {"weight": True, "density": True}])
@pytest.mark.parametrize("bins", [1, 7, "edges"])
def test_histogram_vs_cpu(kw, bins):
    """torch.histogram (bin count or edge tensor; weights, density, range) was missing."""
    def run(d):
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(200, generator=g) * 3).to(d)
        w = torch.rand(200, generator=g).to(d)
        b = torch.linspace(-4, 5, 8, device=d) if bins == "edges" else bins
        args = {k: (w if k == "weight" else v) for k, v in kw.items()
                if not (k == "range" and bins == "edges")}
        return [t.cpu() for t in torch.histogram(x, b, **args)]

    c, t = both(run)
    for a, b in zip(c, t):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("case", ["constant", "empty", "descending_edges", "bins0",
                                  "reversed_range", "inf_range", "inf_data", "dtype"])
def test_histogram_edge_cases_and_errors(case):
    def run(d):
        x = torch.tensor([2.0, 2.0], device=d)
        try:
            if case == "constant":
                out = torch.histogram(x, 3)
            elif case == "empty":
                out = torch.histogram(torch.tensor([], device=d), 3)
            elif case == "descending_edges":
                out = torch.histogram(x, torch.tensor([3.0, 1.0], device=d))
            elif case == "bins0":
                out = torch.histogram(x, 0)
            elif case == "reversed_range":
                out = torch.histogram(x, 3, range=(2.0, 1.0))
            elif case == "inf_range":
                out = torch.histogram(x, 3, range=(1.0, float("inf")))
            elif case == "inf_data":
                out = torch.histogram(torch.tensor([1.0, float("inf")], device=d), 3)
            else:
                out = torch.histogram(x, torch.tensor([1.0, 3.0], dtype=torch.float64, device=d))
        except RuntimeError as e:
            return str(e)
        return [o.cpu() for o in out]

    assert_same_result_or_error(run)


def test_float_to_uint8_goes_through_int64_as_cpu():
    # c10's static_cast_with_inter_type: float -> uint8 wraps through int64 on CPU and CUDA
    x = torch.tensor([-1.0, 300.0, -3.7, 255.9, 0.5])
    for src in (x, x.double(), x.bfloat16()):
        assert torch.equal(src.to("tpu").to(torch.uint8).cpu(), src.to(torch.uint8))
    z = torch.zeros(2, dtype=torch.uint8, device="tpu")
    z.copy_(torch.tensor([-1.0, -5.0]))
    assert torch.equal(z.cpu(), torch.tensor([-1.0, -5.0]).to(torch.uint8))


def test_transfers_preserve_layout_as_cpu():
    # Tensor.to keeps a dense tensor's strides (preserve_format) across devices, and
    # honours memory_format, as CPU's clone and CUDA's copies do
    t = torch.arange(12.0).view(3, 4).t()
    a = t.to("tpu")
    assert a.stride() == t.clone().stride() and torch.equal(a.cpu(), t)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        a.view(-1)
    b = torch.arange(12.0, device="tpu").view(3, 4).t()
    assert b.cpu().stride() == t.stride() and torch.equal(b.cpu(), t)
    w = torch.randn(4, 3, 3, 3)
    cl = w.to(memory_format=torch.channels_last)
    for x in (w.to("tpu", memory_format=torch.channels_last), cl.to("tpu")):
        assert x.stride() == cl.stride() and torch.equal(x.cpu(), w)
        assert x.cpu().stride() == cl.stride()
    m = torch.nn.Conv2d(3, 4, 3).to("tpu", memory_format=torch.channels_last)
    assert m.weight.is_contiguous(memory_format=torch.channels_last)
    nd = torch.randn(5, 6)[:, ::2]  # not dense: contiguous copy, as CPU
    assert nd.to("tpu").stride() == nd.clone().stride()
    assert t.to("tpu", torch.float64).stride() == t.to(torch.float64).stride()


@pytest.mark.parametrize("fn", [torch.nn.functional.hardshrink, torch.nn.functional.softshrink])
def test_shrink_backward_as_cpu(fn):
    """``hardshrink``/``softshrink`` backward (``aten.*shrink_backward``, was missing):
    zero inside ``[-lambd, lambd]`` (ends included), the gradient elsewhere and at NaN."""
    x = torch.tensor([-1.0, -0.5, -0.25, 0.0, 0.5, 0.75, float("nan"), 3.0])
    g = torch.arange(1.0, 9.0)
    grads = []
    for dev in ("cpu", "tpu"):
        xd = x.detach().to(dev).requires_grad_(True)
        fn(xd, 0.5).backward(g.to(dev))
        grads.append(xd.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_pdist_backward_as_cpu(p):
    """``pdist`` backward (``aten._pdist_backward``, was missing) with CPU's per-p rules,
    including a repeated row (zero distance) and a zero coordinate difference."""
    x = torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [1.0, -1.0, 0.5],
                      [0.5, 1.0, -2.0]], dtype=torch.float64)
    g = torch.arange(1.0, 7.0, dtype=torch.float64)
    grads = []
    for dev in ("cpu", "tpu"):
        xd = x.detach().to(dev).requires_grad_(True)
        torch.nn.functional.pdist(xd, p).backward(g.to(dev))
        grads.append(xd.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0])



def _assert_as_accurate_as_cpu(names, run, wide, dtype):
    """``run(device, dtype)`` returns tensors; tpu's in ``dtype`` must be at least as
    close to CPU's in ``wide`` (the exact reference) as CPU's in ``dtype`` are."""
    exact, cpu, tpu = run("cpu", wide), run("cpu", dtype), run("tpu", dtype)
    for name, e, c, t in zip(names, exact, cpu, tpu):
        cpu_err, tpu_err = (c - e).abs().max().item(), (t - e).abs().max().item()
        assert tpu_err <= cpu_err, f"{name}: tpu error {tpu_err:.2e} > CPU's {cpu_err:.2e}"

def test_svd_float32_is_as_accurate_as_cpu():
    # XLA's float32 SVD erred ~3x more than LAPACK's, and the SVD gradient amplifies it by
    # 1/(s_i^2 - s_j^2): tpu's gradient was up to 2.8x farther from float64 than CPU's.
    # Judged on sign-invariant quantities: S, U @ Vh, and their gradient.
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(8, 5, 5, generator=gen)
    w = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    C = torch.randn(8, 5, 5, generator=gen, dtype=torch.float64)

    def run(device, dtype):
        a = A.to(device, dtype).clone().requires_grad_()
        U, S, Vh = torch.linalg.svd(a)
        loss = (S * w.to(device, dtype)).sum() + ((U @ Vh) * C.to(device, dtype)).sum()
        loss.backward()
        return [x.detach().cpu().double() for x in (S, U @ Vh, a.grad)]

    _assert_as_accurate_as_cpu(("S", "U @ Vh", "grad"), run, torch.float64, torch.float32)


def test_hermitian_eigh_complex64_is_as_accurate_as_cpu():
    # XLA's single-precision eigh erred 2-3x more than LAPACK's: pinv(hermitian=True)
    # and its gradient were up to 2.9x farther from complex128 than CPU's
    gen = torch.Generator().manual_seed(0)
    B = torch.randn(6, 5, 5, generator=gen, dtype=torch.complex128)
    A = (B + B.mH).to(torch.complex64)
    cot = torch.randn(6, 5, 5, generator=gen, dtype=torch.complex128)

    def run(device, dtype):
        a = A.to(device, dtype).clone().requires_grad_()
        w = torch.linalg.eigvalsh(a.detach())
        p = torch.linalg.pinv(a, hermitian=True)
        g, = torch.autograd.grad(p, a, cot.to(device, dtype))
        return [x.detach().cpu().to(torch.complex128) for x in (w, p, g)]

    _assert_as_accurate_as_cpu(("eigenvalues", "pinv", "grad"), run, torch.complex128,
                               torch.complex64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("loss", ["smooth_l1_loss", "huber_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_half_precision_loss_backward_as_cpu(dtype, loss, reduction):
    """PyTorch's ``smooth_l1_loss_backward.grad_input`` decomposition (what the default
    overload's composite kernel calls) upcasts its out tensor to float32 and writes the
    copy: bfloat16/float16 gradients came out all zeros."""
    fn = getattr(torch.nn.functional, loss)
    torch.manual_seed(0)
    x, y = torch.randn(5, 10, dtype=dtype), torch.randn(5, 10, dtype=dtype)

    def run(dev):
        xx = x.to(dev).detach().requires_grad_()
        out = fn(xx, y.to(dev), reduction=reduction)
        out.backward(torch.ones_like(out))
        return xx.grad.cpu()

    c, t = both(run)
    assert c.abs().max() > 0
    # (CPU's huber kernel rounds 1/numel and each product to the dtype: 1-2 ulp apart)
    torch.testing.assert_close(t, c)


def test_out_decomposition_writes_the_given_out_tensor():
    torch.manual_seed(0)
    g, x, y = (torch.randn(2, 5, dtype=torch.bfloat16) for _ in range(3))

    def run(dev):
        out = torch.full((2, 5), 7.0, dtype=torch.bfloat16, device=dev)
        r = torch.ops.aten.smooth_l1_loss_backward.grad_input(
            g.to(dev), x.to(dev), y.to(dev), 1, 0.5, grad_input=out)
        assert r is out
        return out.cpu()

    c, t = both(run)
    torch.testing.assert_close(t, c, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("mask", [None, "dtype", "float32"])
def test_cpu_flash_attention_op_returns_cpus_logsumexp(dtype, is_causal, mask):
    """``aten._scaled_dot_product_flash_attention_for_cpu`` called on tpu tensors: PyTorch's
    decomposition returned the (B, H, L, S) attention weights as the logsumexp, and the
    backward op had no tpu kernel."""
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    torch.manual_seed(0)
    q, k, v, g = (torch.randn(2, 3, 5, 4, dtype=dtype) for _ in range(4))
    m = None if mask is None else torch.randn(
        5, 5, dtype=dtype if mask == "dtype" else torch.float32)

    def run(dev):
        a = [t.to(dev) for t in (q, k, v)]
        mm = None if m is None else m.to(dev)
        out, lse = fwd(*a, 0.0, is_causal, attn_mask=mm)
        grads = bwd(g.to(dev), *a, out, lse, 0.0, is_causal, attn_mask=mm)
        return [t.cpu() for t in (out, lse, *grads)]

    c, t = both(run)
    for a, b in zip(c, t):
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
        torch.testing.assert_close(b, a, atol=2e-2 if dtype == torch.bfloat16 else None,
                                   rtol=2e-2 if dtype == torch.bfloat16 else None)


def test_cpu_flash_attention_op_with_fewer_key_heads_as_cpu():
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)

    def run(dev):
        a = [x.to(dev) for x in (q, k, v)]
        out, lse = fwd(*a, 0.0, True)
        grads = bwd(torch.ones_like(out), *a, out, lse, 0.0, True)
        return [x.cpu() for x in (out, lse, *grads)]

    for a, b in zip(*both(run)):
        assert (a.shape, a.stride()) == (b.shape, b.stride())
        torch.testing.assert_close(b, a)


def test_cpu_flash_attention_op_raises_cpus_errors():
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q4 = torch.randn(2, 3, 5, 4)
    for args, kw in [((torch.randn(3, 5, 4),) * 3, {}),
                     ((q4,) * 3, {"attn_mask": torch.ones(5, 5, dtype=torch.bool)}),
                     ((q4, q4, torch.randn(2, 3, 5, 6)), {}),
                     ((q4, q4.double(), q4), {}),
                     ((q4.long(),) * 3, {}),
                     ((q4,) * 3, {"attn_mask": torch.randn(5)})]:
        def run(dev):
            try:
                fwd(*[a.to(dev) for a in args], **{n: x.to(dev) for n, x in kw.items()})
            except RuntimeError as e:
                return str(e)
            return "no error"

        c, t = both(run)
        assert c != "no error" and t == c


_HARD = {
    "hardswish": lambda x, g: torch.nn.functional.hardswish(x),
    "hardsigmoid": lambda x, g: torch.nn.functional.hardsigmoid(x),
    "hardswish_backward": lambda x, g: torch.ops.aten.hardswish_backward(g, x),
    "hardsigmoid_backward": lambda x, g: torch.ops.aten.hardsigmoid_backward(g, x),
    "sigmoid_backward": lambda y, g: torch.ops.aten.sigmoid_backward(g, y),  # y: sigmoid(x)
    "tanh_backward": lambda y, g: torch.ops.aten.tanh_backward(g, y),  # y: tanh(x)
}
_SAVED_RESULT = {"sigmoid_backward": torch.sigmoid, "tanh_backward": torch.tanh}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", sorted(_HARD))
def test_activation_and_backward_bits_as_cpu(op, dtype):
    """Bit for bit as CPU's kernels: ``hardswish_backward`` at x = -3 and 3 took the middle
    branch (-g/2 and 1.5 g where CPU gives 0 and g); the divisions by 3 and 6 were
    multiplications by reciprocals (1 ulp off in ~25% of float32 elements);
    ``hardsigmoid_backward`` multiplies by float32's 1/6 on CPU, also in float64;
    ``sigmoid_backward`` in float16 rounds each step on CPU; ``tanh_backward``'s
    ``1 - y * y`` is a fused multiply-add on CPU."""
    torch.manual_seed(0)
    x = torch.randn(4096, dtype=dtype) * 3
    x[:6] = torch.tensor([-3.0, 3.0, 0.0, -0.0, -6.0, 6.0])
    g = torch.randn(4096, dtype=dtype)
    if op in _SAVED_RESULT:  # its saved result, made on CPU (tpu's exp differs)
        x = _SAVED_RESULT[op](x)
    c, t = both(lambda dev: _HARD[op](x.to(dev), g.to(dev)).cpu())
    # subnormal results: XLA:CPU flushes them to zero (docs/precision.md)
    sub = (c != 0) & (c.abs() < torch.finfo(dtype).tiny)
    assert torch.equal(c[~sub], t[~sub]), f"{int((c != t)[~sub].sum())} of {c.numel()} differ"
    assert torch.equal(c.signbit()[~sub], t.signbit()[~sub])
    assert bool(((t[sub] == c[sub]) | (t[sub] == 0)).all())


_LAMBD_EPS = {
    "hardshrink": lambda x, g: torch.ops.aten.hardshrink(x, 0.3),
    "hardshrink_backward": lambda x, g: torch.ops.aten.hardshrink_backward(g, x, 0.3),
    "softshrink_backward": lambda x, g: torch.ops.aten.softshrink_backward(g, x, 0.3),
    "logit_backward_eps": lambda x, g: torch.ops.aten.logit_backward(g, x, 0.1),
    "logit_backward": lambda x, g: torch.ops.aten.logit_backward(g, x),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", sorted(_LAMBD_EPS))
def test_shrink_lambd_and_logit_eps_in_input_dtype_as_cpu(op, dtype):
    """CPU converts ``lambd`` (hardshrink, both shrink backwards) and logit_backward's
    ``eps`` to the input's dtype before comparing: a bfloat16 0.30078125 is inside
    ``lambd=0.3``, a float16 0.0999756 inside ``eps=0.1`` (tpu compared with the unrounded
    values: 0.30078125 kept, the logit gradient 0)."""
    torch.manual_seed(0)
    x = torch.rand(4096, dtype=dtype) * 1.2 - 0.1
    x[:8] = torch.tensor([0.3, -0.3, 0.1, 0.9, 0.0, 1.0, -0.0, 0.5])
    g = torch.randn(4096, dtype=dtype)
    c, t = both(lambda dev: _LAMBD_EPS[op](x.to(dev), g.to(dev)).cpu())
    assert torch.equal(c.isnan(), t.isnan())
    m = ~c.isnan()
    assert torch.equal(c[m], t[m]), f"{int((c[m] != t[m]).sum())} of {c.numel()} differ"
    assert torch.equal(c[m].signbit(), t[m].signbit())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_cross_rounds_each_product_as_cpu(dtype):
    """``linalg.cross`` in float16 rounds each product before the difference, as CPU does
    (XLA:CPU kept the products in float32: 1 ulp off in ~1 of 4 float16 elements)."""
    torch.manual_seed(0)
    a, b = torch.randn(4096, 3, dtype=dtype), torch.randn(4096, 3, dtype=dtype)
    c, t = both(lambda dev: torch.linalg.cross(a.to(dev), b.to(dev)).cpu())
    sub = (c != 0) & (c.abs() < torch.finfo(dtype).tiny)  # flushed by XLA:CPU
    assert torch.equal(c[~sub], t[~sub]), f"{int((c != t)[~sub].sum())} differ"


def test_complex_of_float16_parts_is_unsupported_complex32():
    """CPU makes a complex32 tensor; tpu has none: NotImplementedError naming it (was a
    RuntimeError "lowering failed" from JAX)."""
    a = torch.randn(3, dtype=torch.float16)
    assert torch.complex(a, a).dtype == torch.complex32
    with pytest.raises(NotImplementedError, match="complex32"):
        torch.complex(a.to("tpu"), a.to("tpu"))
