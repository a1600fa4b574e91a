"""Tensor semantics on tpu, each checked against the same PyTorch code on CPU."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torchtpu

# eager_mode tests run in DEFER_AND_FUSE too in the default run (tests/conftest.py)
DEFER_BY_DEFAULT = True

TPU = "tpu"


@pytest.fixture(autouse=True)
def _all_modes(eager_mode):
    """Every semantics test runs in STRICT, DEBUG and DEFER_AND_FUSE."""
    yield


def same(tpu_result, cpu_result, **kw):
    """Values, dtype and shape equal to the CPU result."""
    assert tpu_result.device.type == "tpu"
    torch.testing.assert_close(tpu_result.cpu(), cpu_result, **kw)


# ---------------------------------------------------------------- registration


def test_autoload_without_import():
    out = subprocess.run(
        [sys.executable, "-c",
         "import torch; print(torch.accelerator.current_accelerator(), torch.tpu.device_count())"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    assert out[0] == "tpu" and int(out[1]) >= 1


def test_autoload_can_be_disabled():
    code = "import torch, sys; print(hasattr(torch, 'tpu'))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**__import__("os").environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    ).stdout.strip()
    assert out == "False"


def test_device_api():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert isinstance(torch.tpu.get_device_name(), str)
    assert torch.tpu.is_bf16_supported()
    assert torch.bfloat16 in torch.tpu.get_amp_supported_dtype()
    torch.tpu.synchronize()
    with torch.tpu.device(0):
        assert torch.zeros(1, device=TPU).device == torch.device("tpu", 0)
    x = torch.ones(3, device=TPU)
    assert x.is_tpu and not torch.ones(3).is_tpu
    assert torch.ones(2).tpu().device.type == "tpu"
    assert torch.device("tpu:0").type == "tpu"


def test_streams_and_events_like_cuda():
    s = torch.tpu.Stream()
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream() is s
        start.record()
        y = torch.ones(64, 64, device=TPU) @ torch.ones(64, 64, device=TPU)
        end.record()
    assert torch.tpu.current_stream() is torch.tpu.default_stream()
    torch.tpu.current_stream().wait_stream(s)
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0 and s.query()
    assert y[0, 0].item() == 64.0


def test_module_to_tpu():
    m = torch.nn.Linear(3, 2)
    m2 = torch.nn.Linear(3, 2)
    m2.load_state_dict(m.state_dict())
    m2.to(TPU)
    assert all(p.device.type == "tpu" for p in m2.parameters())
    x = torch.randn(4, 3)
    same(m2(x.to(TPU)).detach(), m(x).detach())


# ----------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int64, torch.int32, torch.int16, torch.int8,
                                   torch.uint8, torch.bool, torch.complex64])
def test_roundtrip_keeps_dtype(dtype):
    a = (torch.randn(5, 3) * 10).to(dtype)
    b = a.to(TPU)
    assert b.dtype == dtype
    assert torch.equal(b.cpu(), a)


def test_int64_and_float64_not_narrowed():
    a = torch.tensor([2**40 + 1, -3], dtype=torch.int64)
    same(a.to(TPU) * 3, a * 3)
    f = torch.tensor([1 + 1e-12], dtype=torch.float64)
    assert (f.to(TPU) - 1).item() == pytest.approx(1e-12, rel=1e-6)


@pytest.mark.parametrize("a_dtype,b", [
    (torch.int32, 2.5), (torch.int64, 3), (torch.float16, 2.0), (torch.bool, 1),
    (torch.int8, torch.tensor(1.5, dtype=torch.float64)), (torch.uint8, -1),
])
def test_type_promotion(a_dtype, b):
    a = torch.arange(6).reshape(2, 3).to(a_dtype)
    bt = b.to(TPU) if isinstance(b, torch.Tensor) else b
    same(a.to(TPU) + bt, a + b)
    same(a.to(TPU) * bt, a * b)


def test_broadcast_scalar_and_empty():
    a = torch.randn(3, 1)
    b = torch.randn(1, 4)
    same(a.to(TPU) - b.to(TPU), a - b)
    z = torch.tensor(2.0)
    same(z.to(TPU) * 3, z * 3)
    e = torch.empty(0, 4)
    same(e.to(TPU) + 1, e + 1)


def test_noncontiguous_from_cpu():
    a = torch.randn(4, 5).t()
    b = a.to(TPU)
    assert torch.equal(b.cpu(), a)
    same(b * 2, a * 2)


# ------------------------------------------------------------------------ views


def test_view_strides_match_cpu():
    a = torch.randn(4, 6)
    b = a.to(TPU)
    for f in (lambda t: t.t(), lambda t: t[1:, ::2], lambda t: t.view(2, 12),
              lambda t: t.permute(1, 0), lambda t: t.unsqueeze(1).expand(4, 3, 6),
              lambda t: t.narrow(1, 2, 3), lambda t: t.diagonal(), lambda t: t[2],
              lambda t: t.unfold(1, 2, 2), lambda t: t.as_strided((2, 2), (1, 3), 1)):
        v, w = f(b), f(a)
        assert v.stride() == w.stride() and v.storage_offset() == w.storage_offset()
        assert v.is_contiguous() == w.is_contiguous()
        assert torch.equal(v.cpu(), w)


def test_inplace_through_view_visible_in_base_and_siblings():
    a = torch.zeros(4, 4)
    b = a.to(TPU)
    for t in (a, b):
        row = t[1]
        col = t[:, 2]
        row.add_(1)
        col.mul_(3)
        t.t()[0, 3] = 7
        t.view(16)[5:8].fill_(-2)
    assert torch.equal(b.cpu(), a)


def test_base_write_visible_in_view():
    a = torch.arange(12.0).reshape(3, 4)
    b = a.to(TPU)
    va, vb = a[:, 1::2], b[:, 1::2]
    a.mul_(2)
    b.mul_(2)
    assert torch.equal(vb.cpu(), va)


def test_split_chunk_unbind_share_storage():
    a = torch.arange(12.0)
    b = a.to(TPU)
    for t in (a, b):
        s = t.split(4)
        s[1].zero_()
        c = t.view(3, 4).unbind(0)
        c[2].add_(100)
    assert torch.equal(b.cpu(), a)
    assert b.split(4)[1].untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_storage_identity():
    x = torch.ones(3, device=TPU)
    y = torch.ones(3, device=TPU)
    assert x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr()
    assert x[1:].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert x.untyped_storage().nbytes() == 12


def test_dtype_view():
    a = torch.randn(6)
    b = a.to(TPU)
    assert torch.equal(b.view(torch.int32).cpu(), a.view(torch.int32))
    assert torch.equal(b.view(torch.uint8).cpu(), a.view(torch.uint8))


# --------------------------------------------------------- in-place, out=, index


def test_out_variant_and_resize():
    a, b = torch.randn(3), torch.randn(3)
    out_c = torch.empty(3)
    out_t = torch.empty(3, device=TPU)
    torch.add(a, b, out=out_c)
    r = torch.add(a.to(TPU), b.to(TPU), out=out_t)
    assert r is out_t
    same(out_t, out_c)
    o = torch.empty(0, device=TPU)
    torch.mul(a.to(TPU), 2, out=o)
    same(o, a * 2)


def test_inplace_cast_error_matches_cpu():
    a = torch.arange(3)
    with pytest.raises(RuntimeError) as cpu_err:
        a.add_(1.5)
    with pytest.raises(RuntimeError) as tpu_err:
        a.to(TPU).add_(1.5)
    assert str(tpu_err.value) == str(cpu_err.value)


def test_shape_error_matches_cpu():
    with pytest.raises(RuntimeError) as cpu_err:
        torch.ones(2, 3) + torch.ones(4)
    with pytest.raises(RuntimeError) as tpu_err:
        torch.ones(2, 3, device=TPU) + torch.ones(4, device=TPU)
    assert str(tpu_err.value) == str(cpu_err.value)


def test_index_assignment():
    a = torch.zeros(5, 3)
    b = a.to(TPU)
    idx = torch.tensor([0, 3])
    for t, i in ((a, idx), (b, idx.to(TPU))):
        t[i] = 1.0
        t[t > 0.5] = 2.0
        t.masked_fill_(t == 0, -1.0)
        t.index_put_((i,), torch.tensor(5.0, device=t.device), accumulate=True)
        t.scatter_(1, torch.zeros(5, 1, dtype=torch.long, device=t.device), 9.0)
    assert torch.equal(b.cpu(), a)


def test_version_counter_error_matches_cpu():
    msgs = []
    for dev in ("cpu", TPU):
        x = torch.tensor([1.0, 2.0], device=dev, requires_grad=True)
        y = x * 2
        z = y.sin()
        y.add_(1)
        with pytest.raises(RuntimeError) as e:
            z.sum().backward()
        msgs.append(str(e.value))
    for m in msgs:
        assert "modified by an inplace operation" in m and "is at version 1" in m


# ---------------------------------------------------------------------- devices


def test_mixed_device_error():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, "
                       "but found at least two devices, tpu:0 and cpu!"):
        torch.ones(2, device=TPU) + torch.ones(2)


def test_cpu_scalar_tensor_allowed():
    a = torch.randn(3)
    same(a.to(TPU) * torch.tensor(2.0), a * torch.tensor(2.0))


# -------------------------------------------------------------------- transfers


def test_host_reads():
    a = torch.tensor([[1.5, -2.0], [3.0, 4.25]])
    b = a.to(TPU)
    assert b.tolist() == a.tolist()
    assert b[1, 1].item() == 4.25
    assert (b.cpu().numpy() == a.numpy()).all()
    assert "device='tpu:0'" in repr(b)
    assert bool(b.sum() > 0)


def test_non_blocking_copy_does_not_alias_host():
    a = torch.ones(1000)
    b = a.to(TPU, non_blocking=True)
    a.fill_(5)
    assert b.sum().item() == 1000.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("non_blocking", [False, True])
def test_copied_cpu_source_stays_resizable(dtype, non_blocking):
    # as on CPU (and CUDA): copying x to the device leaves x's storage resizable
    for shape in [(2, 3), (64, 64)]:
        x = torch.arange(shape[0] * shape[1]).to(dtype).reshape(shape)
        want = x.clone()
        b = x.to(TPU, non_blocking=non_blocking)
        x.resize_(x.numel() + 14)
        assert x.shape == (want.numel() + 14,)
        assert torch.equal(b.cpu(), want)
        assert torch.equal(x[: want.numel()], want.flatten())


def test_pinned_dataloader():
    ds = torch.utils.data.TensorDataset(torch.arange(8.0).reshape(4, 2))
    dl = torch.utils.data.DataLoader(ds, batch_size=2, pin_memory=True)
    got = [b.to(TPU, non_blocking=True).cpu() for (b,) in dl]
    assert torch.equal(torch.cat(got), ds.tensors[0])
    assert torch.ones(2).pin_memory().is_pinned()


# -------------------------------------------------------------------------- RNG


def test_rng_reproducible():
    torch.manual_seed(123)
    a = torch.randn(100, device=TPU).cpu()
    b = torch.rand(100, device=TPU).cpu()
    torch.manual_seed(123)
    assert torch.equal(torch.randn(100, device=TPU).cpu(), a)
    assert torch.equal(torch.rand(100, device=TPU).cpu(), b)
    assert not torch.equal(a, torch.randn(100, device=TPU).cpu())


def test_rng_state_roundtrip():
    torch.tpu.manual_seed(7)
    st = torch.tpu.get_rng_state()
    a = torch.randn(10, device=TPU).cpu()
    torch.tpu.set_rng_state(st)
    assert torch.equal(torch.randn(10, device=TPU).cpu(), a)
    assert torch.tpu.initial_seed() == 7


def test_generator_device_tpu():
    g = torch.Generator(device=TPU)
    assert g.device.type == "tpu"
    g.manual_seed(3)
    a = torch.randn(5, generator=g, device=TPU).cpu()
    g.manual_seed(3)
    assert torch.equal(torch.randn(5, generator=g, device=TPU).cpu(), a)


# --------------------------------------------------------------------- autograd


def test_autograd_and_optimizers():
    torch.manual_seed(0)
    m_cpu = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    for opt_cls, kw in ((torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                        (torch.optim.Adam, {"lr": 1e-2}),
                        (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1})):
        m_c = __import__("copy").deepcopy(m_cpu)
        m_t = __import__("copy").deepcopy(m_cpu).to(TPU)
        o_c, o_t = opt_cls(m_c.parameters(), **kw), opt_cls(m_t.parameters(), **kw)
        x, y = torch.randn(16, 5), torch.randn(16, 2)
        for _ in range(3):
            for m, o, xx, yy in ((m_c, o_c, x, y), (m_t, o_t, x.to(TPU), y.to(TPU))):
                o.zero_grad()
                loss = torch.nn.functional.mse_loss(m(xx), yy)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
                o.step()
        for pc, pt in zip(m_c.parameters(), m_t.parameters()):
            same(pt.detach(), pc.detach(), atol=1e-5, rtol=1e-5)


def test_autocast_bfloat16():
    lin = torch.nn.Linear(4, 3).to(TPU)
    x = torch.randn(2, 4, device=TPU)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = lin(x)
        s = torch.softmax(y, -1)
    assert y.dtype == torch.bfloat16
    assert s.dtype == torch.float32


# ------------------------------------------------------------------ save / load


def test_save_load_roundtrip(tmp_path):
    m = torch.nn.Linear(3, 2).to(TPU)
    p = tmp_path / "m.pt"
    torch.save(m.state_dict(), p)
    sd = torch.load(p, map_location=TPU)
    assert all(v.device.type == "tpu" for v in sd.values())
    sd_cpu = torch.load(p, map_location="cpu")
    for k, v in m.state_dict().items():
        assert torch.equal(sd[k].cpu(), v.cpu()) and torch.equal(sd_cpu[k], v.cpu())
    m2 = torch.nn.Linear(3, 2).to(TPU)
    m2.load_state_dict(sd)
    x = torch.randn(2, 3, device=TPU)
    assert torch.equal(m2(x).detach().cpu(), m(x).detach().cpu())


def test_safetensors_onto_tpu(tmp_path):
    # safetensors validates device names itself and does not know "tpu": load, then move.
    from safetensors.torch import load_file, save_file

    t = {"w": torch.randn(4, 3), "b": torch.arange(5)}
    save_file(t, tmp_path / "t.safetensors")
    got = {k: v.to(TPU) for k, v in load_file(tmp_path / "t.safetensors").items()}
    save_file({k: v.cpu() for k, v in got.items()}, tmp_path / "u.safetensors")
    for k in t:
        assert got[k].device.type == "tpu"
        assert torch.equal(got[k].cpu(), t[k])


# ---------------------------------------------------------------- fallback, metrics


def test_unsupported_op_names_op(monkeypatch):
    monkeypatch.setattr(torch.tpu, "enable_cpu_fallback", False)
    with pytest.raises(NotImplementedError,
                       match=r"aten.special_airy_ai.* is not implemented for the tpu device"):
        torch.special.airy_ai(torch.randn(8, device=TPU))


def test_cpu_fallback_opt_in(monkeypatch):
    from torchtpu.eager import cpu_fallback

    monkeypatch.setattr(torch.tpu, "enable_cpu_fallback", True)
    cpu_fallback._warned.clear()  # it warns once per op and process
    a = torch.randn(8)
    with pytest.warns(UserWarning, match="running it on the CPU"):
        r = torch.special.airy_ai(a.to(TPU))
    same(r, torch.special.airy_ai(a))
    assert torchtpu.metrics()["fallbacks"]


def test_metrics_count_cache_and_syncs(fresh_shape_buckets):
    torchtpu.reset_metrics()
    x = torch.randn(7, 3, device=TPU)
    for _ in range(5):
        y = x * 3.0 + 1.0
    y.sum().item()
    m = torchtpu.metrics()
    assert m["cache_hits"] >= 8
    assert m["host_syncs"].get("item", 0) == 1
    assert m["ops_dispatched"] >= 10


def test_torch_accelerator_queries():
    x = torch.ones(256, device=TPU)
    torch.accelerator.synchronize()
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated() >= 1024
    assert torch.accelerator.max_memory_allocated() >= torch.accelerator.memory_allocated()
    assert "allocated_bytes.all.current" in torch.accelerator.memory_stats()
    del x


def test_memory_stats():
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.memory_allocated()
    x = torch.empty(1024, 1024, device=TPU)
    assert torch.tpu.memory_allocated() - before == 4 * 1024 * 1024
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    del x
    assert torch.tpu.memory_allocated() == before
    assert "allocated_bytes.all.current" in torch.tpu.memory_stats()


@pytest.mark.parametrize("make", [
    lambda x, **kw: torch.zeros_like(x, **kw),
    lambda x, **kw: torch.ones_like(x, **kw),
    lambda x, **kw: torch.full_like(x, 7, **kw),
    lambda x, **kw: torch.empty_like(x, **kw).fill_(2),
    lambda x, **kw: torch.full_like(x, 2.5, dtype=torch.float64, **kw),
])
def test_like_factories_honour_device_argument(make):
    """``zeros_like(x_tpu, device="cpu")`` is a CPU tensor, as with CUDA (it was left on
    tpu: the OpInfo int64 sweep's full_like/ones_like/zeros_like mismatches)."""
    base = torch.arange(6).reshape(2, 3)
    x = base.to(TPU).t()
    got = make(x, device="cpu")
    want = make(base.t(), device="cpu")
    assert got.device.type == "cpu"
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want)
    back = make(base.t(), device=TPU)
    same(back, want)


_ZERO_D_OPS = {
    "mul": lambda a, v: a * v,
    "add": lambda a, v: a + v,
    "rsub": lambda a, v: v - a,
    "pow scalar base": lambda a, v: torch.pow(v, a),
    "where": lambda a, v: torch.where(a > 0, a, v),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32, torch.uint8],
                         ids=str)
def test_zero_dim_tensor_with_python_scalar_keeps_dtype(dtype):
    """A Python number is a "wrapped number": it never widens a tensor's dtype within its
    category, a 0-d tensor included (``tensor(3, dtype=bfloat16) * 0.5`` is bfloat16;
    tpu returned float32, and int32 * 2 gave int64)."""
    x = torch.full((), 3, dtype=dtype)
    for name, f in _ZERO_D_OPS.items():
        for v in (0.5, 2):
            expected = f(x, v)
            actual = f(x.to("tpu"), v)
            assert actual.dtype == expected.dtype, (name, v)
            torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


def test_zero_dim_tensor_with_python_scalar_keeps_dtype_every_mode(eager_mode):
    x = torch.tensor(1.5, dtype=torch.bfloat16)
    assert (x.to("tpu") * 0.5 + 2).dtype == torch.bfloat16
    torch.testing.assert_close((x.to("tpu") * 0.5 + 2).cpu(), x * 0.5 + 2, rtol=0, atol=0)


@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float32, None], ids=str)
def test_norm_statistics_dtype_as_cpu(wdtype):
    """CPU's layer/batch norm kernels return the statistics of a bfloat16 input in
    bfloat16 unless the parameters are float32 (PyTorch's meta kernel, like CUDA, always
    says float32): tpu follows CPU, and the backward through them still matches."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, dtype=torch.bfloat16)
    w = None if wdtype is None else torch.rand(5, dtype=wdtype) + 0.5
    rm = torch.zeros(3, dtype=wdtype or torch.bfloat16)
    rv = torch.ones(3, dtype=wdtype or torch.bfloat16)
    wb = None if wdtype is None else torch.rand(3, dtype=wdtype) + 0.5
    calls = {
        "layer_norm": lambda d: torch.ops.aten.native_layer_norm(
            x.to(d), (5,), None if w is None else w.to(d), None, 1e-5),
        "batch_norm": lambda d: torch.ops.aten.native_batch_norm(
            x.to(d), None if wb is None else wb.to(d), None, rm.to(d), rv.to(d), True, 0.1,
            1e-5),
        "batch_norm eval": lambda d: torch.ops.aten.native_batch_norm(
            x.to(d), None if wb is None else wb.to(d), None, rm.to(d), rv.to(d), False, 0.1,
            1e-5),
        "_batch_norm_with_update": lambda d: torch.ops.aten._batch_norm_with_update(
            x.to(d), None if wb is None else wb.to(d), None, rm.clone().to(d),
            rv.clone().to(d), 0.1, 1e-5),
    }
    for name, f in calls.items():
        exp, act = f("cpu"), f("tpu")
        for e, a in zip(exp, act):
            assert (a.dtype, a.shape) == (e.dtype, e.shape), name
            torch.testing.assert_close(a.cpu(), e, atol=2e-2, rtol=2e-2)
    xc = x.clone().requires_grad_()
    xt = x.to("tpu").requires_grad_()
    F.layer_norm(xc, (5,)).square().sum().backward()
    F.layer_norm(xt, (5,)).square().sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, atol=5e-2, rtol=5e-2)


def test_trunc_division_exact_quotients_and_half_types():
    """``div(rounding_mode="trunc")`` truncates the correctly rounded quotient, as CPU:
    a broadcast divisor used to be turned into a reciprocal multiply by XLA (5.125 / 5.125
    gave 0.99999994, truncated to 0), and bfloat16/float16 round the quotient to their
    dtype before truncating (-3.890625 / -0.216796875 is 18 on CPU)."""
    a = torch.full((10, 1, 5), 5.125)
    b = torch.full((1, 10, 5), 5.125)
    same(torch.div(a.to(TPU), b.to(TPU), rounding_mode="trunc"),
         torch.div(a, b, rounding_mode="trunc"))
    same(torch.div(a.to(TPU), 5.125, rounding_mode="trunc"), torch.div(a, 5.125, rounding_mode="trunc"))
    for dt in (torch.bfloat16, torch.float16):
        x = torch.tensor([-3.890625, 8.375, 2.984375], dtype=dt)
        y = torch.tensor([-0.216796875, 0.55859375, -0.06103515625], dtype=dt)
        same(torch.div(x.to(TPU), y.to(TPU), rounding_mode="trunc"),
             torch.div(x, y, rounding_mode="trunc"))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32])
@pytest.mark.parametrize("args", [(0, 2.5, 0.5), (0, 5, 0.3), (1.7, 9, 2.6)])
def test_arange_float_range_integer_dtype_as_cpu(args, dtype):
    """``torch.arange(0, 2.5, 0.5, dtype=torch.int8)``: CPU takes the length from the
    float range (5) and the values from the start and step cast to the integer type (0,
    0, ...).  PyTorch's reference (meta) kernel casts first and rejects the 0 step."""
    expected = torch.arange(*args, dtype=dtype)
    actual = torch.arange(*args, dtype=dtype, device="tpu")
    assert actual.dtype == dtype
    assert torch.equal(actual.cpu(), expected)


@pytest.mark.parametrize("args", [(0, 2.5, 0.5), (0, 3, 1), (3,)])
def test_arange_bool_raises_as_cpu(args):
    """CPU has no bool arange kernel; tpu returned values."""
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.arange(*args, dtype=torch.bool)
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.arange(*args, dtype=torch.bool, device="tpu")


def test_pickle_of_tpu_tensors_round_trips():
    # pickle.dumps(t) (object collectives, multiprocessing queues, copy via pickle) went
    # through PyTorch's legacy storage writer, which raised AttributeError on tpu
    import pickle

    base = torch.arange(12.0).reshape(3, 4)
    view = base.to("tpu")[1:, ::2]
    got = pickle.loads(pickle.dumps(view))
    assert got.device == view.device
    assert (got.stride(), got.storage_offset()) == (view.stride(), view.storage_offset())
    assert torch.equal(got.cpu(), base[1:, ::2])
    half = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    obj = {"w": half.to("tpu"), "step": 3}
    back = pickle.loads(pickle.dumps(obj))
    assert back["step"] == 3 and torch.equal(back["w"].cpu(), half)


@pytest.mark.parametrize("make", [lambda: torch.ones(3, 1).t(),
                                  lambda: torch.ones(4, 1, 2).permute(1, 0, 2),
                                  lambda: torch.ones(3, 1, dtype=torch.complex64).conj().t(),
                                  lambda: torch.ones(2, 3)[:1]])
def test_copies_keep_size_one_dimension_strides_as_cpu(make):
    # a dense tensor's copy keeps its strides as they are (preserve_format), a size-1
    # dimension's included: ones(3, 1).t() has strides (1, 1), not the contiguous (3, 1)
    x = make()
    t = x.to(TPU)
    assert t.stride() == x.to("meta").stride() == x.clone().stride()
    assert t.to(torch.float64).stride() == x.to(torch.float64).stride()
    assert t.clone().stride() == x.clone().stride()
    assert torch.equal(t.cpu(), x)


def test_tpu_streams_carry_torch_stream_identity():
    """``torch.tpu.Stream`` has ``torch.Stream``'s identity fields (torch 2.15's FSDP2
    reads ``stream_id``, ``device_index`` and ``device_type`` of the current stream)."""
    ref = torch.Stream(device="tpu")
    s, cur = torch.tpu.Stream(), torch.tpu.current_stream()
    for st in (s, cur):
        assert st.device_type == ref.device_type
        assert st.device_index == ref.device_index
    assert isinstance(s.stream_id, int) and s.stream_id != cur.stream_id


@pytest.mark.parametrize("fn", [
    lambda b: b * float("inf"),
    lambda b: b / 0,
    lambda b: b * float("nan"),
    lambda b: torch.mul(b, torch.tensor(float("inf"), device=b.device)),
    lambda b: b.float() * float("inf"),
    lambda b: b.to(torch.float64) / 0,
    lambda b: torch._foreach_mul([b], 1e39)[0],
    lambda b: torch.addcmul(torch.zeros(3, device=b.device), b,
                            torch.full((3,), float("inf"), device=b.device)),
], ids=["mul_inf", "div_zero", "mul_nan", "mul_tensor_inf", "float_then_mul",
        "double_then_div", "foreach_mul_overflow", "addcmul_inf"])
def test_bool_times_inf_is_nan_as_cpu(fn, eager_mode):
    """A bool tensor promoted to float and multiplied by inf or divided by 0: False gives
    NaN (0 * inf), as on CPU.  XLA's simplifier turns multiply(convert(bool), y) into
    select(bool, y, 0), which gave 0."""
    b = torch.tensor([False, True, False])
    torch.testing.assert_close(fn(b.to("tpu")).cpu(), fn(b), equal_nan=True)


@pytest.mark.parametrize("fn", [
    lambda b: b.pow(True), lambda b: b.pow(False), lambda b: b.clone().pow_(True),
    lambda b: b.clone().pow_(False), lambda b: torch._foreach_pow([b], True)[0],
    lambda b: torch._foreach_pow([b], [False])[0], lambda b: b.pow(2), lambda b: b ** 3.0,
], ids=["pow_true", "pow_false", "pow_true_", "pow_false_", "foreach_scalar",
        "foreach_scalar_list", "pow_int", "pow_float"])
def test_bool_tensor_to_a_scalar_power_as_cpu(fn, eager_mode):
    """``bool ** True`` is the tensor, ``bool ** False`` all True, both bool, as on CPU
    (the integer-power lowering raised on bool)."""
    b = torch.tensor([True, False, True])
    got, want = fn(b.to("tpu")).cpu(), fn(b)
    assert got.dtype == want.dtype
    assert torch.equal(got, want)


@pytest.mark.parametrize("fn", [lambda b: torch.pow(b, b), lambda b: torch.pow(True, b),
                                lambda b: torch._foreach_pow([b], [b])],
                         ids=["tensor_tensor", "scalar_tensor", "foreach_list"])
def test_bool_tensor_power_raises_as_cpu(fn):
    """CPU's pow kernels with a bool tensor exponent have no Bool instantiation."""
    b = torch.tensor([True, False])
    with pytest.raises(NotImplementedError) as cpu:
        fn(b)
    with pytest.raises(NotImplementedError) as tpu:
        fn(b.to("tpu"))
    assert str(tpu.value) == str(cpu.value)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0, 4), (3, 0)])
def test_empty_tensors_come_back_with_cpu_strides(eager_mode, shape):
    # numpy gives an empty array all-zero strides; CPU's empty tensors keep theirs
    pairs = [
        (torch.empty(shape, device="tpu").cpu(), torch.empty(shape).cpu()),
        (torch.empty(shape).to("tpu").cpu(), torch.empty(shape)),
        (torch.zeros(shape, device="tpu").to("cpu", torch.float64),
         torch.zeros(shape).to("cpu", torch.float64)),
        (torch.zeros(shape, device="tpu").flip(0).cpu(), torch.zeros(shape).flip(0)),
    ]
    if len(shape) == 2:
        pairs.append((torch.zeros(shape, device="tpu").t().cpu(), torch.zeros(shape).t().cpu()))
    for got, ref in pairs:
        assert got.shape == ref.shape and got.dtype == ref.dtype
        assert got.stride() == ref.stride(), (got.stride(), ref.stride())


@pytest.mark.parametrize("make", [
    lambda: torch.arange(12, dtype=torch.int8).reshape(3, 4),
    lambda: torch.randn(2000, generator=torch.Generator().manual_seed(0)),  # summarized
    lambda: torch.tensor([float("nan"), float("inf"), -0.0, 1e-8, 3.5]),
    lambda: torch.tensor(2.5),
    lambda: torch.tensor([], dtype=torch.int64),
    lambda: torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
    lambda: torch.tensor([1 + 2j, -0.5j], dtype=torch.complex64),
    lambda: torch.tensor([True, False]),
], ids=["int8", "summarized", "specials", "0d", "empty", "bfloat16", "complex", "bool"])
def test_printing_formats_as_cpu_from_one_host_read(make):
    """``repr`` formats the values as CPU's (the device suffix added) with one host read
    (PyTorch's formatter calls ``item()`` per element, twice: 2N syncs; 3,340 per decode
    step where torchao's int matmul checks ``"FakeTensor" in x.__repr__()``)."""
    t = make()
    d = t.to("tpu")
    before = sum(torchtpu.metrics()["host_syncs"].values())
    got = repr(d)
    assert sum(torchtpu.metrics()["host_syncs"].values()) - before <= 1
    want = repr(t)
    assert got.replace("device='tpu:0', ", "").replace(",\n       device='tpu:0')", ")") \
        .replace(", device='tpu:0')", ")") == want, (got, want)
    assert "device='tpu:0'" in got
    g = (torch.ones(3) * 2).requires_grad_()
    assert "grad_fn=<MulBackward0>" in repr(g.to("tpu") * 3)
