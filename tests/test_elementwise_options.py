"""Element-wise ops made of exactly rounded operations compile their executables with the
platform's element-wise XLA options (``eager.tiers.elementwise_options``; on CPU the
legacy loop emitters, about half the compile time): their results must be bit for bit
those of XLA's default options.  (Every op is compared: one without the options compares
the defaults with themselves, which keeps the sweep honest if the list grows.)

Default run: ``DEFAULT_OPS`` (arithmetic, division, selection and data-movement OpInfos,
and ``exp``), every sample, in float32, bfloat16 and float64 where the OpInfo supports them.
``TORCHTPU_FULL_TESTS=1``: every element-wise OpInfo of ``op_db`` (unary and binary
ufuncs and ``EXTRA_OPS``), every sample, in every dtype of ``FULL_DTYPES`` it supports.
"""

from __future__ import annotations


import _budget
import pytest
import torch
from torch.testing._internal.common_methods_invocations import (
    BinaryUfuncInfo,
    UnaryUfuncInfo,
    op_db,
)

from torchtpu._device import runtime
from torchtpu.eager import buckets, executables, tiers

pytestmark = [pytest.mark.usefixtures("strict_mode", "no_stored_executables")]

FULL = _budget.FULL

aten = torch.ops.aten

# ops whose executables get the options (``tiers._ELEMENTWISE_NAMES``), and ``exp``, one of
# the transcendental functions that keep the defaults (checked here that they do; the
# others of that kind run with TORCHTPU_FULL_TESTS=1: each compares the defaults with
# themselves, and together they took half of this file's time in CI's budget)
# (the default run takes one op of each kind: a transcendental, a rounding division, a
# selection, a concatenation; CI's time budget)
DEFAULT_OPS = ["exp", "div.floor_rounding", "where", "cat"]
EXTRA_OPS = ["where", "cat", "clone", "masked_fill", "nn.functional.pad.constant",
             "nn.functional.silu", "nn.functional.gelu", "nn.functional.mish",
             "nn.functional.softplus", "nn.functional.hardswish", "lerp", "addcmul",
             "addcdiv", "clamp", "nan_to_num", "full_like", "zeros_like", "ones_like"]
DEFAULT_DTYPES = (torch.float32, torch.bfloat16, torch.float64)
FULL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64,
               torch.complex64, torch.int32, torch.int64, torch.bool)


def _name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _ops():
    names = set(EXTRA_OPS if FULL else DEFAULT_OPS)
    out = []
    for op in op_db:
        elementwise = isinstance(op, (UnaryUfuncInfo, BinaryUfuncInfo))
        if _name(op) in names or (FULL and elementwise):
            out.append(op)
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` as raw integers (NaNs with the same payload compare equal, -0.0 != 0.0)."""
    t = t.detach().cpu().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype.is_floating_point:
        t = t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def _run(op, samples):
    res = []
    for s in samples:
        x = s.input.to("tpu") if isinstance(s.input, torch.Tensor) else [
            t.to("tpu") for t in s.input]
        args = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in s.args]
        kwargs = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v
                  for k, v in s.kwargs.items()}
        try:
            r = op(x, *args, **kwargs)
        except Exception as e:  # the same error either way is checked below
            res.append(("raises", type(e).__name__))
            continue
        outs = r if isinstance(r, (tuple, list)) else (r,)
        res.append([_bits(o) if isinstance(o, torch.Tensor) else o for o in outs])
    return res


@pytest.fixture
def fresh_executables():
    """Shape buckets off (a bucket's executable would serve both runs) and an empty
    per-op executable cache before and after."""
    buckets.set_policy(enabled=False)
    executables.clear_cache()
    yield
    executables.clear_cache()
    tiers.set_elementwise_options(tiers._elementwise_default)
    buckets.set_policy(buckets.DEFAULT_ON, buckets.DEFAULT_AFTER, buckets.DEFAULT_RECUR)


def test_elementwise_ops_get_the_options_and_others_do_not():
    tiers.set_elementwise_options(True)
    try:
        want = tiers._ELEMENTWISE_OPTIONS.get(runtime.platform())
        for op in (aten.mul.Tensor, aten.add.Tensor, aten.div.Tensor, aten.clone.default,
                   aten.cat.default, aten._to_copy.default, aten.where.self):
            assert tiers.elementwise_options(op) == want, op
        # transcendental functions (the emitters' approximations differ), reductions,
        # dots, random ops keep the platform's defaults
        for op in (aten.sin.default, aten.tan.default, aten.pow.Tensor_Scalar,
                   aten.mm.default, aten.sum.dim_IntList, aten._log_softmax.default,
                   aten.bernoulli.p, aten.uniform_.default, "not an op", None):
            assert tiers.elementwise_options(op) is None, op
        tiers.set_elementwise_options(False)
        assert tiers.elementwise_options(aten.mul.Tensor) is None
    finally:
        tiers.set_elementwise_options(tiers._elementwise_default)


@pytest.mark.parametrize("op", _ops(), ids=_name)
def test_results_are_bitwise_those_of_default_options(op, fresh_executables):
    dtypes = [d for d in (FULL_DTYPES if FULL else DEFAULT_DTYPES)
              if d in op.supported_dtypes("cpu")]
    if not dtypes:
        pytest.skip("no dtype of this test")
    compared = 0
    for dtype in dtypes:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))
        results = []
        for on in (True, False):
            tiers.set_elementwise_options(on)
            executables.clear_cache()
            results.append(_run(op, samples))
        for i, (a, b) in enumerate(zip(*results)):
            assert type(a) is type(b), (dtype, i, a, b)
            if isinstance(a, tuple):
                assert a == b, (dtype, i)
                continue
            for x, y in zip(a, b):
                if isinstance(x, torch.Tensor):
                    assert torch.equal(x, y), (
                        f"{_name(op)} {dtype} sample {i}: element-wise options changed "
                        f"{int((x != y).sum())} of {x.numel()} values")
                    compared += 1
    if not compared:
        pytest.skip("every sample raised")


def test_bfloat16_nan_payloads_survive_copies_as_on_cpu():
    # the legacy emitters canonicalize bfloat16 NaN payloads in copies and selects: such
    # programs keep the default options (found by a helper's break attempt)
    bits = torch.tensor([-126, 0, -126, 0, 0x7F82, 0, -1, 0], dtype=torch.int16)
    x = bits.view(torch.bfloat16)
    t = x.to("tpu")
    assert torch.equal(t[::2].clone().cpu().view(torch.int16), x[::2].clone().view(torch.int16))
    got = torch.where(t == t, t, t).cpu().view(torch.int16)
    assert torch.equal(got, torch.where(x == x, x, x).view(torch.int16))
