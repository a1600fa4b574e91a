"""Where PyTorch's CPU kernels raise, tpu raises too (same exception type), never returns
a value; valid neighbours of each case still match CPU's values.

Each case is a function of the device.  Host-known errors (dtypes, memory overlap, a
negative integer exponent) raise at the call; value-dependent ones (a class index out of
range, a probability outside [0, 1], an integer division by zero) are device-side checks
(``torchtpu.ops._checks``, as CUDA's device asserts) that raise at the next sync point at
the latest: here ``.cpu()`` of the result, before any value reaches the user.  Every case
runs in each eager mode (DEFER_AND_FUSE records ops and runs them later: the error must
still arrive, not a wrong value).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchtpu  # noqa: F401


def _ar(dev, n=6, dtype=torch.float32):
    return torch.arange(n, dtype=dtype, device=dev)


def _i(dev, *v):
    return torch.tensor(v, device=dev)


# ------------------------------------------------------------------ memory overlap


def copy_partial(d):
    x = _ar(d)
    x[1:].copy_(x[:-1])
    return x


def setitem_partial(d):
    x = _ar(d)
    x[1:4] = x[0:3]
    return x


def index_put_partial(d):
    x = _ar(d)
    x[_i(d, 1, 2, 3)] = x[0:3]
    return x


def index_put_full(d):
    x = _ar(d, 4)
    x[_i(d, 0, 1, 2, 3)] = x
    return x


def add_out_partial(d):
    a = _ar(d)
    torch.add(a[:4], a[:4], out=a[1:5])
    return a


def neg_out_partial(d):
    x = _ar(d)
    torch.neg(x[:-1], out=x[1:])
    return x


def transposed_copy(d):
    x = _ar(d, 4).view(2, 2)
    x.t().copy_(x)
    return x


def out_expanded(d):
    out = torch.zeros(4, device=d).expand(3, 4)
    torch.add(torch.ones(3, 4, device=d), 1, out=out)
    return out


def copy_to_expanded(d):
    return torch.zeros(4, device=d).expand(3, 4).copy_(torch.ones(3, 4, device=d))


def cat_out_partial(d):
    x = _ar(d)
    torch.cat([x[:2], x[2:4]], out=x[1:5])
    return x


# ------------------------------------------------------------------ integer arithmetic


def int_pow_neg(d):
    return _i(d, 2, 3) ** -1


def bool_pow_neg(d):
    return torch.tensor([True], device=d) ** -2


def uint8_pow_neg(d):
    return torch.tensor([2], dtype=torch.uint8, device=d).pow(-1)


def div_trunc_zero(d):
    return torch.div(_i(d, 3, -4, 5), _i(d, 1, 0, 2), rounding_mode="trunc")


def div_floor_zero(d):
    return torch.div(_i(d, 3, -4, 5), _i(d, 1, 0, 2), rounding_mode="floor")


def floordiv_scalar_zero(d):
    return _i(d, 3, -4) // 0


def remainder_zero(d):
    return torch.remainder(_i(d, 3, -4, 5), _i(d, 1, 0, 2))


def mod_scalar_zero(d):
    return _i(d, 3, -4) % 0


def fmod_zero(d):
    return torch.fmod(_i(d, 3, -4, 5), _i(d, 1, 0, 2))


def int_div_inplace_zero(d):
    return _i(d, 3, -4).div_(0, rounding_mode="trunc")


def bool_alpha_float(d):
    return torch.add(_ar(d), _ar(d), alpha=True)


def bool_alpha_int(d):
    return torch.add(_i(d, 1, 2), _i(d, 1, 2), alpha=True)


def sub_bool(d):
    return torch.sub(torch.tensor([True, False], device=d), _i(d, 1, 2))


def addcmul_bool(d):
    b = torch.tensor([True, False], device=d)
    return torch.addcmul(b, b, b)


def div_trunc_bool(d):
    b = torch.tensor([True, False], device=d)
    return torch.div(b, b, rounding_mode="trunc")


# ------------------------------------------------------------------ losses


def ce_target_high(d):
    return F.cross_entropy(torch.randn(3, 4).to(d), _i(d, 0, 4, 1))


def ce_target_negative(d):
    return F.cross_entropy(torch.randn(3, 4).to(d), _i(d, 0, -5, 1))


def nll_target_high(d):
    return F.nll_loss(torch.randn(3, 4).to(d), _i(d, 0, 7, 1), reduction="none")


def nll2d_target_high(d):
    return F.nll_loss(torch.randn(2, 4, 3).to(d), torch.tensor([[0, 4, 1], [0, 0, 0]]).to(d))


def bce_above_one(d):
    return F.binary_cross_entropy(torch.tensor([0.5, 1.5]).to(d), torch.tensor([0., 1.]).to(d))


def bce_negative(d):
    return F.binary_cross_entropy(torch.tensor([-0.5, 0.5]).to(d), torch.tensor([0., 1.]).to(d))


def bce_nan(d):
    return F.binary_cross_entropy(torch.tensor([float("nan"), 0.5]).to(d),
                                  torch.tensor([0., 1.]).to(d))


# ------------------------------------------------------------------ softmax


def softmax_int(d):
    return torch.softmax(_i(d, 1, 2), 0)


def log_softmax_int_dim0(d):
    return torch.log_softmax(_i(d, 1, 2, 3, 4).view(2, 2), 0)


def softmax_bool(d):
    return F.softmax(torch.tensor([True, False], device=d), -1)


# ------------------------------------------------------------------ random


def multinomial_negative(d):
    return torch.multinomial(torch.tensor([0.5, -0.1]).to(d), 1)


def multinomial_nan(d):
    return torch.multinomial(torch.tensor([0.5, float("nan")]).to(d), 1)


def multinomial_inf(d):
    return torch.multinomial(torch.tensor([0.5, float("inf")]).to(d), 1, True)


def multinomial_zero_row(d):
    return torch.multinomial(torch.tensor([[0., 0.], [1., 1.]]).to(d), 1)


def bernoulli_above_one(d):
    return torch.bernoulli(torch.tensor([0.5, 1.5]).to(d))


def bernoulli_negative(d):
    return torch.bernoulli(torch.tensor([0.5, -0.5]).to(d))


def bernoulli_nan(d):
    return torch.bernoulli(torch.tensor([0.5, float("nan")]).to(d))


def bernoulli_tensor_p(d):
    return torch.zeros(2, device=d).bernoulli_(torch.tensor([0.5, 2.0]).to(d))


# ------------------------------------------------------------------ matrix products


def _f(d, *s, dtype=torch.float32):
    return torch.ones(*s, dtype=dtype, device=d)


def mm_f32_f64(d):
    return torch.mm(_f(d, 2, 2), _f(d, 2, 2, dtype=torch.float64))


def matmul_f32_f64(d):
    return _f(d, 2, 2) @ _f(d, 2, 2, dtype=torch.float64)


def matmul_batched_mixed(d):
    return _f(d, 2, 2, 2) @ _f(d, 2, 2, dtype=torch.float64)


def mv_mixed(d):
    return torch.mv(_f(d, 2, 2), _f(d, 2, dtype=torch.float64))


def addmm_mixed(d):
    return torch.addmm(_f(d, 2, 2), _f(d, 2, 2), _f(d, 2, 2, dtype=torch.float64))


def addmm_self_mixed(d):
    return torch.addmm(_f(d, 2, 2, dtype=torch.float64), _f(d, 2, 2), _f(d, 2, 2))


def linear_mixed(d):
    return F.linear(_f(d, 2, 2), _f(d, 2, 2, dtype=torch.float64))


def linear_bias_mixed(d):
    return F.linear(_f(d, 2, 2), _f(d, 2, 2), _f(d, 2, dtype=torch.float64))


def mm_bool(d):
    return torch.mm(_f(d, 2, 2, dtype=torch.bool), _f(d, 2, 2, dtype=torch.bool))


def mm_int64_int32(d):
    return torch.mm(_f(d, 2, 2, dtype=torch.int64), _f(d, 2, 2, dtype=torch.int32))


def gcd_uint16(d):
    return torch.gcd(torch.tensor([4, 6], dtype=torch.uint16, device=d),
                     torch.tensor([2, 4], dtype=torch.uint16, device=d))


def lcm_float(d):
    return torch.lcm(_ar(d), _ar(d))


def conv_transpose2d_output_padding(d):
    return F.conv_transpose2d(torch.ones(1, 1, 3, 3, device=d), torch.ones(1, 1, 2, 2, device=d),
                              stride=2, output_padding=(1, 2))


def conv_transpose1d_output_padding(d):
    return F.conv_transpose1d(torch.ones(1, 1, 3, device=d), torch.ones(1, 1, 2, device=d),
                              output_padding=1)


def conv_transpose3d_output_padding(d):
    return F.conv_transpose3d(torch.ones(1, 1, 3, 3, 3, device=d),
                              torch.ones(1, 1, 2, 2, 2, device=d), output_padding=1)


def uniform_int(d):
    return torch.zeros(3, dtype=torch.int64, device=d).uniform_()


def rand_like_bool(d):
    return torch.rand_like(torch.zeros(3, dtype=torch.bool, device=d))


def bernoulli_int(d):
    return torch.bernoulli(torch.zeros(3, dtype=torch.int64, device=d))


def bernoulli_complex(d):
    return torch.bernoulli(torch.zeros(3, dtype=torch.complex64, device=d))


RAISING = [
    copy_partial, setitem_partial, index_put_partial, index_put_full, add_out_partial,
    neg_out_partial, transposed_copy, out_expanded, copy_to_expanded, cat_out_partial,
    int_pow_neg, bool_pow_neg, uint8_pow_neg, div_trunc_zero, div_floor_zero,
    floordiv_scalar_zero, remainder_zero, mod_scalar_zero, fmod_zero, int_div_inplace_zero,
    bool_alpha_float, bool_alpha_int, sub_bool, addcmul_bool, div_trunc_bool,
    ce_target_high, ce_target_negative, nll_target_high, nll2d_target_high, bce_above_one,
    bce_negative, bce_nan, softmax_int, log_softmax_int_dim0, softmax_bool,
    multinomial_negative, multinomial_nan, multinomial_inf, multinomial_zero_row,
    bernoulli_above_one, bernoulli_negative, bernoulli_nan, bernoulli_tensor_p,
    mm_f32_f64, matmul_f32_f64, matmul_batched_mixed, mv_mixed, addmm_mixed,
    addmm_self_mixed, linear_mixed, linear_bias_mixed, mm_bool, mm_int64_int32,
    gcd_uint16, lcm_float, conv_transpose2d_output_padding, conv_transpose1d_output_padding,
    conv_transpose3d_output_padding, uniform_int, rand_like_bool, bernoulli_int,
    bernoulli_complex,
]


def arange_complex(d):  # CPU has no complex arange kernel (tpu returned zeros)
    return torch.arange(0.0, 2.5, 0.5, dtype=torch.complex64, device=d)


def arange_complex_int(d):
    return torch.arange(5, dtype=torch.complex128, device=d)


def arange_complex_bound(d):  # a complex bound does not convert to double
    return torch.arange(0, 3, 1j, device=d)


RAISING += [arange_complex, arange_complex_int, arange_complex_bound]


def arange_float_step(d):
    return torch.arange(0.0, 2.5, 0.5, dtype=torch.float64, device=d)


def _cpu_error(case):
    try:
        case("cpu")
    except Exception as e:  # noqa: BLE001 - the type is what we compare
        return e
    raise AssertionError(f"{case.__name__}: CPU does not raise; the case is wrong")


@pytest.mark.parametrize("case", RAISING, ids=lambda c: c.__name__)
def test_raises_like_cpu(case, eager_mode):
    """tpu raises CPU's exception type, at the call or at the latest when the value is
    read (``.cpu()``), never handing back a value."""
    err = _cpu_error(case)
    with pytest.raises(type(err)) as info:
        case("tpu").cpu()
    if "detected on the device" not in str(info.value):
        # host-known errors: CPU's own message
        assert str(info.value).split(" (")[0][:40] == str(err).split(" (")[0][:40], \
            (str(info.value), str(err))
    # the device is usable afterwards (no stale failure left for the next sync)
    assert torch.ones(2, device="tpu").sum().item() == 2.0


def test_device_side_error_names_the_op(eager_mode):
    with pytest.raises(IndexError, match="nll_loss"):
        ce_target_high("tpu").cpu()


def test_device_side_error_arrives_before_a_later_value(eager_mode):
    """A failed check surfaces at the next host read even of another tensor (DEBUG
    mode: already at the op)."""
    with pytest.raises(IndexError):
        loss = ce_target_high("tpu")
        other = torch.ones(3, device="tpu") * 2
        other.cpu()
    assert (torch.ones(3, device="tpu") * 2).cpu().tolist() == [2.0, 2.0, 2.0]


# ------------------------------------------------------------------ valid neighbours


def copy_full_overlap(d):
    x = _ar(d)
    x.copy_(x)
    return x


def copy_disjoint_same_storage(d):
    x = _ar(d)
    x[:3].copy_(x[3:])
    return x


def copy_strided_disjoint(d):
    x = _ar(d, 8)
    x[::2].copy_(x[1::2])
    return x


def add_out_full_overlap(d):
    a = _ar(d)
    torch.add(a[:4], 1, out=a[:4])
    return a


def setitem_from_clone(d):
    x = _ar(d)
    x[1:] = x[:-1].clone()
    return x


def setitem_row(d):
    x = _ar(d, 4).view(2, 2)
    x[0] = x[1]
    return x


def fill_expanded(d):
    return torch.zeros(4, device=d).expand(3, 4).fill_(1.5)


def int_pow_tensor_negative(d):
    return _i(d, 2, 1, -1, 0, 3) ** _i(d, -1, -1, -1, 2, -2)


def int_pow_positive(d):
    return _i(d, 2, -3) ** 3


def scalar_base_pow_negative(d):
    return torch.pow(2, _i(d, -1, 2))


def div_trunc_nonzero(d):
    return torch.div(_i(d, 7, -7, 5), _i(d, 2, 2, -3), rounding_mode="trunc")


def div_floor_nonzero(d):
    return torch.div(_i(d, 7, -7, 5), _i(d, 2, 2, -3), rounding_mode="floor")


def remainder_nonzero(d):
    return torch.remainder(_i(d, 7, -7, 5), _i(d, 2, 2, -3))


def int_true_div_by_zero(d):
    return torch.div(_i(d, 3, -4, 0), _i(d, 0, 0, 0))  # floats: inf/-inf/nan, no error


def ce_ignore_index(d):
    return F.cross_entropy(torch.arange(12.).view(3, 4).to(d), _i(d, 0, -100, 3))


def ce_ignore_index_custom(d):
    return F.nll_loss(torch.arange(12.).view(3, 4).to(d), _i(d, 0, 9, 3), ignore_index=9)


def ce_probabilities(d):
    return F.cross_entropy(torch.arange(12.).view(3, 4).to(d), torch.full((3, 4), 0.25).to(d))


def bce_valid(d):
    return F.binary_cross_entropy(torch.tensor([0., 0.25, 1.]).to(d), torch.tensor([0., 1., 1.]).to(d))


def softmax_int_with_dtype(d):
    return torch.softmax(_i(d, 1, 2), 0, dtype=torch.float32)


def bernoulli_certain(d):
    return torch.bernoulli(torch.tensor([0., 1., 1., 0.]).to(d))


def multinomial_certain(d):
    return torch.multinomial(torch.tensor([[0., 1.], [2., 0.]]).to(d), 1)


def mm_int64(d):
    return torch.mm(_ar(d, 4, torch.int64).view(2, 2), _ar(d, 4, torch.int64).view(2, 2))


def mm_int8(d):
    return torch.mm(_ar(d, 4, torch.int8).view(2, 2), _ar(d, 4, torch.int8).view(2, 2))


def addmm_same_dtype(d):
    return torch.addmm(_f(d, 2, 2), _ar(d, 4).view(2, 2), _ar(d, 4).view(2, 2))


def rsub_alpha(d):
    return torch.rsub(_ar(d, 3), _ar(d, 3) * 10, alpha=2)


def rsub_scalar_alpha(d):
    return torch.rsub(_ar(d, 3), 2.0, alpha=3)


def add_bool_alpha_bool(d):
    b = torch.tensor([True, False], device=d)
    return torch.add(b, b, alpha=True)


def add_out_wider_dtype(d):
    """out= of another dtype than the result: CPU casts the result into it."""
    b = torch.tensor([0.5, 1.5, 2.5], dtype=torch.bfloat16, device=d)
    return torch.add(_i(d, 1, 2, 3), b, out=torch.empty(0, device=d))


def add_out_narrower_dtype(d):
    x = torch.tensor([1.001, 2.5, -3.25], device=d)
    return torch.add(x, x, out=torch.empty(3, dtype=torch.bfloat16, device=d))


def gcd_uint8(d):
    return torch.gcd(torch.tensor([4, 6], dtype=torch.uint8, device=d),
                     torch.tensor([2, 4], dtype=torch.uint8, device=d))


def conv_transpose2d_output_padding_below_dilation(d):
    """output_padding >= stride is allowed while it is below the dilation."""
    return F.conv_transpose2d(torch.ones(1, 1, 3, 3, device=d), torch.ones(1, 1, 2, 2, device=d),
                              stride=1, dilation=2, output_padding=1)


def rrelu_eval(d):
    return F.rrelu(torch.linspace(-2, 2, 9, device=d), 0.1, 0.3, training=False)


VALID = [
    gcd_uint8, conv_transpose2d_output_padding_below_dilation, rrelu_eval,
    add_out_wider_dtype, add_out_narrower_dtype,
    copy_full_overlap, copy_disjoint_same_storage, copy_strided_disjoint,
    add_out_full_overlap, setitem_from_clone, setitem_row, fill_expanded,
    int_pow_tensor_negative, int_pow_positive, scalar_base_pow_negative, div_trunc_nonzero,
    div_floor_nonzero, remainder_nonzero, int_true_div_by_zero, ce_ignore_index,
    ce_ignore_index_custom, ce_probabilities, bce_valid, softmax_int_with_dtype,
    bernoulli_certain, multinomial_certain, mm_int64, mm_int8, addmm_same_dtype, rsub_alpha,
    rsub_scalar_alpha, add_bool_alpha_bool, arange_float_step,
]


@pytest.mark.parametrize("case", VALID, ids=lambda c: c.__name__)
def test_valid_neighbours_match_cpu(case, eager_mode):
    expected = case("cpu")
    actual = case("tpu").cpu()
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, equal_nan=True)
