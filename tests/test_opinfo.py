"""OpInfo conformance (forward, float32): tpu results must equal PyTorch's CPU results.

Default run: the first ``SAMPLES_PER_OP`` samples of each OpInfo in ``DEFAULT_OPS`` (a
fixed list of common ops: elementwise, reductions, matmul, indexing, shape, factories,
nn.functional basics), plus the first sample passing each keyword argument those miss
(``add``'s ``alpha=`` samples come last; see ``opinfo.limited_indices``).  Each new op
signature costs an XLA compile, so this subset keeps the suite fast.

``TORCHTPU_FULL_OPINFO=1``: every OpInfo of ``op_db`` that supports float32 on CPU, all
samples (``TORCHTPU_OPINFO_SAMPLES=N`` caps the samples in either mode).  For a report
instead of a pass/fail run, use the sweep: ``python -m torchtpu.conformance.opinfo``.

Comparison rules (tolerances, random ops, what counts as a mismatch) are those of
:mod:`torchtpu.conformance.opinfo`.  A sample on which CPU itself raises is skipped.

``test_opinfo_float32_compiled``: ``COMPILED_OPS`` (a cross-section of the subset), each
sample compiled as a one-op function with ``torch.compile(backend="tpu")`` (the sweep's
``--mode compile``); ``test_opinfo_backward_float32_compiled``: gradients of
``COMPILED_BACKWARD_OPS`` through the compiled function.

``XFAIL`` lists ops the backend does not support yet (tpu raises); they are
``xfail(strict=False, raises=BackendFailure)``, so a *wrong result*
(:class:`ValueMismatch`) still fails the test.  Remove entries as lowerings land
(an XPASS in the report means an entry is stale).
"""

from __future__ import annotations

import os

import _budget
import pytest
import torch

from torchtpu.conformance.opinfo import (
    BackendFailure,
    ValueMismatch,
    check_op,
    op_id,
    select_opinfos,
)

FULL = os.environ.get("TORCHTPU_FULL_OPINFO", "") == "1"
_env_samples = os.environ.get("TORCHTPU_OPINFO_SAMPLES")
# one sample per op by default (plus the first sample passing each keyword argument it
# misses: ``opinfo.limited_indices``); CI's time budget, see tests/_budget.py
SAMPLES_PER_OP = int(_env_samples) if _env_samples else (None if FULL else 1)

DTYPE = torch.float32

# OpInfo ids (``name`` or ``name.variant_test_name``) of the default subset.
DEFAULT_OPS = [
    # unary elementwise
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh",
    "exp", "exp2", "expm1", "floor", "frac", "log", "log10", "log1p", "log2", "neg",
    "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sgn", "sin", "sinh", "sqrt",
    "square", "tan", "tanh", "trunc", "erf", "erfc", "erfinv", "lgamma", "nan_to_num",
    "isnan", "isinf", "isfinite", "logical_not", "signbit", "deg2rad", "rad2deg",
    "positive",
    # binary / ternary elementwise
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding",
    "div.trunc_rounding", "true_divide", "pow", "float_power", "atan2", "fmod",
    "remainder", "maximum", "minimum", "max.binary", "min.binary", "fmax", "fmin", "eq",
    "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "hypot",
    "lerp", "xlogy", "copysign", "floor_divide", "rsub", "clamp", "clamp_min",
    "clamp_max", "where", "addcmul", "addcdiv", "logaddexp", "isclose",
    # reductions / scans
    "sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "max.reduction_with_dim",
    "max.reduction_no_dim", "min.reduction_with_dim", "min.reduction_no_dim", "var",
    "std", "var_mean", "std_mean", "logsumexp", "all", "any", "cumsum", "cumprod",
    "norm", "linalg.vector_norm", "count_nonzero", "nansum",
    # matmul family
    "matmul", "mm", "bmm", "addmm", "mv", "dot", "outer", "einsum", "baddbmm", "addmv",
    "tensordot",
    # indexing
    "gather", "scatter", "scatter_add", "index_select", "index_add", "index_copy",
    "index_fill", "index_put", "__getitem__", "masked_fill", "take_along_dim", "select",
    "narrow", "nonzero", "masked_select",
    # shape / layout
    "reshape", "view", "flatten", "unflatten", "permute", "transpose", "t", "squeeze",
    "unsqueeze", "expand", "expand_as", "cat", "stack", "split", "chunk", "unbind",
    "flip", "roll", "repeat", "tile", "tril", "triu", "diagonal", "diag_embed",
    "movedim", "contiguous", "clone", "hstack", "vstack", "repeat_interleave",
    # sorting
    "sort", "argsort", "topk",
    # factories / conversions
    "zeros_like", "ones_like", "full_like", "arange", "linspace", "eye", "new_zeros",
    "new_full", "zeros", "ones", "full", "to", "double", "long", "bool",
    # nn.functional basics
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.elu", "nn.functional.leaky_relu", "nn.functional.hardtanh",
    "nn.functional.hardsigmoid", "nn.functional.hardswish", "nn.functional.softplus",
    "nn.functional.mish", "nn.functional.logsigmoid", "softmax", "log_softmax",
    "nn.functional.softmin", "nn.functional.linear", "nn.functional.layer_norm",
    "nn.functional.group_norm", "nn.functional.batch_norm", "nn.functional.embedding",
    "nn.functional.dropout", "nn.functional.conv1d", "nn.functional.conv2d",
    "nn.functional.max_pool2d", "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool2d", "nn.functional.pad.constant",
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.l1_loss", "nn.functional.smooth_l1_loss",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.one_hot",
    "nn.functional.normalize", "nn.functional.cosine_similarity",
    "nn.functional.scaled_dot_product_attention", "nn.functional.interpolate.nearest",
    "nn.functional.interpolate.bilinear", "nn.functional.glu",
]

# Ops the backend does not support yet, from a real run (see the module docstring).
# Only "tpu raised" failures are expected here; wrong values are never listed.
# Regenerate: run this file (or the sweep on DEFAULT_OPS) and list what tpu cannot run.
XFAIL: dict[str, str] = {}


def _cases():
    if FULL:
        ops = select_opinfos()
    else:
        by_id = {op_id(op): op for op in select_opinfos()}
        missing = [n for n in DEFAULT_OPS if n not in by_id]
        assert not missing, f"DEFAULT_OPS names no OpInfo: {missing}"
        ops = [by_id[n] for n in DEFAULT_OPS]
    for op in ops:
        if DTYPE not in op.supported_dtypes("cpu"):
            continue
        oid = op_id(op)
        marks = []
        if oid in XFAIL:
            marks.append(pytest.mark.xfail(reason=XFAIL[oid], raises=BackendFailure,
                                           strict=False))
        yield pytest.param(op, id=oid, marks=marks)


@pytest.fixture(scope="module", autouse=True)
def _no_cpu_fallback():
    """Measure the backend itself: the opt-in CPU fallback is off during this module."""
    from torchtpu._device import tpu_module

    saved = tpu_module.enable_cpu_fallback
    tpu_module.enable_cpu_fallback = False
    yield
    tpu_module.enable_cpu_fallback = saved


def _mode_cases():
    """Each case in STRICT; in DEFER_AND_FUSE (the same lowerings, fused) every sixth op by
    default (CI's time budget; tests/test_eager_modes.py and the mode-parametrized tests
    run that mode too), every op in STRICT, DEBUG and DEFER_AND_FUSE with
    ``TORCHTPU_FULL_OPINFO=1`` or ``TORCHTPU_FULL_TESTS=1``."""
    full = FULL or _budget.FULL
    modes = ["strict", "debug", "defer_and_fuse"] if full else ["strict", "defer_and_fuse"]
    for i, case in enumerate(_cases()):
        for mode in modes:
            if mode != "strict" and not (full or i % 6 == 0):
                continue
            yield pytest.param(case.values[0], mode, id=f"{case.id}-{mode}",
                               marks=case.marks)


@pytest.mark.parametrize("op,mode", list(_mode_cases()))
def test_opinfo_float32(op, mode):
    """Each OpInfo's samples in eager mode ``mode``."""
    with torch.tpu.set_eager_mode(mode):
        (pair,) = check_op(op, [DTYPE], SAMPLES_PER_OP)
    oid = op_id(op)
    _assert_pair_passes(pair, oid, "tpu")


def _assert_pair_passes(pair, oid, what):
    """Raise ValueMismatch / BackendFailure naming the failing samples, or skip when CPU
    ran none; ``what`` names the tpu side in the message ("tpu", "compiled tpu")."""

    def lines(status):
        return "\n".join(f"  sample {r['index']} [{r['sample']}]: {r['detail']}"
                         for r in pair.samples if r["status"] in status)

    if pair.status == "mismatch":
        raise ValueMismatch(f"{oid}: {what} result differs from CPU\n{lines(('mismatch',))}")
    if pair.status in ("error", "unsupported"):
        raise BackendFailure(
            f"{oid}: {what} raised where CPU did not\n{lines(('error', 'unsupported'))}")
    if pair.status == "skipped":
        pytest.skip(f"no sample CPU could run: {pair.detail}")
    assert pair.status == "pass", pair


# ``--mode compile`` in the test suite: each sample of these OpInfos as a one-op function
# compiled with torch.compile(backend="tpu", fullgraph=True, dynamic=False), forward, vs
# CPU eager (``opinfo.compiled_call``).  A cross-section of DEFAULT_OPS (elementwise,
# reductions, scans, matmul, indexing, views, sorting, factories, nn.functional, a random
# op) sized to add about a minute to the suite; TORCHTPU_FULL_OPINFO=1 compiles every
# DEFAULT_OPS/op_db case instead.
COMPILED_OPS = [
    "exp", "add", "mul", "div.no_rounding_mode", "pow", "clamp", "sum", "mean", "amax",
    "argmax", "cumsum", "logsumexp", "matmul", "addmm", "gather", "index_select",
    "index_put", "__getitem__", "masked_fill", "cat", "permute", "expand", "sort", "topk",
    "softmax", "nn.functional.linear", "nn.functional.layer_norm", "nn.functional.gelu",
    "nn.functional.dropout", "arange",
]
# What one static-shape XLA executable cannot compute (torchtpu raises
# NotImplementedError naming the op inside a compiled graph; eager runs them).
COMPILED_XFAIL = {
    oid: "data-dependent output shape in a compiled graph"
    for oid in ("nonzero", "masked_select", "repeat_interleave", "narrow")
}


def _compiled_cases():
    if FULL:
        cases = list(_cases())
    else:
        by_id = {op_id(op): op for op in select_opinfos()}
        # every other op of the cross-section by default (CI's time budget)
        cases = [pytest.param(by_id[n], id=n) for n in _budget.every(COMPILED_OPS, 2)]
    for c in cases:
        (op,) = c.values
        oid = op_id(op)
        marks = list(c.marks)
        if oid in COMPILED_XFAIL:
            marks.append(pytest.mark.xfail(reason=COMPILED_XFAIL[oid], raises=BackendFailure,
                                           strict=False))
        yield pytest.param(op, id=oid, marks=marks)


@pytest.mark.parametrize("op", list(_compiled_cases()))
def test_opinfo_float32_compiled(op):
    """Each OpInfo's samples compiled one op at a time with the ``tpu`` backend."""
    import torchtpu

    torchtpu.reset_metrics()
    (pair,) = check_op(op, [DTYPE], SAMPLES_PER_OP, compiled=True)
    oid = op_id(op)
    _assert_pair_passes(pair, oid, "compiled tpu")
    # the samples really went through the backend (not Dynamo's eager fallback)
    assert torchtpu.metrics()["compile"]["graphs_compiled"] > 0


# Gradients through the compiled function's autograd (AOTAutograd's backward graph).
COMPILED_BACKWARD_OPS = ["mul", "sum", "matmul", "softmax", "nn.functional.layer_norm",
                         "index_select", "cumsum", "unbind", "nn.functional.gelu", "var"]


@pytest.mark.parametrize("name", COMPILED_BACKWARD_OPS)
def test_opinfo_backward_float32_compiled(name):
    """Gradients of the one-op function compiled with the ``tpu`` backend vs CPU eager."""
    from torchtpu.conformance.opinfo import check_op_backward, get_opinfo

    pair = check_op_backward(get_opinfo(name), DTYPE, SAMPLES_PER_OP, compiled=True)
    assert pair is not None and pair.status == "pass", (pair.status, pair.detail)


BACKWARD_OPS = ["add", "mul", "exp", "sum", "matmul", "softmax", "nn.functional.conv2d",
                "nn.functional.layer_norm", "index_select", "gather", "cumsum",
                "nn.functional.embedding", "nn.functional.gelu", "var"]


@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_opinfo_backward_float32(name):
    """Gradients vs CPU for a few common ops (the full set: ``--backward`` in the sweep)."""
    from torchtpu.conformance.opinfo import check_op_backward

    (op,) = [o for o in select_opinfos() if op_id(o) == name]
    pair = check_op_backward(op, DTYPE, SAMPLES_PER_OP)
    assert pair is not None and pair.status == "pass", (pair.status, pair.detail)


# ---------------------------------------------------------------------------------------
# Comparison rules of the sweep itself (no device needed)


@pytest.mark.parametrize("oid,kwarg", [("add", "alpha"), ("sub", "alpha"), ("rsub", "alpha"),
                                       ("addcmul", "value"), ("addcdiv", "value")])
def test_short_run_reads_keyword_samples(oid, kwarg):
    """The CI subset's short sample mode still runs each op's keyword samples (a 3-sample
    sweep once missed that ``rsub(x, y, alpha=2)`` scaled the wrong operand)."""
    from torchtpu.conformance.opinfo import get_opinfo, sample_inputs

    read = sample_inputs(get_opinfo(oid), DTYPE, SAMPLES_PER_OP)
    assert any(kwarg in s.kwargs for s in read), [s.kwargs for s in read]
    # and the sweep's default (no limit) reads every sample
    op = get_opinfo(oid)
    assert len(sample_inputs(op, DTYPE)) == len(list(op.sample_inputs("cpu", DTYPE)))


def test_float_output_of_integer_sample_uses_float_tolerance():
    """As PyTorch's assertEqual: the tolerance follows the compared tensors' dtype, so a
    float output of an int64 sample is not compared exactly; int outputs still are."""
    from torchtpu.conformance.opinfo import compare

    e = torch.tensor([1.0, 2.0, 3.0])
    a = e + 1e-7
    assert compare(a, e, 0.0, 0.0, device="cpu") is None
    assert compare(e + 1e-3, e, 0.0, 0.0, device="cpu") is not None
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 3]), 0.5, 0.5, device="cpu") is not None


def test_tie_indices_checked_for_validity_not_equality():
    from torch.testing._internal.opinfo.core import SampleInput

    from torchtpu.conformance.opinfo import get_opinfo, tie_index_check

    x = torch.tensor([[3, 1, 3, 2, 1], [5, 5, 5, 0, 0]])

    def check(oid, actual_fn, *args, **kwargs):
        op = get_opinfo(oid)
        expected = op(x, *args, **kwargs)
        return tie_index_check(op, SampleInput(x, args=args, kwargs=kwargs),
                               actual_fn(expected), expected)[1]

    def swap_tied(e):  # row 0 sorted ascending starts with the two 1s (indices 1 and 4)
        v, i = e
        i = i.clone()
        i[0, 0], i[0, 1] = int(i[0, 1]), int(i[0, 0])
        return v, i

    def twice(e):
        v, i = e
        i = i.clone()
        i[0, 1] = i[0, 0]
        return v, i

    assert check("sort", swap_tied) is None
    assert check("sort", twice) is not None
    assert check("argsort", lambda e: swap_tied((None, e))[1]) is None
    # kthvalue(k=2) along dim 1: row 0 -> 1 (index 1 or 4), row 1 -> 0 (index 3 or 4)
    assert check("kthvalue", lambda e: (e[0], torch.tensor([4, 4])), 2, 1) is None
    assert check("kthvalue", lambda e: (e[0], torch.tensor([4, 0])), 2, 1) is not None
    assert check("topk", lambda e: (e[0], torch.tensor([[0, 0], [0, 1]])), 2, 1) is not None
    # a reduction of a 1-D input without keepdim: 0-d indices
    op = get_opinfo("kthvalue")
    x1 = torch.tensor([3, 1, 3, 2, 1])
    e = op(x1, 2, 0)
    assert tie_index_check(op, SampleInput(x1, args=(2, 0)), (e[0], torch.tensor(4)), e)[1] is None
    assert tie_index_check(op, SampleInput(x1, args=(2, 0)), (e[0], torch.tensor(0)), e)[1] \
        is not None
    # stable=True defines the tie order: left to the exact comparison
    op = get_opinfo("sort")
    s = SampleInput(x, kwargs={"stable": True})
    e = op(x, stable=True)
    actual, diff = tie_index_check(op, s, swap_tied(e), e)
    assert diff is None and not torch.equal(actual[1], e[1])


@pytest.mark.parametrize("oid", ["new_zeros", "randint_like", "empty_like", "arange", "linspace"])
def test_factory_samples_pinning_cpu_or_naming_no_device(oid):
    """A sample that pins ``device='cpu'`` (its meta twin shows 'cpu' too) must give a CPU
    result even on a tpu input, as on CPU PyTorch; a sample with no tensor and no device
    (``arange(2)``) runs with tpu as the default device and must give a tpu result.  The
    full sweep once reported both as "result on cpu, expected tpu"."""
    from torchtpu.conformance.opinfo import _meta_guides, get_opinfo, run_sample, sample_inputs

    op = get_opinfo(oid)
    samples = sample_inputs(op, DTYPE)
    guides = _meta_guides(op, DTYPE, len(samples))
    pinned = [i for i, s in enumerate(samples) if str(s.kwargs.get("device")) == "cpu"
              and guides[i] is not None and str(guides[i][2].get("device")) == "cpu"]
    bare = [i for i, s in enumerate(samples) if not s.kwargs and not isinstance(s.input, torch.Tensor)]
    assert pinned or bare
    for i in pinned + bare:
        r = run_sample(op, samples[i], DTYPE, index=i, guide=guides[i])
        assert r.status == "pass", (i, r.sample, r.detail)


def test_pinned_cpu_factory_result_must_be_on_cpu():
    """The harness fails a backend that ignores ``device='cpu'`` on a tpu input."""
    from torch.testing._internal.opinfo.core import SampleInput

    from torchtpu.conformance.opinfo import result_device, to_device

    x = torch.ones(3)
    s = SampleInput(x, args=((2,),), kwargs={"device": "cpu"})
    moved = to_device(s.input), to_device(s.args), to_device(s.kwargs, guide={"device": "cpu"})
    assert result_device(SampleInput(moved[0], args=moved[1], kwargs=moved[2])) == ("cpu", False)
    moved_kw = to_device(s.kwargs, guide={"device": "meta"})
    assert result_device(SampleInput(moved[0], args=moved[1], kwargs=moved_kw)) == ("tpu", False)
    assert result_device(SampleInput(2, args=(), kwargs={})) == ("tpu", True)


def test_float64_arbiter_accepts_closer_and_rejects_farther_results():
    """``pass-f64``: a bfloat16 linspace whose CPU kernel accumulates a bfloat16 step
    differs from tpu's beyond tolerance, but tpu is closer to the float64 result at every
    element; a result made worse than CPU's at one element is still a mismatch."""
    from torch.testing._internal.opinfo.core import SampleInput

    from torchtpu.conformance import opinfo

    op = opinfo.get_opinfo("linspace")
    sample = SampleInput(4.3, args=(-3, 50), kwargs={"dtype": torch.bfloat16, "device": "cpu"})
    expected = torch.linspace(4.3, -3, 50, dtype=torch.bfloat16)
    actual = torch.linspace(4.3, -3, 50, dtype=torch.bfloat16, device="tpu").cpu()
    if torch.equal(actual, expected):
        # torch 2.15's CPU kernel no longer accumulates the step in bfloat16: a CPU-like
        # result one bfloat16 step farther from float64 at one element
        expected = actual.clone()
        expected[10] += 0.125
    assert not torch.equal(actual, expected)
    ok, info = opinfo.f64_verdict(op, sample, expected, actual, 1e-2, 1.6e-2)
    assert ok, info
    worse = actual.clone()
    worse[29] += 0.25
    ok, info = opinfo.f64_verdict(op, sample, expected, worse, 1e-2, 1.6e-2)
    assert not ok and "farther" in info


def test_gradient_float64_arbiter_accepts_summation_noise_and_rejects_a_wrong_gradient():
    """Gradients: ``grid_sampler_2d``'s bicubic grid gradient (values ~100) differs
    from CPU's by ~5e-5, float32 summation noise of the size CPU's own error against
    float64 has, so it is ``pass-f64``; the same gradient with one element off by 1e-2
    is still a mismatch (``wrong gradient``)."""
    from torch.testing._internal.opinfo.core import SampleInput

    from torchtpu.conformance import opinfo

    op = opinfo.get_opinfo("grid_sampler_2d")
    gen = torch.Generator().manual_seed(5)
    inp = torch.randn(2, 3, 5, 20, generator=gen).requires_grad_(True)
    grid = (torch.rand(2, 13, 10, 2, generator=gen) * 2.2 - 1.1).requires_grad_(True)
    sample = SampleInput(inp, args=(grid, 2, 1, False))
    result = opinfo.run_sample_backward(op, sample, torch.float32, index=14)
    assert result.status in ("pass", "pass-f64"), result
    leaves = [inp, grid]
    out = torch.grid_sampler_2d(inp, grid, 2, 1, False)
    cots = [torch.randn(out.shape, generator=gen)]
    expected = torch.autograd.grad(out, leaves, cots)
    wrong = [g.clone() for g in expected]
    wrong[1].view(-1)[7] += 1e-2
    ok, info = opinfo._grad_f64_verdict(op, sample, leaves, cots, expected, wrong,
                                        2e-5, 2e-6)
    assert not ok and "farther" in info
    ok, info = opinfo._grad_f64_verdict(op, sample, leaves, cots, expected, expected,
                                        2e-5, 2e-6)
    assert ok, info
