"""Growing tensors (``torchtpu.eager.growth``): a tensor that grows by ``torch.cat`` each
step (a KV cache, generated ids) is held with spare capacity.  Every value is checked
against CPU PyTorch and against the exact path (growth switched off); the counters show
the capacity path ran, and the executable counts show it does not compile per length."""

import pytest
import torch

from torchtpu._tensor import storage as _st
from torchtpu.eager import executables, growth, padded

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _growth_on():
    growth.set_enabled(True)
    yield
    growth.set_enabled(True)


@pytest.fixture
def no_padded():
    # growth's own cut policy: whole reads of a grown storage cut it (eager.padded's
    # rules would run them on the capacity instead)
    padded.set_enabled(False)
    yield
    padded.set_enabled(True)


def _metric(name):
    import torchtpu

    return torchtpu.metrics()["growth"][name]


def _executables_of(op):
    return sum(1 for k in list(executables.CACHE.keys()) if k[0] is op)


def _grown(t):
    return _st.data(t).arr.__class__ is _st.Grown


@pytest.mark.parametrize("dim,shape,step", [
    (-2, (1, 2, 3, 8), (1, 2, 1, 8)),   # a KV cache (batch, heads, seq, head dim)
    (1, (1, 5), (1, 1)),                # generated ids
    (0, (4, 3), (2, 3)),                # rows, two at a time
    (1, (2, 3, 4), (2, 1, 4)),          # a middle dim
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_cat_chain_matches_cpu_and_holds_capacity(strict_mode, dim, shape, step, dtype):
    g = torch.Generator().manual_seed(0)

    def rnd(s):
        return (torch.randn(s, generator=g) * 10).to(dtype)

    x = rnd(shape)
    xd = x.to("tpu")
    appends = _metric("appends")
    for i in range(30):
        y = rnd(step)
        x = torch.cat([x, y], dim=dim)
        xd = torch.cat([xd, y.to("tpu")], dim=dim)
        assert xd.shape == x.shape and xd.stride() == x.stride() and xd.is_contiguous()
        assert xd.untyped_storage().nbytes() == x.untyped_storage().nbytes()
    assert _grown(xd)
    assert _metric("appends") - appends >= 28
    assert torch.equal(xd.cpu(), x)


def test_cat_chain_compiles_per_capacity_not_per_length(strict_mode):
    import torchtpu

    x = torch.zeros(1, 2, 7, 4, device="tpu")
    torchtpu.reset_metrics()
    before = _executables_of(aten.cat.default) + _executables_of(aten.index_copy.default)
    for i in range(60):
        x = torch.cat([x, torch.full((1, 2, 1, 4), float(i), device="tpu")], dim=-2)
    made = _executables_of(aten.cat.default) + _executables_of(aten.index_copy.default) - before
    # exact shapes would need one cat executable per length (60); capacity: two exact cats
    # before the chain is known, then one append executable per capacity (16..128)
    assert made <= 8, made
    built = torchtpu.metrics()["op_executables"]  # the same, from the counter
    assert built.get("aten.cat.default", 0) + built.get("aten.index_copy.default", 0) <= 8
    assert built.get("aten.index_copy.default", 0) >= 1
    ref = torch.cat([torch.zeros(1, 2, 7, 4)] + [torch.full((1, 2, 1, 4), float(i))
                                                   for i in range(60)], dim=-2)
    assert torch.equal(x.cpu(), ref)


def test_capacity_doubles_past_its_end(strict_mode):
    regrows = _metric("regrows")
    x = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    xd = x.to("tpu")
    for i in range(300):
        y = torch.full((2, 1), i, dtype=torch.int32)
        x, xd = torch.cat([x, y], 1), torch.cat([xd, y.to("tpu")], 1)
    assert _grown(xd) and _st.data(xd).arr.arr.shape[1] == 512
    assert _metric("regrows") - regrows == 2  # 128 -> 256 -> 512
    assert torch.equal(xd.cpu(), x)
    assert torch.equal(xd[:, 125:131].cpu(), x[:, 125:131])


def test_chain_read_whole_every_step_goes_on_exact(strict_mode, no_padded):
    # an attention mask turned into a bias each step: growing it again after each cut
    # would add a capacity and a cut per length; after two cuts the chain stays exact
    x = torch.ones(3, 5, dtype=torch.int16)
    xd = x.to("tpu")
    started = []
    for i in range(12):
        y = torch.full((3, 1), i, dtype=torch.int16)
        x, xd = torch.cat([x, y], 1), torch.cat([xd, y.to("tpu")], 1)
        assert torch.equal((xd * 2).cpu(), x * 2)  # a whole read: cuts a grown storage
        started.append(_metric("started"))
    assert started[-1] - started[0] <= 2
    assert started[-1] == started[-5]  # no restarts any more
    assert not _grown(xd)
    assert torch.equal(xd.cpu(), x)


def test_growth_on_again_reaches_cats_the_hot_path_knows(strict_mode):
    def chain():
        x = torch.zeros(2, 5, device="tpu", dtype=torch.float16)
        for i in range(20):
            x = torch.cat([x, torch.ones(2, 1, device="tpu", dtype=torch.float16)], 1)
        return x

    growth.set_enabled(False)
    assert not _grown(chain()) and not _grown(chain())  # every cat now on the hot path
    growth.set_enabled(True)
    x = chain()
    assert _grown(x)
    assert torch.equal(x.cpu(), torch.cat([torch.zeros(2, 5), torch.ones(2, 20)], 1).half())


def test_family_whose_chains_are_cut_starts_no_more(strict_mode):
    # a beam search's cache: reordered (a new tensor) and so cut after every cat
    g = torch.Generator().manual_seed(3)
    k = torch.randn(2, 3, 4, generator=g)
    kd = k.to("tpu")
    for i in range(30):
        y = torch.randn(2, 1, 4, generator=g)
        k, kd = torch.cat([k, y], 1), torch.cat([kd, y.to("tpu")], 1)
        order = torch.tensor([1, 0]) if i % 2 else torch.tensor([0, 1])
        k, kd = k.index_select(0, order), kd.index_select(0, order.to("tpu"))
        if i == 10:
            started = _metric("started")
    assert _metric("started") == started
    assert torch.equal(kd.cpu(), k)


def test_growth_off_gives_exact_storages(strict_mode):
    growth.set_enabled(False)
    x = torch.zeros(3, 3, device="tpu")
    for i in range(10):
        x = torch.cat([x, torch.ones(3, 1, device="tpu")], dim=1)
    assert not _grown(x)
    assert torch.equal(x.cpu(), torch.cat([torch.zeros(3, 3), torch.ones(3, 10)], 1))


@pytest.mark.parametrize("is_causal,q_len", [(False, 1), (True, 3), (False, 4)])
def test_attention_over_capacity_matches_cpu_and_exact_path(strict_mode, is_causal, q_len):
    g = torch.Generator().manual_seed(1)
    k = torch.randn(2, 2, 5, 16, generator=g)
    v = torch.randn(2, 2, 5, 16, generator=g)
    kd, vd = k.to("tpu"), v.to("tpu")
    calls = _metric("attention_calls")
    for i in range(20):
        nk, nv = torch.randn(2, 2, 1, 16, generator=g), torch.randn(2, 2, 1, 16, generator=g)
        k, v = torch.cat([k, nk], -2), torch.cat([v, nv], -2)
        kd, vd = torch.cat([kd, nk.to("tpu")], -2), torch.cat([vd, nv.to("tpu")], -2)
        q = torch.randn(2, 4, q_len, 16, generator=g)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                               enable_gqa=True)
        got = torch.nn.functional.scaled_dot_product_attention(
            q.to("tpu"), kd, vd, is_causal=is_causal, enable_gqa=True)
        torch.testing.assert_close(got.cpu(), ref)
    assert _grown(kd) and _grown(vd)
    assert _metric("attention_calls") - calls >= 15
    # the exact path on the same (cut) values
    growth.set_enabled(False)
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.to("tpu"), kd.clone(), vd.clone(), is_causal=is_causal, enable_gqa=True)
    torch.testing.assert_close(got.cpu(), exact.cpu(), rtol=1e-6, atol=1e-6)


def test_device_bytes_return_to_baseline(strict_mode):
    import gc

    gc.collect()
    base = torch.tpu.memory_allocated()
    k = torch.zeros(1, 2, 3, 8, device="tpu")
    for i in range(20):
        k = torch.cat([k, torch.full((1, 2, 1, 8), float(i), device="tpu")], -2)
        out = torch.nn.functional.scaled_dot_product_attention(
            torch.ones(1, 2, 1, 8, device="tpu"), k, k)
        # logical bytes only, whatever the capacity
        assert torch.tpu.memory_allocated() - base == (k.numel() + out.numel()) * 4
    assert _grown(k)
    del k, out
    gc.collect()
    assert torch.tpu.memory_allocated() == base


def test_window_reads_whole_reads_and_writes_match_cpu(strict_mode, no_padded):
    # (float64 ids of a shape no other test here grows: a chain starts at a cat that
    # compiles, and a signature another test ran is already known)
    x = torch.arange(6.0, dtype=torch.float64).reshape(1, 6)
    xd = x.to("tpu")
    for i in range(12):
        y = torch.tensor([[10.0 + i]], dtype=torch.float64)
        x, xd = torch.cat([x, y], 1), torch.cat([xd, y.to("tpu")], 1)
        assert _grown(xd) or i < 2
        cuts = _metric("cuts")
        # window views read the capacity array: no cut
        assert torch.equal((xd[:, -1:] * 2).cpu(), x[:, -1:] * 2)
        assert torch.equal((xd[0, -3:] + 1).cpu(), x[0, -3:] + 1)
        assert xd[0, -1].item() == x[0, -1].item()
        if _grown(xd):
            assert _metric("cuts") == cuts
    # a whole read cuts the exact array on the device, the chain goes on
    assert torch.equal((xd * 3).cpu(), x * 3)
    assert not _grown(xd)
    for i in range(4):
        y = torch.tensor([[50.0 + i]], dtype=torch.float64)
        x, xd = torch.cat([x, y], 1), torch.cat([xd, y.to("tpu")], 1)
    assert torch.equal(xd.cpu(), x)
    # writes: the storage is cut, then written, as on CPU
    for i in range(3):
        y = torch.tensor([[70.0 + i]], dtype=torch.float64)
        x, xd = torch.cat([x, y], 1), torch.cat([xd, y.to("tpu")], 1)
    alias = xd[:, 2:5]
    xd[:, -1] = -1.0
    x[:, -1] = -1.0
    xd.mul_(2)
    x.mul_(2)
    assert torch.equal(xd.cpu(), x)
    assert torch.equal(alias.cpu(), x[:, 2:5])


def test_chain_runs_without_host_syncs(strict_mode):
    import torchtpu

    xc = torch.arange(8.0).reshape(2, 4)
    step_c = torch.tensor([[0.5], [2.0]])
    x, step = xc.to("tpu"), step_c.to("tpu")
    for _ in range(3):
        x, xc = torch.cat([x, step], 1), torch.cat([xc, step_c], 1)
    syncs = torchtpu.metrics()["host_syncs_total"]
    for _ in range(40):
        x = torch.cat([x, step * x[:, -1:] + x[:, -2:-1]], 1)
        xc = torch.cat([xc, step_c * xc[:, -1:] + xc[:, -2:-1]], 1)
    assert torchtpu.metrics()["host_syncs_total"] == syncs
    assert _grown(x)
    assert torch.equal(x.cpu(), xc)


def test_grown_tensors_in_autograd_match_cpu(strict_mode):
    w = torch.randn(3, 4, requires_grad=True)
    wd = w.detach().to("tpu").requires_grad_()
    xs, xds = torch.zeros(3, 1), torch.zeros(3, 1, device="tpu")
    for i in range(10):
        xs = torch.cat([xs, (w * i)[:, :1]], 1)
        xds = torch.cat([xds, (wd * i)[:, :1]], 1)
    (xs ** 2).sum().backward()
    (xds ** 2).sum().backward()
    torch.testing.assert_close(wd.grad.cpu(), w.grad)


def test_cat_chains_in_every_mode_match_cpu(eager_mode):
    x = torch.arange(4.0).reshape(2, 2)
    xd = x.to("tpu")
    for i in range(20):
        y = torch.full((2, 1), float(i))
        x, xd = torch.cat([x, y], 1), torch.cat([xd, y.to("tpu")], 1)
        assert torch.equal(xd[:, -2:].cpu(), x[:, -2:])
    assert torch.equal(xd.sum(1).cpu(), x.sum(1))
    assert torch.equal(xd.cpu(), x)


def test_cats_that_are_no_chain_stay_exact(strict_mode):
    # same shapes every call (no chain) and views as first input
    a = torch.randn(3, 4, device="tpu")
    for _ in range(5):
        r = torch.cat([a, a], 0)
        assert not _grown(r)
    x = torch.randn(2, 8, device="tpu")
    for _ in range(5):
        r = torch.cat([x[:, :5], x[:, :1]], 1)
        assert not _grown(r)
    # mixed dtypes promote as on CPU
    i = torch.arange(3).reshape(1, 3)
    idev = i.to("tpu")
    for k in range(6):
        f = torch.full((1, 1), 0.5)
        i, idev = torch.cat([i, f], 1), torch.cat([idev, f.to("tpu")], 1)
        assert idev.dtype == i.dtype
    assert torch.equal(idev.cpu(), i)
