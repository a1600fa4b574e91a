"""Quantized matrix products (torchao's int8 / int8-weight-only / float8 paths):
``_int_mm``, ``_weight_int8pack_mm`` and ``_scaled_mm`` on tpu against CPU PyTorch.
``_int_mm`` is exact (int32 sums, wrapping past the int32 range as on CPU); the bfloat16
``_weight_int8pack_mm`` and ``_scaled_mm`` with exactly summable data equal CPU's bit for
bit; float32 sums of many terms may differ in the last ulps (summation order)."""

from __future__ import annotations

import pytest
import torch

TPU = "tpu"
F8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _i8(shape, seed, low=-128, high=128):
    return torch.randint(low, high, shape, generator=_gen(seed), dtype=torch.int8)


def _same(got, want):
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    both_nan = torch.isnan(got.float()) & torch.isnan(want.float())
    diff = int(((got.float() != want.float()) & ~both_nan).sum())
    assert diff == 0, f"{diff} of {want.numel()} elements differ from CPU"


def _raises_like_cpu(fn, *args, message=False, **kwargs):
    """The tpu call raises CPU's exception type (``message``: and CPU's first line)."""
    with pytest.raises(Exception) as cpu:
        fn(*args, **kwargs)
    moved = [a.to(TPU) if isinstance(a, torch.Tensor) else a for a in args]
    kw = {k: v.to(TPU) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with pytest.raises(type(cpu.value)) as got:
        fn(*moved, **kw)
    if message:
        assert str(got.value).splitlines()[0] == str(cpu.value).splitlines()[0]


# --- _int_mm -------------------------------------------------------------------------

@pytest.mark.parametrize("mkn", [(16, 32, 8), (3, 5, 7), (1, 1, 1), (33, 200, 17)], ids=str)
def test_int_mm_matches_cpu_exactly(mkn):
    m, k, n = mkn
    a, b = _i8((m, k), 0), _i8((k, n), 1)
    _same(torch._int_mm(a.to(TPU), b.to(TPU)), torch._int_mm(a, b))


@pytest.mark.parametrize("value", [-128, 127], ids=str)
def test_int_mm_large_k_extreme_values_exact(value):
    # K = 4096 products of -128 * -128 = 16384 sum to 2**26: beyond float32's exact range
    # per partial product, exact in int32
    k = 4096
    a = torch.full((8, k), value, dtype=torch.int8)
    b = torch.full((k, 8), -128, dtype=torch.int8)
    b[::3] = 127
    a[:, ::7] = -value - 1
    want = torch._int_mm(a, b)
    _same(torch._int_mm(a.to(TPU), b.to(TPU)), want)
    exact = a.long() @ b.long()
    assert torch.equal(want.long(), exact)


def test_int_mm_random_large_k_exact():
    a, b = _i8((64, 4096), 2), _i8((4096, 48), 3)
    want = torch._int_mm(a, b)
    assert torch.equal(want.long(), a.long() @ b.long())
    _same(torch._int_mm(a.to(TPU), b.to(TPU)), want)


def test_int_mm_wraps_past_int32_like_cpu():
    k = 131073  # 131073 * 16384 > 2**31 - 1
    a = torch.full((2, k), -128, dtype=torch.int8)
    b = torch.full((k, 2), -128, dtype=torch.int8)
    _same(torch._int_mm(a.to(TPU), b.to(TPU)), torch._int_mm(a, b))


def test_int_mm_uint8_self_and_empty():
    a = torch.randint(0, 256, (9, 40), generator=_gen(4), dtype=torch.uint8)
    b = _i8((40, 6), 5)
    _same(torch._int_mm(a.to(TPU), b.to(TPU)), torch._int_mm(a, b))
    for a, b in [(_i8((0, 8), 0), _i8((8, 4), 1)), (_i8((5, 0), 0), _i8((0, 4), 1))]:
        _same(torch._int_mm(a.to(TPU), b.to(TPU)), torch._int_mm(a, b))


def test_int_mm_out():
    a, b = _i8((16, 32), 6), _i8((32, 8), 7)
    out = torch.empty(16, 8, dtype=torch.int32, device=TPU)
    r = torch._int_mm(a.to(TPU), b.to(TPU), out=out)
    _same(out, torch._int_mm(a, b))
    assert r is out
    _raises_like_cpu(torch._int_mm, a, b, out=torch.empty(16, 8, dtype=torch.int64))


@pytest.mark.parametrize("make", [lambda d: torch.empty(3, 8, dtype=torch.int32, device=d),
                                  lambda d: torch.empty(16, 9, dtype=torch.int32, device=d),
                                  lambda d: torch.empty(16 * 8, dtype=torch.int32, device=d),
                                  lambda d: torch.empty(8, 16, dtype=torch.int32,
                                                        device=d).t()],
                         ids=["rows", "cols", "1d", "transposed"])
def test_int_mm_out_is_checked_never_resized_as_cpu(make):
    # (CPU's _int_mm.out raises for an out of another shape or a non-contiguous one; the
    # generic out= rule would resize it with a warning, or write through its strides)
    a, b = _i8((16, 32), 6), _i8((32, 8), 7)
    with pytest.raises(RuntimeError) as cpu:
        torch._int_mm(a, b, out=make("cpu"))
    with pytest.raises(RuntimeError) as got:
        torch._int_mm(a.to(TPU), b.to(TPU), out=make(TPU))
    assert str(got.value).splitlines()[0] == str(cpu.value).splitlines()[0]


@pytest.mark.parametrize("case", ["k", "dtype_a", "dtype_b", "uint8_b", "3d", "1d"])
def test_int_mm_errors_like_cpu(case):
    a, b = _i8((16, 32), 0), _i8((32, 8), 1)
    args = {"k": (a, _i8((16, 8), 1)), "dtype_a": (a.float(), b), "dtype_b": (a, b.int()),
            "uint8_b": (a, b.to(torch.uint8)), "3d": (a.view(2, 8, 32), b),
            "1d": (a[0], b)}[case]
    _raises_like_cpu(torch._int_mm, *args, message=True)


# --- _weight_int8pack_mm -------------------------------------------------------------

def _int8pack_args(dtype, m, k, n, seed=0):
    g = _gen(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s = (torch.rand(n, generator=g) * 0.02 + 0.001).to(dtype)
    return x, w, s


@pytest.mark.parametrize("mkn", [(4, 64, 48), (17, 4096, 40), (33, 256, 64)], ids=str)
def test_weight_int8pack_mm_bfloat16_matches_cpu_exactly(mkn):
    # CPU accumulates in float32, scales in float32 and rounds once: exactly what the
    # lowering does; a float32 accumulator rounded once to bfloat16 hides the order of the
    # float32 sums (a tie at a bfloat16 rounding boundary would be needed to differ)
    x, w, s = _int8pack_args(torch.bfloat16, *mkn)
    _same(torch._weight_int8pack_mm(x.to(TPU), w.to(TPU), s.to(TPU)),
          torch._weight_int8pack_mm(x, w, s))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("mkn", [(4, 64, 48), (17, 4096, 40), (3, 7, 5)], ids=str)
def test_weight_int8pack_mm_float32_float16_match_cpu(dtype, mkn):
    x, w, s = _int8pack_args(dtype, *mkn)
    want = torch._weight_int8pack_mm(x, w, s)
    got = torch._weight_int8pack_mm(x.to(TPU), w.to(TPU), s.to(TPU)).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    # float32: CPU's vectorized kernel sums in another order: the difference is bounded by
    # a few ulps of the sum of |terms| (cancellation makes it large relative to the result);
    # float16: CPU's kernel is one float16 ulp off the float32-accumulated value now and then
    mag = (x.double().abs() @ w.double().abs().t() * s.double().abs())
    ulps = 2 ** -23 if dtype == torch.float32 else 2 ** -10
    diff = (got.double() - want.double()).abs()
    assert bool((diff <= 8 * ulps * mag).all()), float((diff / mag).max())


def test_weight_int8pack_mm_errors_like_cpu():
    x, w, s = _int8pack_args(torch.float32, 4, 32, 8)
    f = torch._weight_int8pack_mm
    _raises_like_cpu(f, x.double(), w, s.double(), message=True)
    _raises_like_cpu(f, x, w.int(), s)
    _raises_like_cpu(f, x, w, s[:4])
    _raises_like_cpu(f, x, w, s.view(8, 1))
    _raises_like_cpu(f, x.view(2, 2, 32), w, s)
    _raises_like_cpu(f, x[0], w, s)
    _raises_like_cpu(f, x.bfloat16(), w, s)


# --- _scaled_mm ----------------------------------------------------------------------

def _emulated(*args, **kwargs):
    """CPU's emulated kernel (CPUs with AMX otherwise run oneDNN's)."""
    with torch.backends.mkldnn.flags(enabled=False):
        return torch._scaled_mm(*args, **kwargs)


def _fp8_args(da, db, m=32, k=64, n=48, seed=0, summable=False):
    """``summable``: no magnitudes under 1/16, so that every float32 sum of products is
    exact and any summation order gives CPU's bits."""
    g = _gen(seed)
    a, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    if summable:
        a, b = [torch.where(t.abs() < 0.0625, torch.zeros_like(t), t) for t in (a, b)]
    return a.to(da), b.to(db).t()


def _tpu(*ts):
    return [t.to(TPU) if t is not None else None for t in ts]


OUT = [None, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
       torch.float8_e5m2]


@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("out_dtype", OUT, ids=str)
@pytest.mark.parametrize("fmt", F8, ids=str)
def test_scaled_mm_power_of_two_scales_match_cpu_exactly(fmt, out_dtype, with_bias):
    a, b = _fp8_args(fmt, fmt, summable=True)
    sa, sb = torch.tensor(0.5), torch.tensor(4.0)
    bias = None
    if with_bias:
        bd = out_dtype if out_dtype in (torch.bfloat16, torch.float16) else torch.float32
        bias = torch.randn(48, generator=_gen(9)).to(bd)
    kw = dict(bias=bias, out_dtype=out_dtype)
    want = _emulated(a, b, sa, sb, **kw)
    at, bt, sat, sbt, biast = _tpu(a, b, sa, sb, bias)
    _same(torch._scaled_mm(at, bt, sat, sbt, bias=biast, out_dtype=out_dtype), want)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_scaled_mm_any_scales_and_mixed_formats(out_dtype):
    a, b = _fp8_args(torch.float8_e4m3fn, torch.float8_e5m2, 16, 256, 24, seed=3)
    sa, sb = torch.tensor([0.37]), torch.tensor(1.9)
    bias = torch.randn(24, generator=_gen(2))
    want = _emulated(a, b, sa, sb, bias=bias, out_dtype=out_dtype, use_fast_accum=True)
    got = torch._scaled_mm(*_tpu(a, b, sa, sb), bias=bias.to(TPU), out_dtype=out_dtype,
                           use_fast_accum=True).cpu()
    if out_dtype == torch.bfloat16:
        _same(got, want)
    else:  # float32 sums of 256 scaled (inexact) products: summation order, a few ulps
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_scaled_mm_rowwise_and_scale_result():
    a, b = _fp8_args(torch.float8_e4m3fn, torch.float8_e4m3fn, 16, 32, 8, seed=4)
    sa = torch.tensor([0.5, 2.0, 1.0, 0.25] * 4).view(16, 1)
    sb = torch.tensor([2.0, 1.0] * 4).view(1, 8)
    _same(torch._scaled_mm(*_tpu(a, b, sa, sb), out_dtype=torch.float32),
          _emulated(a, b, sa, sb, out_dtype=torch.float32))
    one, sr = torch.tensor(1.0), torch.tensor(2.0)
    for od in (None, torch.float8_e4m3fn, torch.float32):
        _same(torch._scaled_mm(*_tpu(a, b, one, one), scale_result=sr.to(TPU), out_dtype=od),
              _emulated(a, b, one, one, scale_result=sr, out_dtype=od))


@pytest.mark.parametrize("case", ["float_a", "double_scale", "vector_scale", "k",
                                  "bias_size", "1d", "scale_result"])
def test_scaled_mm_errors_like_cpu(case):
    a, b = _fp8_args(torch.float8_e4m3fn, torch.float8_e4m3fn, 16, 32, 8)
    one = torch.tensor(1.0)
    args, kw = {
        "float_a": ((a.float(), b, one, one), {}),
        "double_scale": ((a, b, one.double(), one), {}),
        "vector_scale": ((a, b, torch.ones(16), torch.ones(8)), {}),
        "k": ((a, _fp8_args(torch.float8_e4m3fn, torch.float8_e4m3fn, 16, 16, 8)[1],
               one, one), {}),
        "bias_size": ((a, b, one, one), {"bias": torch.zeros(16, 8),
                                          "out_dtype": torch.float32}),
        "1d": ((a[0], b, one, one), {}),
        "scale_result": ((a, b, one, one), {"scale_result": torch.ones(2),
                                             "out_dtype": torch.float8_e4m3fn}),
    }[case]
    with torch.backends.mkldnn.flags(enabled=False):
        _raises_like_cpu(torch._scaled_mm, *args, message=True, **kw)
