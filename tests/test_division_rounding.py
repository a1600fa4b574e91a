"""Division is correctly rounded, as on CPU: XLA rewrites a division by a broadcast (a
scalar, a size-1 dim) into a multiplication by the reciprocal, one ulp off in about a
third of the elements, unless the lowering keeps it from doing so
(``ops.elementwise.ieee_div``).  Every quotient must equal CPU's bit for bit."""

from __future__ import annotations

import pytest
import torch

TPU = "tpu"

FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _data(dtype, shape=(64, 48), seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 10).to(dtype)


def _divisor(dtype, shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 7 + 0.3).to(dtype)


def _same(got, want):
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    diff = int((got != want).sum())
    assert diff == 0, f"{diff} of {want.numel()} quotients differ from CPU"


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape", [(64, 1), (1, 48), (), (48,)], ids=str)
def test_division_by_a_broadcast_tensor_matches_cpu_bitwise(eager_mode, dtype, shape):
    a, b = _data(dtype), _divisor(dtype, shape)
    _same(a.to(TPU) / b.to(TPU), a / b)
    _same(torch.true_divide(a.to(TPU), b.to(TPU)), torch.true_divide(a, b))
    x = a.to(TPU)
    x /= b.to(TPU)
    _same(x, a / b)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("scalar", [3, 3.3, 7.0, 0.1])
def test_division_by_a_python_scalar_matches_cpu_bitwise(eager_mode, dtype, scalar):
    a = _data(dtype)
    _same(a.to(TPU) / scalar, a / scalar)
    _same(a.to(TPU).div(scalar), a.div(scalar))


@pytest.mark.parametrize("mode", ["trunc", "floor"])
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
def test_rounding_modes_by_a_broadcast_divisor_match_cpu(dtype, mode):
    a, b = _data(dtype), _divisor(dtype, (64, 1))
    _same(a.to(TPU).div(b.to(TPU), rounding_mode=mode), a.div(b, rounding_mode=mode))
    _same(a.to(TPU).div(3.3, rounding_mode=mode), a.div(3.3, rounding_mode=mode))
    _same(torch.floor_divide(a.to(TPU), b.to(TPU)), torch.floor_divide(a, b))


def test_per_row_scales_as_int8_quantization_computes_them():
    # torchao's weight-only int8: s = amax(|w|, dim=1) / 127; q = round(w / s)
    w = _data(torch.float32, (128, 256), seed=5)
    s = w.abs().amax(dim=1, keepdim=True) / 127
    st = w.to(TPU).abs().amax(dim=1, keepdim=True) / 127
    _same(st, s)
    _same(torch.round(w.to(TPU) / st), torch.round(w / s))


def test_compiled_division_by_a_broadcast_matches_cpu():
    def f(w, s):
        return w / s, w / 3.3

    a, b = _data(torch.float32), _divisor(torch.float32, (64, 1))
    got = torch.compile(f, backend="tpu")(a.to(TPU), b.to(TPU))
    for g, w in zip(got, f(a, b)):
        _same(g, w)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
def test_mean_divides_an_exact_sum_as_cpu(dtype):
    # integer-valued data: both sums are exact, so the quotient alone decides the bits
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-50, 50, (96, 3), generator=g).to(dtype)
    _same(x.to(TPU).mean(dim=1), x.mean(dim=1))
    y = torch.randint(-50, 50, (7, 96), generator=g).to(dtype)
    _same(y.to(TPU).mean(dim=0, keepdim=True), y.mean(dim=0, keepdim=True))
    _same(y.to(TPU).mean(), y.mean())


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
def test_two_divisions_in_one_program_are_not_merged(eager_mode, dtype):
    # a fused program (DEFER_AND_FUSE, torch.compile) must not become x / (3 * 7)
    a, b, c = _data(dtype), _divisor(dtype, (64, 48)), _divisor(dtype, (64, 48), seed=2)
    _same(a.to(TPU) / 3 / 7, a / 3 / 7)
    _same(a.to(TPU) / b.to(TPU) / c.to(TPU), a / b / c)
    k = a.round()  # integer values: exact sums, so the mean's bits are the quotient's
    _same(k.to(TPU).mean(1) / 7, k.mean(1) / 7)

    def f(x, y, z):
        return x / 3 / 7, x / y / z

    got = torch.compile(f, backend="tpu")(a.to(TPU), b.to(TPU), c.to(TPU))
    for g, w in zip(got, f(a, b, c)):
        _same(g, w)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
@pytest.mark.parametrize("decimals", [1, 2, -2])
def test_round_with_decimals_matches_cpu_bitwise(eager_mode, dtype, decimals):
    x = _data(dtype) * 37
    _same(torch.round(x.to(TPU), decimals=decimals), torch.round(x, decimals=decimals))


# bfloat16/float16: CPU's kernels take a scalar path for a one-element divisor (float32
# division by the divisor's own value, one rounding at the end) and round every step to
# the dtype otherwise (ops.elementwise._div_operands); 27% of bfloat16 `trunc` quotients
# by a number differed before
_REDUCED_DIVISORS = {
    "tensor": lambda dt: (_divisor(torch.float64, (64, 48), seed=2) - 3.5).to(dt),
    "row": lambda dt: (_divisor(torch.float64, (48,), seed=3) - 3.5).to(dt),
    "one_element": lambda dt: torch.tensor([0.37], dtype=dt),
    "zero_d": lambda dt: torch.tensor(-0.37, dtype=dt),
    "float32_zero_d": lambda dt: torch.tensor(0.3701),
    "number": lambda dt: 0.37,
    "int_tensor": lambda dt: torch.randint(1, 400, (64, 48), generator=torch.Generator()
                                           .manual_seed(4)),
}


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
@pytest.mark.parametrize("divisor", sorted(_REDUCED_DIVISORS))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_reduced_precision_rounding_modes_match_cpu_bitwise(eager_mode, dtype, divisor, mode):
    a = _data(dtype) * 30
    b = _REDUCED_DIVISORS[divisor](dtype)
    bt = b.to(TPU) if isinstance(b, torch.Tensor) else b
    _same(a.to(TPU).div(bt, rounding_mode=mode), a.div(b, rounding_mode=mode))


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_reduced_precision_division_of_an_int_tensor_rounds_it_first(dtype):
    # CPU converts the int64 numerator to the result's dtype first (257 -> 256 in bfloat16)
    a = torch.randint(-3000, 3000, (300,), generator=torch.Generator().manual_seed(5))
    b = (torch.randn(300, generator=torch.Generator().manual_seed(6)) * 3).to(dtype)
    for mode in (None, "trunc", "floor"):
        _same(a.to(TPU).div(b.to(TPU), rounding_mode=mode), a.div(b, rounding_mode=mode))
    _same(777.7 // b.to(TPU), 777.7 // b)


@pytest.mark.parametrize("divisor", ["number", "float32_zero_d", "zero_d", "tensor", "int"])
@pytest.mark.parametrize("op", [torch.remainder, torch.fmod], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_reduced_precision_remainder_and_fmod_read_the_divisor_in_the_dtype(dtype, op,
                                                                            divisor):
    # CPU converts the divisor to the dtype first (3.7 -> 3.703125 in bfloat16): 43 to
    # 64 of 64 results differed by a number (helper-18)
    a = _data(dtype) * 30
    b = {"number": 3.7, "float32_zero_d": torch.tensor(3.7), "int": 5,
         "zero_d": torch.tensor(-0.37, dtype=dtype),
         "tensor": (_divisor(torch.float64, (64, 48), seed=7) - 3.5).to(dtype)}[divisor]
    bt = b.to(TPU) if isinstance(b, torch.Tensor) and b.dim() else b
    _same(op(a.to(TPU), bt), op(a, b))
