"""Property tests: the elementwise family's scalar keyword arguments on tpu equal CPU.

``alpha`` (add, sub, rsub: Tensor and Scalar overloads, functional / in-place / ``out=``),
``value`` (addcmul, addcdiv) and ``rounding_mode`` (div: None / 'trunc' / 'floor'), over
broadcasting shapes, dtypes (float32, int64, bool, bfloat16) and Python scalars (int,
float, bool; negative, zero).  Each generated call runs on CPU first: when CPU raises, tpu
must raise the same exception type (at the call, or for a device-side check such as an
integer division by zero, when the result is read); otherwise the values must match
(exact for integer and bool results, the dtype's ``assert_close`` tolerance for floats).

Shapes come from a small fixed set (each new shape compiles an executable), so the
properties stay fast: ~60 examples each, no deadline.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchtpu  # noqa: F401

aten = torch.ops.aten

SHAPE_PAIRS = [((3,), (3,)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((), (2, 3)), ((2, 3), ())]
DTYPES = st.sampled_from([torch.float32, torch.int64, torch.bool, torch.bfloat16])
SCALARS = st.one_of(st.integers(-3, 3), st.booleans(),
                    st.sampled_from([0.0, -0.0, 0.5, -1.5, 2.25]),
                    st.floats(-4, 4, allow_nan=False, allow_infinity=False, width=32))
SEEDS = st.integers(0, 2**16)
VARIANTS = st.sampled_from(["functional", "inplace", "out"])

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def _make(shape, dtype, seed):
    """A CPU tensor with small values of every sign (zeros included)."""
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


def _to(v, dev):
    return v.to(dev) if isinstance(v, torch.Tensor) else v


def _mag(v) -> float:
    """Largest finite magnitude of a tensor or number (float64)."""
    t = torch.as_tensor(v).double().abs()
    t = t[torch.isfinite(t)]
    return float(t.max()) if t.numel() else 0.0


def check_like_cpu(call, scale: float = 0.0):
    """``call(device)`` returns a tensor; tpu must give CPU's values or CPU's error type.

    ``scale``: magnitude of the largest intermediate (``|alpha * other|``...).  CPU's
    bfloat16/half kernels round some intermediates (the scalar loop) and not others (the
    vectorized ``fmadd``), float32 ones may fuse a multiply-add: one rounding of an
    intermediate (``eps * scale``) is allowed on top of the dtype's tolerance."""
    try:
        expected = call("cpu")
    except Exception as cpu_err:  # noqa: BLE001 - the type is what we compare
        with pytest.raises(type(cpu_err)):
            call("tpu").cpu()  # reading the value is the latest point a device check raises
        return
    actual = call("tpu").cpu()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if expected.dtype.is_floating_point or expected.dtype.is_complex:
        eps = torch.finfo(expected.dtype).eps
        atol = max(1e-5, 2 * eps * scale)
        rtol = 1.6e-2 if expected.dtype in (torch.bfloat16, torch.float16) else 1.3e-6
        torch.testing.assert_close(actual, expected, equal_nan=True, atol=atol, rtol=rtol)
    else:
        assert torch.equal(actual, expected), (actual, expected)


def _apply(variant, functional, inplace, out_fn, out_dtype):
    """The three forms of one call: ``functional(dev)``, ``inplace(dev)`` (None: no
    in-place form), ``out_fn(dev, out)``."""
    if variant == "inplace" and inplace is not None:
        return inplace
    if variant == "out":
        return lambda dev: out_fn(dev, torch.empty(0, dtype=out_dtype, device=dev))
    return functional


# ------------------------------------------------------------------------- alpha


@SETTINGS
@given(shapes=st.sampled_from(SHAPE_PAIRS), da=DTYPES, db=DTYPES, alpha=SCALARS,
       name=st.sampled_from(["add", "sub", "rsub"]), variant=VARIANTS, out_dtype=DTYPES,
       seed=SEEDS)
def test_alpha_tensor_overload(shapes, da, db, alpha, name, variant, out_dtype, seed):
    """``torch.add/sub/rsub(a, b, alpha=...)``, ``a.add_(b, alpha=...)``, ``out=``."""
    a0, b0 = _make(shapes[0], da, seed), _make(shapes[1], db, seed + 1)
    fn = getattr(torch, name)
    inplace = None if name == "rsub" else (
        lambda dev: getattr(_to(a0, dev).clone(), name + "_")(_to(b0, dev), alpha=alpha))
    out_op = aten.rsub.Tensor_out if name == "rsub" else getattr(aten, name).out
    check_like_cpu(_apply(
        variant,
        lambda dev: fn(_to(a0, dev), _to(b0, dev), alpha=alpha),
        inplace,
        lambda dev, out: out_op(_to(a0, dev), _to(b0, dev), alpha=alpha, out=out),
        out_dtype), _mag(a0) + _mag(b0) * (1 + abs(alpha)))


@SETTINGS
@given(shape=st.sampled_from([(3,), (2, 3), ()]), da=DTYPES, other=SCALARS, alpha=SCALARS,
       name=st.sampled_from(["add", "sub", "rsub"]), variant=VARIANTS, out_dtype=DTYPES,
       seed=SEEDS)
def test_alpha_scalar_overload(shape, da, other, alpha, name, variant, out_dtype, seed):
    """``aten.add/sub/rsub.Scalar(a, other, alpha)``, ``add_.Scalar``, ``.Scalar_out``."""
    a0 = _make(shape, da, seed)
    pkt = getattr(aten, name)
    inplace = None if name == "rsub" else (
        lambda dev: getattr(aten, name + "_").Scalar(_to(a0, dev).clone(), other, alpha))
    check_like_cpu(_apply(
        variant,
        lambda dev: pkt.Scalar(_to(a0, dev), other, alpha),
        inplace,
        lambda dev, out: pkt.Scalar_out(_to(a0, dev), other, alpha, out=out),
        out_dtype), _mag(a0) + abs(other) * (1 + abs(alpha)))


def test_rsub_alpha_scales_self():
    """``rsub(x, y, alpha) == y - alpha * x`` on CPU; tpu once computed ``alpha*y - x``."""
    x, y = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 20.0, 30.0])
    expected = torch.rsub(x, y, alpha=2)
    torch.testing.assert_close(torch.rsub(x.to("tpu"), y.to("tpu"), alpha=2).cpu(), expected)
    expected = torch.rsub(x, 2.0, alpha=3)
    torch.testing.assert_close(torch.rsub(x.to("tpu"), 2.0, alpha=3).cpu(), expected)


# ------------------------------------------------------------------------- value


@SETTINGS
@given(shapes=st.sampled_from(SHAPE_PAIRS), ds=DTYPES, dt=DTYPES, value=SCALARS,
       name=st.sampled_from(["addcmul", "addcdiv"]), variant=VARIANTS, out_dtype=DTYPES,
       seed=SEEDS)
def test_value(shapes, ds, dt, value, name, variant, out_dtype, seed):
    """``torch.addcmul/addcdiv(self, t1, t2, value=...)``, in-place and ``out=``."""
    s0 = _make(shapes[0], ds, seed)
    t1, t2 = _make(shapes[1], dt, seed + 1), _make(shapes[1], dt, seed + 2)
    fn = getattr(torch, name)
    check_like_cpu(_apply(
        variant,
        lambda dev: fn(_to(s0, dev), _to(t1, dev), _to(t2, dev), value=value),
        lambda dev: getattr(_to(s0, dev).clone(), name + "_")(_to(t1, dev), _to(t2, dev),
                                                                value=value),
        lambda dev, out: fn(_to(s0, dev), _to(t1, dev), _to(t2, dev), value=value, out=out),
        out_dtype), _mag(s0) + (1 + abs(value)) * (
            _mag(t1.double() * t2.double()) if name == "addcmul" else
            _mag(t1.double() / t2.double()) + _mag(t1)))


# ------------------------------------------------------------------------- rounding_mode


@SETTINGS
@given(shapes=st.sampled_from(SHAPE_PAIRS), da=DTYPES, db=DTYPES, scalar=SCALARS,
       scalar_divisor=st.booleans(), mode=st.sampled_from([None, "trunc", "floor"]),
       variant=VARIANTS, out_dtype=DTYPES, seed=SEEDS)
def test_rounding_mode(shapes, da, db, scalar, scalar_divisor, mode, variant, out_dtype, seed):
    """``torch.div(a, b, rounding_mode=...)`` with a tensor or Python-number divisor (zero
    included: integer division by zero raises on CPU), in-place and ``out=``."""
    a0 = _make(shapes[0], da, seed)
    b0 = scalar if scalar_divisor else _make(shapes[1], db, seed + 1)
    check_like_cpu(_apply(
        variant,
        lambda dev: torch.div(_to(a0, dev), _to(b0, dev), rounding_mode=mode),
        lambda dev: _to(a0, dev).clone().div_(_to(b0, dev), rounding_mode=mode),
        lambda dev, out: torch.div(_to(a0, dev), _to(b0, dev), rounding_mode=mode, out=out),
        out_dtype))
