"""Less common dtypes and ops vs CPU: ``.item()`` of reduced-precision floats, the float8
``fnuz`` dtypes, float8_e4m3fn saturation, complex random fills, quantized tensors and
complex32 (clear NotImplementedError), ``index_reduce_`` with an empty index."""

import pytest
import torch

TPU = "tpu"
F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


# ---------------------------------------------------------------- .item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, *F8])
@pytest.mark.parametrize("shape", [(1,), (), (1, 1)])
def test_item_of_one_element_reduced_float(eager_mode, dtype, shape):
    cpu = torch.full(shape, -1.5).to(dtype)
    t = cpu.to(TPU)
    got = t.item()
    assert type(got) is float and got == cpu.item()
    assert (t * 2).item() == (cpu.float() * 2).to(dtype).item()


# ------------------------------------------------------------------ float8


@pytest.mark.parametrize("dtype", F8)
def test_float8_every_bit_pattern_round_trips_and_converts_like_cpu(dtype):
    bits = torch.arange(256, dtype=torch.uint8)
    cpu = bits.view(dtype)
    t = cpu.to(TPU)
    assert torch.equal(t.cpu().view(torch.uint8), bits)
    torch.testing.assert_close(t.float().cpu(), cpu.float(), equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", F8)
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_float8_from_float_like_cpu(dtype, src):
    v = torch.cat([
        torch.linspace(-600, 600, 1201),
        torch.tensor([448., 460., 464., 465., 480., 1e5, 57344., 61440., 1e-9, -1e-9, 0.,
                      float("inf"), -float("inf"), float("nan")]),
        torch.linspace(-0.01, 0.01, 101),
    ]).to(src)
    # float8_e4m3fn has no inf: PyTorch saturates to +-448 (XLA alone would give NaN)
    torch.testing.assert_close(v.to(TPU).to(dtype).cpu().float(), v.to(dtype).float(),
                               equal_nan=True, rtol=0, atol=0)


def test_float8_e4m3fn_from_int_and_copy_saturate_like_cpu():
    i = torch.tensor([1, 500, -1000, 3])
    assert torch.equal(i.to(TPU).to(torch.float8_e4m3fn).cpu().float(),
                       i.to(torch.float8_e4m3fn).float())
    big = torch.full((3,), 1e4)
    cpu = torch.zeros(3, dtype=torch.float8_e4m3fn).copy_(big)
    t = torch.zeros(3, dtype=torch.float8_e4m3fn, device=TPU).copy_(big.to(TPU))
    assert torch.equal(t.cpu().float(), cpu.float())


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz])
def test_fnuz_factories_and_arithmetic(dtype):
    cpu = torch.zeros(4, dtype=dtype)
    t = torch.zeros(4, dtype=dtype, device=TPU)
    assert t.dtype == dtype and torch.equal(t.cpu().float(), cpu.float())
    a = torch.tensor([1.5, -2.0, 0.25, 3.0])
    got = (a.to(TPU).to(dtype).float() * 2).cpu()
    torch.testing.assert_close(got, a.to(dtype).float() * 2)


# ---------------------------------------------------------- complex random


def _parts(z):
    z = z.cpu()
    return z.real, z.imag


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_uniform_fills_both_parts_like_cpu(eager_mode, dtype):
    # CPU fills view_as_real(x): real and imaginary parts each uniform on [from, to)
    n = 20000
    for x in (torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype, device=TPU)):
        x.uniform_(2, 3)
        for p in _parts(x):
            assert p.min() >= 2 and p.max() < 3
            assert abs(p.mean().item() - 2.5) < 0.02 and abs(p.std().item() - 0.2887) < 0.02
    r = torch.rand(n, dtype=dtype, device=TPU)
    assert r.dtype == dtype and all(0 <= p.min() and p.max() < 1 for p in _parts(r))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_normal_like_cpu(eager_mode, dtype):
    # CPU: each part ~ N(mean, std / sqrt(2)); randn: complex variance 1
    n = 40000
    for dev in ("cpu", TPU):
        for p in _parts(torch.empty(n, dtype=dtype, device=dev).normal_(5, 2)):
            assert abs(p.mean().item() - 5) < 0.05 and abs(p.std().item() - 2 ** 0.5) < 0.05
        for p in _parts(torch.randn(n, dtype=dtype, device=dev)):
            assert abs(p.mean().item()) < 0.03 and abs(p.std().item() - 0.5 ** 0.5) < 0.03
        m = torch.full((n,), 1 + 1j, dtype=dtype, device=dev)
        std = torch.full((n,), 2.0, device=dev)
        for p in _parts(torch.normal(m, std)):
            assert abs(p.mean().item() - 1) < 0.05 and abs(p.std().item() - 2 ** 0.5) < 0.05


# ------------------------------------------------------------- quantization


@pytest.mark.parametrize("make", [
    lambda d: torch.quantize_per_tensor(torch.ones(3, device=d), 0.1, 0, torch.quint8),
    lambda d: torch.quantize_per_channel(torch.ones(2, 3, device=d), torch.ones(2, device=d),
                                         torch.zeros(2, dtype=torch.long, device=d), 0,
                                         torch.qint8),
    lambda d: torch._empty_affine_quantized([3], scale=0.1, zero_point=0, dtype=torch.quint8,
                                            device=d),
    lambda d: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8).to(d),
], ids=["quantize_per_tensor", "quantize_per_channel", "empty_affine_quantized", "to"])
def test_quantized_tensors_raise_a_clear_error(make):
    assert make("cpu").is_quantized  # CPU supports it
    with pytest.raises(NotImplementedError, match="quantized tensors are not supported"):
        make(TPU)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("use", [
    lambda d: torch.eye(3).to_sparse().to(d),
    lambda d: torch.eye(3).to_sparse_csr().to(d) @ torch.ones(3, 2, device=d),
    lambda d: torch.eye(3).to_sparse_csc().to(d).to_dense(),
    lambda d: torch.sparse.sampled_addmm(torch.eye(3).to_sparse_csr().to(d),
                                         torch.ones(3, 3, device=d), torch.ones(3, 3, device=d)),
], ids=["coo-move", "csr-matmul", "csc-to_dense", "csr-sampled_addmm"])
def test_sparse_tensors_raise_a_clear_error(use):
    """Sparse layouts work on CPU; on tpu they raise NotImplementedError naming sparse
    tensors (was PyTorch's "Could not run ... from the 'SparseCsrtpu' backend")."""
    assert isinstance(use("cpu"), torch.Tensor)
    with pytest.raises(NotImplementedError, match="sparse tensors are not supported"):
        use(TPU)


# ---------------------------------------------------------------- complex32


@pytest.mark.parametrize("make", [
    lambda d: torch.tensor([1 + 2j], dtype=torch.chalf).to(d),
    lambda d: torch.zeros(2, dtype=torch.chalf, device=d),
    lambda d: torch.tensor([1.0, 2.0], dtype=torch.half, device=d).view(torch.chalf),
    lambda d: torch.view_as_complex(torch.tensor([[1.0, 2.0]], dtype=torch.half, device=d)),
    lambda d: torch.ones(2, device=d).to(torch.chalf),
], ids=["to", "zeros", "view", "view_as_complex", "cast"])
def test_complex32_raises_not_implemented(make):
    assert make("cpu").dtype == torch.complex32
    with pytest.raises(NotImplementedError, match="complex32"):
        make(TPU).cpu()


# -------------------------------------------------------------- index_reduce


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("n", [0, 3])
def test_index_reduce_empty_index_like_cpu(eager_mode, reduce, include_self, n):
    def run(d):
        x = torch.arange(6.0).reshape(3, 2).to(d)
        idx = torch.tensor([0, 2, 0][:n], dtype=torch.long, device=d)
        src = (torch.arange(2.0 * n).reshape(n, 2) + 1).to(d)
        a = x.clone().index_reduce_(0, idx, src, reduce, include_self=include_self)
        b = x.index_reduce(0, idx, src, reduce, include_self=include_self)
        out = torch.empty(3, 2, device=d)
        c = torch.index_reduce(x, 0, idx, src, reduce, include_self=include_self, out=out)
        return [v.cpu() for v in (a, b, c)]

    for got, want in zip(run(TPU), run("cpu")):
        torch.testing.assert_close(got, want)


def test_index_reduce_empty_index_errors_like_cpu():
    for d in ("cpu", TPU):
        x = torch.ones(3, 2, device=d)
        idx = torch.empty(0, dtype=torch.long, device=d)
        with pytest.raises(RuntimeError, match="Expected reduce to be one of"):
            x.index_reduce_(0, idx, torch.empty(0, 2, device=d), "sum")
        with pytest.raises(RuntimeError, match="Expected reduce to be one of"):
            torch.index_reduce(x, 0, idx, torch.empty(0, 2, device=d), "sum",
                               out=torch.empty(3, 2, device=d))


@pytest.mark.parametrize("dtype", F8 + [torch.bfloat16, torch.complex64, torch.bool])
def test_strided_views_read_back_like_cpu(dtype):
    # .cpu() of a transposed or strided view goes through numpy's as_strided, which
    # could not rebuild ml_dtypes' float8_e5m2 ("data type '<f1' not understood")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(dtype)
    t = x.to("tpu")
    for view in (lambda v: v.t(), lambda v: v[:, ::2], lambda v: v[1:, 1:].t()):
        assert torch.equal(view(t).cpu().view(torch.uint8) if dtype in F8 else view(t).cpu(),
                           view(x).contiguous().view(torch.uint8) if dtype in F8
                           else view(x).contiguous())
