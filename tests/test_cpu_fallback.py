"""The opt-in CPU fallback writes back every mutated argument, as the CPU op leaves it.

Lowered ops are routed through the fallback with ``cpu_fallback.forced(op)`` (a test hook);
each test runs the same PyTorch snippet on CPU and on tpu and compares.
"""

import pytest
import torch

import torchtpu
from torchtpu.eager import cpu_fallback

aten = torch.ops.aten
TPU = "tpu"


def fallbacks(op) -> int:
    return torchtpu.metrics()["fallbacks"].get(str(op), 0)


def run_both(fn, *ops):
    """``fn(device)`` on CPU, then on tpu with ``ops`` forced through the fallback; the
    fallback must actually have run.  Returns (cpu result, tpu result moved to CPU)."""
    cpu = fn("cpu")
    before = {op: fallbacks(op) for op in ops}
    with cpu_fallback.forced(*ops):
        tpu = fn(TPU)
    for op in ops:
        assert fallbacks(op) > before[op], f"{op} did not go through the CPU fallback"
    return cpu, _to_cpu(tpu)


def _to_cpu(v):
    if isinstance(v, torch.Tensor):
        return v.cpu()
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu(x) for x in v)
    return v


def same(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def data(dev, *shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(dev)


# ------------------------------------------------------------------------- in-place


def test_inplace():
    def fn(dev):
        x, y = data(dev, 4, 3), data(dev, 4, 3, seed=1)
        r = x.add_(y, alpha=2)
        assert r is x
        return x

    same(*run_both(fn, aten.add_.Tensor))


def test_inplace_on_views_writes_the_base():
    def fn(dev):
        base = data(dev, 5, 6)
        v = base[1:, ::2]  # a non-contiguous view
        v.mul_(data(dev, 4, 3, seed=1))
        base.t()[2].add_(1.0)  # a strided row of the transpose
        return base

    same(*run_both(fn, aten.mul_.Tensor, aten.add_.Tensor))


def test_inplace_with_aliasing_arguments():
    def fn(dev):
        x = data(dev, 6)
        x.add_(x)  # the same tensor twice
        y = data(dev, 3, 4, seed=1)
        y[:, 1:].mul_(y[:, :-1])  # overlapping views of one base: CPU's overlap rule
        return x, y

    def fn_overlap(dev):
        x = data(dev, 8)
        x[1:].add_(x[:-1])

    same(*run_both(fn, aten.add_.Tensor, aten.mul_.Tensor))
    with pytest.raises(RuntimeError) as cpu_err:
        fn_overlap("cpu")
    with cpu_fallback.forced(aten.add_.Tensor), pytest.raises(RuntimeError) as tpu_err:
        fn_overlap(TPU)
    assert str(tpu_err.value) == str(cpu_err.value)


# ---------------------------------------------------------------------------- out=


def test_out_single_and_resize():
    def fn(dev):
        x, y = data(dev, 4, 3), data(dev, 4, 3, seed=1)
        o = torch.empty(4, 3, device=dev)
        r = torch.add(x, y, out=o)
        assert r is o
        small = torch.empty(0, device=dev)  # resized by the op
        torch.mul(x, y, out=small)
        base = torch.zeros(3, 8, device=dev)
        torch.sub(x[0], y[0], out=base[1, ::2][:3])  # an out= view: the base sees it
        return o, small, base

    same(*run_both(fn, aten.add.out, aten.mul.out, aten.sub.out))


def test_out_tuple():
    def fn(dev):
        x = data(dev, 5, 4)
        v = torch.empty(4, device=dev)
        i = torch.empty(4, dtype=torch.long, device=dev)
        r = torch.max(x, 0, out=(v, i))
        assert r[0] is v and r[1] is i
        mn, mx = torch.empty(0, device=dev), torch.empty(0, device=dev)  # resized
        torch.aminmax(x, dim=1, out=(mn, mx))
        base = torch.zeros(2, 5, device=dev)  # out= views of one base
        torch.aminmax(x, dim=1, out=(base[0], base[1]))
        return v, i, mn, mx, base

    same(*run_both(fn, aten.max.dim_max, aten.aminmax.out))


def test_out_tensor_list():
    def fn(dev):
        x = data(dev, 6, 4)
        outs = [torch.empty(2, 4, device=dev), torch.empty(4, 4, device=dev)]
        torch.split_with_sizes_copy(x, [2, 4], out=outs)
        a, b = [data(dev, 3, seed=s) for s in (1, 2)], [data(dev, 3, seed=s) for s in (3, 4)]
        base = torch.zeros(2, 3, device=dev)
        aten._foreach_add.List_out(a, b, alpha=2, out=[base[0], base[1]])
        return outs, base

    same(*run_both(fn, aten.split_with_sizes_copy.out, aten._foreach_add.List_out))


# ---------------------------------------------------------------- tensor lists in place


def test_foreach_inplace_on_lists():
    def fn(dev):
        ts = [data(dev, 3, seed=1), data(dev, 2, 2, seed=2), data(dev, 5, seed=3)]
        torch._foreach_mul_(ts, 3.0)
        torch._foreach_add_(ts, [data(dev, 3), data(dev, 2, 2), data(dev, 5)], alpha=0.5)
        base = data(dev, 4, 4, seed=4)
        views = [base[0], base[1:, 2], base[3, :2]]  # disjoint views of one base
        torch._foreach_mul_(views, 2.0)
        x = data(dev, 4, seed=5)
        torch._foreach_add_([x, x], 1.0)  # the same tensor twice: updated twice, as on CPU
        return ts, base, x

    same(*run_both(fn, aten._foreach_mul_.Scalar, aten._foreach_add_.List,
                   aten._foreach_add_.Scalar))


def test_amp_unscale_through_the_fallback():
    def fn(dev):
        grads = [data(dev, 4, 3, seed=1) * 100, data(dev, 5, seed=2, dtype=torch.float16)]
        grads[1][2] = float("inf")
        found = torch.zeros(1, device=dev)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found,
                                                         torch.full((1,), 0.125, device=dev))
        scale = torch.full((1,), 1024.0, device=dev)
        tracker = torch.zeros(1, dtype=torch.int32, device=dev)
        torch._amp_update_scale_(scale, tracker, found, 2.0, 0.5, 2000)
        return grads, found, scale, tracker

    same(*run_both(fn, aten._amp_foreach_non_finite_check_and_unscale_.default,
                   aten._amp_update_scale_.default))


def test_fused_sgd_through_the_fallback(monkeypatch):
    # a list-mutating op (_fused_sgd_, lowered since, so forced here) sent to the
    # fallback, which must update every parameter and momentum buffer
    monkeypatch.setattr(torch.tpu, "enable_cpu_fallback", True)

    def fn(dev):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        model.to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
        x = data(dev, 6, 4)
        for _ in range(3):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        return [p.detach() for p in model.parameters()], \
            [opt.state[p]["momentum_buffer"] for p in model.parameters()]

    cpu = fn("cpu")
    before = fallbacks(aten._fused_sgd_.default)
    with cpu_fallback.forced(aten._fused_sgd_.default):
        tpu = _to_cpu(fn(TPU))
    assert fallbacks(aten._fused_sgd_.default) == before + 3
    torch.testing.assert_close(tpu, cpu, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------- cannot write: raise


def test_unwritable_aliasing_raises_instead_of_returning():
    x = torch.zeros(4, device=TPU)
    with cpu_fallback.forced(aten.add_.Tensor), pytest.raises(NotImplementedError,
                                                              match="cannot write back"):
        x.add_(x.view(torch.int32))  # one storage, two dtypes: no single host copy


def test_refused_list_case_of_a_lowered_op_goes_through_the_fallback(monkeypatch):
    # overlapping gradients: CPU unscales them one after the other, which the lowering
    # refuses; with the fallback enabled the op runs on the CPU instead
    def fn(dev):
        base = torch.arange(12.0, device=dev).view(3, 4)
        found = torch.zeros((), device=dev)
        torch._amp_foreach_non_finite_check_and_unscale_([base[1], base[:, 3]], found,
                                                         torch.full((), 0.5, device=dev))
        return base

    cpu = fn("cpu")
    monkeypatch.setattr(torch.tpu, "enable_cpu_fallback", False)
    with pytest.raises(NotImplementedError, match="overlapping"):
        fn(TPU)
    monkeypatch.setattr(torch.tpu, "enable_cpu_fallback", True)
    op = aten._amp_foreach_non_finite_check_and_unscale_.default
    before = fallbacks(op)
    same(fn(TPU).cpu(), cpu)
    assert fallbacks(op) == before + 1
