"""Regressions found by PyTorch's own device-generic tests (tests/torch_upstream/):
each case runs the same user code on CPU and on tpu and compares results or errors."""

import re
import warnings

import pytest
import torch

import torchtpu


def _same_error(fn):
    """``fn(device)`` raises on CPU; it must raise the same type and message on tpu."""
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with pytest.raises(cpu.type, match=re.escape(str(cpu.value).split(" (Triggered")[0])):
        fn("tpu")


def _same_values(fn):
    """``fn(device)`` returns tensors; tpu's must equal CPU's."""
    cpu, tpu = fn("cpu"), fn("tpu")
    for c, t in zip(cpu, tpu):
        assert t.device.type == "tpu"
        torch.testing.assert_close(t.cpu(), c)


# ---------------------------------------------------------------- conj / neg views


@pytest.mark.parametrize("op", ["add_", "mul_", "sub_", "copy_"])
def test_inplace_on_conj_view_writes_base(op, eager_mode):
    def run(dev):
        a = torch.tensor([1 + 2j, 3 - 1j, -2 + 0.5j], device=dev)
        b = a.conj()
        getattr(b, op)(torch.tensor([1 + 1j, 2 - 1j, 0.5j], device=dev))
        return b, a, b.resolve_conj()

    _same_values(run)


def test_inplace_between_conj_views_of_one_storage(eager_mode):
    def run(dev):
        a = torch.tensor([1 + 2j, 3 - 1j, 5 + 5j, 2j], device=dev)
        b, c = a[:2].conj(), a[2:].conj()
        b.add_(c)
        d = a.conj()
        d.mul_(d)
        return a, b, c, d

    _same_values(run)


@pytest.mark.parametrize("op", ["add_", "mul_", "copy_"])
def test_inplace_on_neg_view_writes_base(op, eager_mode):
    def run(dev):
        a = torch.tensor([1.0, -2.0, 3.5], device=dev)
        n = torch._neg_view(a)
        getattr(n, op)(torch.tensor([0.5, 2.0, -1.0], device=dev))
        return n, a

    _same_values(run)


def test_copy_between_host_and_conj_view():
    def run(dev):
        host_dst = torch.zeros(2, dtype=torch.complex64).conj()
        host_dst.copy_(torch.tensor([1 + 1j, 2j], device=dev))
        dev_dst = torch.zeros(2, dtype=torch.complex64, device=dev).conj()
        dev_dst.copy_(torch.tensor([1 + 1j, 2j]))
        host = torch.zeros(2, dtype=torch.complex64)
        host.copy_(torch.tensor([1 + 1j, 2j], device=dev).conj())
        return host_dst.resolve_conj(), dev_dst.resolve_conj().cpu(), host

    for c, t in zip(run("cpu"), run("tpu")):
        torch.testing.assert_close(t, c)


# -------------------------------------------------------------------- boolean masks


@pytest.mark.parametrize("mask_dev", ["same", "cpu"])
def test_mask_of_wrong_shape_raises(mask_dev):
    def md(dev):
        return dev if mask_dev == "same" else "cpu"

    _same_error(lambda d: torch.ones(5, 4, 3, device=d)[torch.tensor([True], device=md(d))])
    _same_error(lambda d: torch.ones(5, 4, 3, device=d)[
        :, torch.tensor([True, False, True], device=md(d))])
    _same_error(lambda d: torch.randn(5, device=d)[
        torch.empty(0, 2, dtype=torch.uint8, device=md(d))])

    def put(d):
        a = torch.ones(5, 4, 3, device=d)
        a[torch.tensor([True], device=md(d))] = 2.0

    _same_error(put)


def test_uint8_mask_warns_as_cpu():
    def warned(dev):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            v = torch.tensor([1.0, 2.0, 3.0], device=dev)
            r = v[torch.tensor([1, 0, 1], dtype=torch.uint8, device=dev)]
            v.index_put_((torch.tensor([0, 1, 0], dtype=torch.uint8, device=dev),),
                         torch.tensor([5.0], device=dev), accumulate=True)
        msgs = [str(x.message) for x in w if "uint8" in str(x.message)]
        return r.cpu(), v.cpu(), msgs

    (rc, vc, wc), (rt, vt, wt) = warned("cpu"), warned("tpu")
    torch.testing.assert_close(rt, rc)
    torch.testing.assert_close(vt, vc)
    assert len(wt) == len(wc) == 2
    assert all(m.startswith("indexing with dtype torch.uint8 is now deprecated") for m in wt)


@pytest.mark.parametrize("values", [[1.0, 2.0, 3.0], [], [1.0, 2.0, 3.0, 4.0, 5.0]])
def test_mask_assignment_with_wrong_value_count_raises(values, eager_mode):
    def run(dev):
        a = torch.tensor([1.0, 2.0, 3.0, 4.0], device=dev)
        a[a > -1] = torch.tensor(values).to(dev)

    _same_error(run)


def test_mask_assignment_with_right_value_count(eager_mode):
    def run(dev):
        a = torch.tensor([[1.0, -2.0], [3.0, -4.0], [5.0, 6.0]], device=dev)
        b = a.clone()
        a[a > 0] = torch.tensor([10.0, 30.0, 50.0, 60.0], device=dev)
        b[b[:, 0] > 2] = torch.tensor([[7.0, 8.0], [9.0, 10.0]], device=dev)
        c = torch.zeros(3, 2, device=dev)
        c[torch.tensor([True, False, True], device=dev)] = torch.tensor([1.0, 2.0], device=dev)
        return a, b, c

    _same_values(run)

    def rows_mismatch(dev):
        a = torch.zeros(3, 2, device=dev)
        a[torch.tensor([True, False, True], device=dev)] = torch.ones(3, 2, device=dev)

    _same_error(rows_mismatch)


# ---------------------------------------------------------------- dtype checks


def test_index_fill_real_with_complex_raises():
    def scalar(dev):
        torch.ones(3, device=dev).index_fill_(0, torch.tensor([0], device=dev), 1 + 2j)

    def functional(dev):
        torch.index_fill(torch.ones(3, device=dev), 0, torch.tensor([1], device=dev), 1j)

    def tensor_value(dev):
        torch.ones(3, device=dev).index_fill_(0, torch.tensor([0], device=dev),
                                              torch.tensor(1 + 2j, device=dev))

    for fn in (scalar, functional, tensor_value):
        _same_error(fn)

    def complex_ok(dev):
        a = torch.ones(3, dtype=torch.complex64, device=dev)
        return (a.index_fill_(0, torch.tensor([1], device=dev), 1 + 2j),)

    _same_values(complex_ok)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_nonzero_out_must_be_long(dtype):
    def run(dev):
        out = torch.empty(0, dtype=dtype, device=dev)
        torch.nonzero(torch.tensor([1, 0, 1], device=dev), out=out)

    _same_error(run)

    def ok(dev):
        out = torch.empty(0, dtype=torch.int64, device=dev)
        torch.nonzero(torch.tensor([1, 0, 1], device=dev), out=out)
        return (out,)

    _same_values(ok)


def test_masked_select_out_dtype_must_match():
    def run(dev):
        torch.masked_select(torch.tensor([1.0, 0.0], device=dev),
                            torch.tensor([True, False], device=dev),
                            out=torch.empty(0, dtype=torch.int64, device=dev))

    _same_error(run)


# ------------------------------------------- PyTorch's errors, not JAX's, from indexing


def test_index_into_empty_dimension_raises(eager_mode):
    _same_error(lambda d: torch.empty(10, 0, device=d)[:, [0, 1]])

    def ok(dev):
        x = torch.empty(10, 0, device=dev)
        return x[[1, 2]], x[[], []]

    _same_values(ok)


def test_index_put_with_incompatible_shapes_raises(eager_mode):
    def indices(dev):
        a = torch.zeros(3, 4, device=dev)
        a[[0, 1], [0, 1, 2]] = 1.0

    def values(dev):
        a = torch.zeros(3, 4, device=dev)
        a[[0, 1]] = torch.ones(3, 4, device=dev)

    def values_aten(dev):
        torch.zeros(3, 4, device=dev).index_put_(
            (torch.tensor([0, 2], device=dev),), torch.ones(1, 2, 4, device=dev))

    for fn in (indices, values, values_aten):
        _same_error(fn)

    def ok(dev):
        a = torch.zeros(3, 4, device=dev)
        a[[0, 2]] = torch.arange(4.0, device=dev)
        a[[1, 2], [3, 0]] = torch.tensor([5.0, 6.0], device=dev)
        return (a,)

    _same_values(ok)


def test_data_dependent_op_out_on_cpu_raises_as_cuda():
    # PyTorch's test_nonzero (test_shape_ops.py): out= on another device raises on CUDA
    t = torch.tensor([[0, 1], [2, 0]], device="tpu")
    with pytest.raises(RuntimeError, match="on the same device"):
        torch.nonzero(t, out=torch.empty([], dtype=torch.long))
    out = torch.empty(0, dtype=torch.long, device="tpu")
    torch.nonzero(t, out=out)
    assert torch.equal(out.cpu(), torch.nonzero(t.cpu()))


def test_index_reduce_beta_warning_once_per_process_as_cpu():
    """CPU warns "index_reduce() is in beta" once per process (TORCH_WARN_ONCE); so does
    tpu (test_index_reduce checks the warning)."""
    import subprocess
    import sys

    code = (
        "import warnings, torch, torchtpu\n"
        "warnings.simplefilter('always')\n"
        "for d in ('cpu', 'tpu'):\n"
        "    with warnings.catch_warnings(record=True) as w:\n"
        "        warnings.simplefilter('always')\n"
        "        for _ in range(2):\n"
        "            torch.ones(3, device=d).index_reduce_(0, torch.tensor([0], device=d),\n"
        "                                                  torch.ones(1, device=d), 'prod')\n"
        "    print(d, sum('index_reduce() is in beta' in str(x.message) for x in w))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out == ["cpu", "1", "tpu", "1"], out


@pytest.mark.parametrize("value", [[], [1.0, 2.0, 3.0]])
def test_mask_assignment_checks_shape_before_dtype_as_cpu(value):
    """``a[a > -1] = tensor([])`` on an int64 ``a``: CPU reports the shape mismatch
    before the dtype mismatch (upstream test_boolean_assignment_value_mismatch); tpu
    reported the dtypes."""
    msgs = []
    for dev in ("cpu", "tpu"):
        a = torch.arange(0, 4, device=dev)
        with pytest.raises(RuntimeError) as e:
            a[a > -1] = torch.tensor(value).to(dev)
        msgs.append(str(e.value))
    assert msgs[0].startswith("shape mismatch")
    assert msgs[1] == msgs[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("include_self", [True, False])
def test_half_precision_mean_reductions_round_as_cpu(dtype, include_self):
    """``index_reduce_(..., "mean")`` adds each source element in the tensor's dtype on
    CPU, and ``scatter_reduce(..., "mean")`` rounds its opmath sum to the dtype before
    dividing; tpu summed in float32 and rounded once, 2 ulps off after 50 additions
    (upstream test_index_reduce_reduce_mean_tpu_float16/bfloat16)."""
    warnings.simplefilter("ignore")  # index_reduce's beta warning
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 3, generator=gen) * 4).to(dtype)
    src = (torch.rand(200, 3, generator=gen) * 3 + 1).to(dtype)
    idx = torch.randint(0, 4, (200,), generator=gen)
    want = x.clone().index_reduce_(0, idx, src, "mean", include_self=include_self)
    got = x.to("tpu").index_reduce_(0, idx.to("tpu"), src.to("tpu"), "mean",
                                    include_self=include_self)
    assert torch.equal(got.cpu(), want)
    i2 = idx[:, None].expand(200, 3)
    want = x.scatter_reduce(0, i2, src, "mean", include_self=include_self)
    got = x.to("tpu").scatter_reduce(0, i2.to("tpu"), src.to("tpu"), "mean",
                                     include_self=include_self)
    assert torch.equal(got.cpu(), want)


# ---------------------------------------------------------------- unique with NaN


def test_unique_keeps_every_nan_as_cpu():
    """``torch.unique`` treats each NaN as its own value (sorted last, in input order), as
    CPU; tpu merged them into one (upstream test_unique_dim, test_sort_and_select.py)."""
    def run(dev):
        x = torch.tensor([float("nan"), 0, 0, float("nan"), float("nan"), 1], device=dev)
        return torch.unique(x, return_inverse=True, return_counts=True)

    cpu, tpu = run("cpu"), run("tpu")
    for c, t in zip(cpu, tpu):
        torch.testing.assert_close(t.cpu(), c, equal_nan=True)


@pytest.mark.parametrize("rows", [
    [[float("nan")], [0.0], [0.0], [float("nan")], [float("nan")], [1.0]],
    [[1.0, 0.0], [float("nan"), 2.0], [0.0, 1.0], [1.0, 0.0], [0.0, float("nan")]],
    [[2.0], [float("nan")], [1.0], [0.0], [2.0], [1.0]],
])
def test_unique_dim_with_nan_orders_rows_as_cpu(rows):
    """``torch.unique(x, dim=0)`` on rows holding NaN: CPU's order comes from std::sort with
    a comparator NaN makes inconsistent; tpu sorted them as if NaN were largest."""
    def run(dev):
        x = torch.tensor(rows, device=dev)
        return torch.unique(x, dim=0, return_inverse=True, return_counts=True)

    cpu, tpu = run("cpu"), run("tpu")
    for c, t in zip(cpu, tpu):
        torch.testing.assert_close(t.cpu(), c, equal_nan=True)


def test_unique_dim_with_nan_on_many_rows_raises():
    """More than 16 slices with NaN: CPU's order is std::sort's introsort on an
    inconsistent comparator, not reproduced: NotImplementedError, not another order."""
    x = torch.arange(20.0, device="tpu")
    x[3] = float("nan")
    with pytest.raises(NotImplementedError, match="unique"):
        torch.unique(x, dim=0)
    y = torch.arange(20.0, device="tpu")  # no NaN: any length
    torch.testing.assert_close(torch.unique(y.flip(0), dim=0).cpu(), torch.arange(20.0))


# ---------------------------------------------------------------- isin and strides


_ISIN_TESTS = {
    "rows_sliced": lambda d: torch.arange(12, device=d).view(3, 4)[:, :2],
    "transposed": lambda d: torch.arange(12, device=d).view(3, 4).t(),
    "3d_sliced": lambda d: torch.arange(24, device=d).view(2, 3, 4)[:, 1:, ::2],
    "strided_1d": lambda d: torch.arange(12, device=d)[::3],
    "expanded": lambda d: torch.tensor([[1, 2]], device=d).expand(3, 2),
    "float_sliced": lambda d: torch.arange(12.0, device=d).view(3, 4)[:, :2],
}
_ISIN_ELEMENTS = {
    "six": lambda d: torch.arange(6, device=d),
    "hundred": lambda d: torch.arange(100, device=d),
    "six_float": lambda d: torch.arange(6.0, device=d),
    # a float cast of dense test elements keeps their strides (CPU's .to()): a transpose
    # still raises
    "three_float": lambda d: torch.arange(3.0, device=d),
    "six_int32": lambda d: torch.arange(6, dtype=torch.int32, device=d),
    "zero_dim": lambda d: torch.tensor(3, device=d),
    "empty": lambda d: torch.arange(0, device=d),
    "number": lambda d: 3,
    "float_number": lambda d: 3.0,
}


@pytest.mark.parametrize("elements", sorted(_ISIN_ELEMENTS))
@pytest.mark.parametrize("test", sorted(_ISIN_TESTS))
@pytest.mark.parametrize("form", ["plain", "invert", "out"])
def test_isin_of_non_contiguous_test_elements_as_cpu(test, elements, form):
    """CPU's ``isin`` with few test elements (< int(10 * numel ** 0.145)) reads
    ``test_elements.to(common_dtype).view(-1)``: test elements of the common dtype that no
    1-d view covers raise "view size is not compatible with input tensor's size and
    stride"; a dtype cast (a copy) or the sorting kernel (more test elements) takes any
    strides, as do no elements at all.  tpu returned a value for every case."""
    def run(dev):
        e, t = _ISIN_ELEMENTS[elements](dev), _ISIN_TESTS[test](dev)
        if form == "out":
            out = torch.empty(0, dtype=torch.bool, device=dev)
            return (torch.isin(e, t, out=out), out)
        return (torch.isin(e, t, invert=form == "invert"),)

    try:
        run("cpu")
    except RuntimeError:
        _same_error(run)
    else:
        _same_values(run)


_ISIN_VALUES = {
    "specials": (lambda: torch.tensor([0.0, -0.0, float("nan"), 1.5, float("inf"), 3.0]),
                 lambda: torch.tensor([-0.0, float("nan"), float("inf"), 2.0])),
    "int_in_float": (lambda: torch.arange(20), lambda: torch.tensor([3.0, 5.5, 19.0])),
    "int8_vs_wide": (lambda: torch.arange(10, dtype=torch.int8), lambda: torch.tensor([300, 4])),
    "half": (lambda: torch.randn(400).half(), lambda: torch.randn(200).half()),
    "sorting_method": (lambda: torch.randint(0, 3000, (700, 700)),
                       lambda: torch.randint(0, 3000, (9000,))),
    "empty_tests": (lambda: torch.arange(5), lambda: torch.tensor([], dtype=torch.int64)),
}


@pytest.mark.parametrize("invert", [False, True])
@pytest.mark.parametrize("case", sorted(_ISIN_VALUES))
@pytest.mark.usefixtures("fresh_shape_buckets")  # (an earlier file's isin churn buckets it)
def test_isin_values_as_cpu_in_one_op(case, invert):
    """``isin`` is one executable (it was PyTorch's out= kernel around its decomposition:
    5 ops per call, 3 calls per generated token in HF's stopping criteria); values as
    CPU's for NaN, signed zeros, mixed dtypes and the sorting method."""
    torch.manual_seed(0)
    e, t = (f() for f in _ISIN_VALUES[case])
    c = torch.isin(e, t, invert=invert)
    et, tt = e.to("tpu"), t.to("tpu")
    torch.isin(et, tt, invert=invert)  # (first call: compiles)
    before = torchtpu.metrics()["ops_dispatched"]
    r = torch.isin(et, tt, invert=invert)
    # one op (two where the ids are a padded sequence: its result is masked)
    assert torchtpu.metrics()["ops_dispatched"] - before <= 2
    assert r.dtype == c.dtype and torch.equal(r.cpu(), c)


# ---------------------------------------------------------------- default dtype, complex order


@pytest.mark.parametrize("case", ["bool_plus_float", "bool_div", "long_times_complex",
                                  "ones", "arange", "linspace", "scalar_tensor"])
def test_default_dtype_change_reaches_results_as_cpu(case, eager_mode):
    """torch.set_default_dtype(torch.float64) after the same op ran under float32: tpu
    reused the float32 executable (its cache key lacked the default dtype) and returned
    float32/complex64 where CPU returns float64/complex128 (upstream test_type_promotion)."""
    fns = {
        "bool_plus_float": lambda d: torch.ones(3, dtype=torch.bool, device=d) + 1.5,
        "bool_div": lambda d: torch.ones(3, dtype=torch.bool, device=d) / torch.ones(3, dtype=torch.bool, device=d),
        "long_times_complex": lambda d: torch.arange(3, device=d) * (1 + 1j),
        "ones": lambda d: torch.ones(2, device=d),
        "arange": lambda d: torch.arange(False, True, 0.5, device=d),
        "linspace": lambda d: torch.linspace(0, 1, steps=5, device=d),
        "scalar_tensor": lambda d: torch.scalar_tensor(False, device=d),
    }
    f = fns[case]
    old = torch.get_default_dtype()
    try:
        for dd in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(dd)
            cpu, tpu = f("cpu"), f("tpu")
            assert tpu.dtype == cpu.dtype, (dd, tpu.dtype, cpu.dtype)
            torch.testing.assert_close(tpu.cpu(), cpu)
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("op", ["lt", "le", "gt", "ge"])
def test_ordered_comparison_of_complex_raises_as_cpu(op):
    """``a < b`` with a complex common dtype raises NotImplementedError on CPU ("lt_cpu" not
    implemented for 'ComplexFloat'); tpu returned an answer (upstream
    test_complex_assertraises)."""
    for a, b in [(torch.tensor([1 + 1j]), torch.tensor([2 + 0j])),
                 (torch.tensor([1]), torch.tensor([2], dtype=torch.complex128)),
                 (torch.tensor([1 + 1j]), 0.5)]:
        with pytest.raises(NotImplementedError, match="not implemented for 'Complex"):
            getattr(torch, op)(a, b)
        with pytest.raises(NotImplementedError, match=f"\"{op}_tpu\" not implemented for 'Complex"):
            getattr(torch, op)(a.to("tpu"), b.to("tpu") if isinstance(b, torch.Tensor) else b)
    # eq/ne stay defined for complex, as on CPU
    x = torch.tensor([1 + 1j, 2 + 0j])
    assert torch.equal(torch.eq(x.to("tpu"), x.to("tpu")[:1]).cpu(), torch.eq(x, x[:1]))


@pytest.mark.parametrize("op", ["neg", "round", "bitwise_not"])
@pytest.mark.parametrize("dtypes", [(torch.int64, torch.float32), (torch.int64, torch.int32),
                                    (torch.float32, torch.float64), (torch.float64, torch.float32)])
def test_unary_out_of_another_dtype_raises_as_cpu(op, dtypes):
    """``torch.neg(x, out=o)`` with ``o`` of another dtype raises on CPU ("Found dtype Double
    but expected Float"); tpu cast the result into ``o`` (upstream
    test_unary_op_out_casting)."""
    src, dst = dtypes
    if op == "bitwise_not" and src.is_floating_point:
        pytest.skip("bitwise_not of a float raises for the input already")

    def run(dev):
        t = torch.tensor([3], dtype=src, device=dev)
        getattr(torch, op)(t, out=torch.empty(0, dtype=dst, device=dev))

    _same_error(run)


@pytest.mark.parametrize("case", ["frac_int", "bitwise_not_float"])
def test_unary_op_on_unsupported_dtype_raises_as_cpu(case):
    """``torch.frac`` of an integer tensor and ``torch.bitwise_not`` of a float one raise
    NotImplementedError on CPU; tpu returned zeros / raised a lowering RuntimeError."""
    def run(dev):
        if case == "frac_int":
            return torch.frac(torch.tensor([3, -2], device=dev))
        return torch.bitwise_not(torch.tensor([3.0], device=dev))

    with pytest.raises(NotImplementedError, match="not implemented for"):
        run("cpu")
    with pytest.raises(NotImplementedError, match="_tpu\" not implemented for '(Long|Float)'"):
        run("tpu")


_BITWISE = {
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "and_op": lambda a, b: a & b,
    "xor_op": lambda a, b: a ^ b, "lshift": torch.bitwise_left_shift,
    "rshift": torch.bitwise_right_shift, "lshift_op": lambda a, b: a << b,
    "rshift_op": lambda a, b: a >> b,
    "iand": lambda a, b: a.__iand__(b), "ilshift": lambda a, b: a.__ilshift__(b),
    "irshift": lambda a, b: a.__irshift__(b),
}


@pytest.mark.parametrize("op", sorted(_BITWISE))
@pytest.mark.parametrize("operands", ["float_float", "int_float", "float_int", "float_number",
                                      "int_float_number", "complex_int", "bool_bool",
                                      "bool_number", "bool_int", "int_bool"])
def test_bitwise_ops_follow_cpu_dtype_rules(op, operands):
    """Bitwise and shift ops on a floating or complex common dtype raise NotImplementedError
    on CPU (``"bitwise_and_cpu" not implemented for 'Float'``), shifts of two Bools too
    (``"lshift_cpu" not implemented for 'Bool'``); tpu raised a RuntimeError from JAX's
    lowering (or shifted the Bools).  ``bool_tensor << 2`` is an int64 on CPU (PyTorch's
    meta kernel refused it); ``bool_tensor <<= 2`` raises CPU's cast error (tpu cast the
    shifted values back to Bool)."""
    fn = _BITWISE[op]
    lhs, rhs = operands.split("_", 1)
    make = {"float": lambda dev: torch.tensor([1.5, -2.0, 3.0], device=dev),
            "int": lambda dev: torch.tensor([1, 2, 3], device=dev),
            "complex": lambda dev: torch.tensor([1 + 1j, 2, 3], device=dev),
            "bool": lambda dev: torch.tensor([True, False, True], device=dev),
            "number": lambda dev: 2, "float_number": lambda dev: 1.5}

    def run(dev):
        return fn(make[lhs](dev), make[rhs](dev))

    try:
        want = run("cpu")
    except Exception as e:  # noqa: BLE001 (CPU's error, whichever)
        # tpu names its own kernel ("bitwise_and_tpu") where CPU names "bitwise_and_cpu"
        msg = re.escape(str(e)).replace("_cpu", "_(cpu|tpu)")
        with pytest.raises(type(e), match=msg):
            run("tpu")
    else:
        got = run("tpu")
        assert got.device.type == "tpu" and got.dtype == want.dtype
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_scatter_sums_and_products_round_once_as_cpu(dtype):
    """CPU's scatter kernels (``scatter_add``, ``scatter_reduce`` sum/prod, ``scatter``
    with ``reduce=``) accumulate bfloat16/float16 in float32 and round once; tpu rounded
    at every addition (``zeros(1).scatter_add`` of 1 and four 2**-8: CPU 1.015625, tpu
    1.0)."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 4, generator=gen) * 3).to(dtype)
    src = (torch.randn(40, 4, generator=gen) * 3).to(dtype)
    fac = (src.float() / 8 + 1).to(dtype)
    idx = torch.randint(0, 5, (40, 4), generator=gen)
    cases = {
        "scatter_add": lambda d: x.to(d).scatter_add(0, idx.to(d), src.to(d)),
        "sum": lambda d: x.to(d).scatter_reduce(0, idx.to(d), src.to(d), "sum"),
        "sum without self": lambda d: x.to(d).scatter_reduce(0, idx.to(d), src.to(d), "sum",
                                                             include_self=False),
        "prod": lambda d: x.to(d).scatter_reduce(0, idx.to(d), fac.to(d), "prod"),
        "scatter add": lambda d: x.to(d).scatter(0, idx.to(d), src.to(d), reduce="add"),
        "scatter multiply": lambda d: x.to(d).scatter(0, idx.to(d), fac.to(d),
                                                      reduce="multiply"),
    }
    for name, f in cases.items():
        assert torch.equal(f("tpu").cpu(), f("cpu")), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_index_add_rounds_as_cpu(dtype, eager_mode):
    """CPU's ``index_add`` of a tensor of 2+ dims along its first or last dim, with
    ``alpha=1`` and an int64 index, goes through ``scatter_add_``: bfloat16/float16 sums
    accumulate in float32 and round once.  Elsewhere (other dims, an int32 index,
    ``alpha != 1``, 1-D tensors) it adds ``round(alpha * source)`` in the dtype, slice by
    slice.  tpu added in the dtype everywhere: 40 rows into 5 differed from CPU."""
    gen = torch.Generator().manual_seed(0)
    for shape, dim in [((5, 3), 0), ((3, 5), 1), ((4, 5, 3), 0), ((4, 5, 3), 1),
                       ((4, 5, 3), 2), ((6,), 0)]:
        x = torch.randn(shape, generator=gen).to(dtype)
        src_shape = list(shape)
        src_shape[dim] = 40
        src = torch.randn(src_shape, generator=gen).to(dtype)
        for idx_dtype in (torch.int64, torch.int32):
            idx = torch.randint(0, shape[dim], (40,), generator=gen, dtype=idx_dtype)
            for alpha in (1, 0.3):
                want = x.index_add(dim, idx, src, alpha=alpha)
                got = x.to("tpu").index_add(dim, idx.to("tpu"), src.to("tpu"), alpha=alpha)
                assert torch.equal(got.cpu(), want), (shape, dim, idx_dtype, alpha)


# ------------------------------------------------------------------ test_unary_ufuncs.py


def _bitwise_same(t, c, zero_sign=True):
    """CPU's infinities, NaNs and zeros (with their signs unless ``zero_sign=False``)
    exactly; finite values within float tolerance."""
    t = t.cpu()
    assert t.dtype == c.dtype
    special = ~c.isfinite() | ((c == 0) if zero_sign else False)
    same = (t == c) | (t.isnan() & c.isnan())
    if zero_sign:
        same &= (c != 0) | (t.signbit() == c.signbit())
    assert bool(same[special].all()), (t[special & ~same], c[special & ~same])
    torch.testing.assert_close(t[~special], c[~special])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_digamma_of_signed_zero_as_cpu(dtype):
    """CPU's digamma(+-0) is copysign(inf, -x): -inf at +0, +inf at -0 (tpu gave -inf
    for both)."""
    x = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, -2.5], dtype=dtype)
    for f in (torch.digamma, lambda v: torch.polygamma(0, v), torch.special.psi):
        _bitwise_same(f(x.to("tpu")), f(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_igamma_igammac_edge_values_as_cpu(dtype):
    """igamma(0, x > 0) is 1, igamma(inf, finite x) 0, igamma(inf, inf) NaN (and the
    complements for igammac), as CPU's calc_igamma; tpu gave NaN, NaN and 1."""
    v = torch.tensor([0.0, 1e-3, 1.0, 1e3, float("inf"), -1.0, float("nan")], dtype=dtype)
    a, x = torch.meshgrid(v, v, indexing="ij")
    for f in (torch.igamma, torch.igammac):
        c, t = f(a, x), f(a.to("tpu"), x.to("tpu")).cpu()
        special = (a == 0) | (x == 0) | a.isinf() | x.isinf() | (a < 0) | (x < 0)
        _bitwise_same(t[special], c[special])
        torch.testing.assert_close(t, c, equal_nan=True)


def test_igamma_float32_within_float32_tolerance_of_cpu():
    """float32 igamma/igammac near a ~ x ~ 45 were up to 1.5e-5 off CPU's (past
    assert_close's float32 atol 1e-5 + rtol 1.3e-6)."""
    v = torch.logspace(-4, 4, steps=500, base=2.71828182846, dtype=torch.float64)
    a = v.unsqueeze(-1).float()
    for f in (torch.igamma, torch.igammac):
        torch.testing.assert_close(f(a.to("tpu"), a.T.to("tpu")).cpu(), f(a, a.T))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_exp_special_values_as_cpu(dtype):
    """exp(inf + inf j) and exp(inf + nan j) are inf + nan j, exp(-inf + inf j) is 0 + 0j,
    exp(nan + 0j) is nan + 0j (C99 cexp, CPU's std::exp, NumPy); tpu gave nan + nan j
    for the first two."""
    inf, nan = float("inf"), float("nan")
    vals = [0.0, -0.0, 1.0, -1.0, 2.0, inf, -inf, nan]
    x = torch.tensor([complex(a, b) for a in vals for b in vals], dtype=dtype)
    c, t = torch.exp(x), torch.exp(x.to("tpu")).cpu()
    # the special values exactly, the finite ones within float tolerance
    finite = c.real.isfinite() & c.imag.isfinite()
    _bitwise_same(t.real[~finite], c.real[~finite])
    _bitwise_same(t.imag[~finite & ~c.imag.isnan()], c.imag[~finite & ~c.imag.isnan()])
    assert bool(t.imag[c.imag.isnan()].isnan().all())
    torch.testing.assert_close(t[finite], c[finite])


def test_frexp_out_of_wrong_dtype_raises_as_cpu():
    """frexp(x, out=(m, e)) with m not of x's dtype or e not int32: CPU raises; tpu cast
    the results into them."""
    x = torch.randn(5)
    for md, ed in ((torch.float64, torch.int32), (torch.float32, torch.int64),
                   (torch.float32, torch.float32)):
        _same_error(lambda d: torch.frexp(
            x.to(d), out=(torch.empty(5, dtype=md, device=d), torch.empty(5, dtype=ed, device=d))))


def test_abs_of_complex_into_complex_out_as_cpu():
    """abs(complex, out=<complex>) writes |z| + 0j on CPU; tpu raised the reference's
    "Expected out tensor to have dtype float"."""
    z = torch.tensor([1 + 2j, -3 + 0.5j, 0j])

    def run(d):
        out = torch.empty(3, dtype=torch.complex64, device=d)
        torch.abs(z.to(d), out=out)
        return (out,)

    _same_values(run)
    with pytest.raises(RuntimeError):  # a long out stays an error, as on CPU
        torch.abs(z.to("tpu"), out=torch.empty(3, dtype=torch.long, device="tpu"))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("fn", [torch.abs, torch.sqrt, torch.exp2, torch.atan, torch.tan],
                         ids=["abs", "sqrt", "exp2", "atan", "tan"])
def test_complex_unary_special_values_as_cpu(fn, dtype):
    """Complex inputs with an infinite or NaN part: CPU follows C99 Annex G (as NumPy):
    abs(inf + nanj) = inf, sqrt(nan + infj) = inf + infj, exp2(inf + 0j) = inf + 0j,
    atan(nan + 0j) = nan + 0j, tan(inf + 0j) = nan + 0j; tpu gave NaN (atan: +-pi/2)."""
    inf, nan = float("inf"), float("nan")
    vals = [0.0, 1.0, -1.0, inf, -inf, nan, 1e20, -1e20]
    x = torch.tensor([complex(a, b) for a in vals for b in vals], dtype=dtype)
    c, t = fn(x), fn(x.to("tpu")).cpu()
    # (the signs of zero parts are not compared: assert_close ignores them too, and CPU's
    # vectorized and scalar paths differ there)
    if c.is_complex():
        _bitwise_same(t.real, c.real, zero_sign=False)
        _bitwise_same(t.imag, c.imag, zero_sign=False)
    else:
        _bitwise_same(t, c, zero_sign=False)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("name", ["sqrt", "rsqrt", "sigmoid", "log", "asin", "acos", "atan",
                                  "asinh", "acosh", "atanh"])
def test_complex_branch_cuts_and_special_values_as_cpu(name, dtype):
    """On a branch cut the sign of a zero part picks the side (C99, CPU, NumPy):
    sqrt(-1 - 0j) = -1j, asinh(-0 - 3j) = -1.81 - 1.57j, acosh(-1 - 0j) = -pi j; XLA
    ignored it (+1j, +1.81, +pi j).  Also the NaN/inf cases: sigmoid(-inf + 1j) and
    rsqrt(infj) are NaN + NaNj (CPU's complex division), log(inf + nanj) = inf + nanj,
    atanh(nanj) = 0 + nanj, acos(0 + nanj) = pi/2 + nanj."""
    inf, nan = float("inf"), float("nan")
    vals = [0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 0.5, -0.5, inf, -inf, nan, 1e20, -1e20]
    x = torch.tensor([complex(a, b) for a in vals for b in vals], dtype=dtype)
    fn = getattr(torch, name)
    c, t = fn(x), fn(x.to("tpu")).cpu()
    _bitwise_same(t.real, c.real, zero_sign=False)
    _bitwise_same(t.imag, c.imag, zero_sign=False)

# ---------------------------------------------------------------- test_reductions.py


@pytest.mark.parametrize("op", ["all", "any"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.float32])
def test_all_any_out_of_another_dtype_raises_as_cpu(op, dtype):
    # PyTorch's meta kernel casts into any out= dtype; CPU accepts only bool or uint8
    def run(dev):
        x = torch.ones(3, 4, dtype=dtype, device=dev)
        out = torch.empty(4, dtype=dtype, device=dev)
        getattr(torch, op)(x, 0, out=out)

    _same_error(run)

    def ok(dev):
        x = torch.tensor([[1, 0], [1, 1]], dtype=dtype, device=dev)
        outs = (torch.empty(2, dtype=torch.bool, device=dev),
                torch.empty(2, dtype=torch.uint8, device=dev))
        for out in outs:
            getattr(torch, op)(x, 0, out=out)
        return outs

    _same_values(ok)


@pytest.mark.parametrize("case", ["2d", "float", "minlength", "weights_2d", "weights_len",
                                  "int64_max", "overflowing_size", "overflowing_minlength",
                                  "unallocatable"])
def test_bincount_invalid_arguments_raise_as_cpu(case):
    # a 2-d input was counted as if flattened; the others raised numpy's errors; an
    # int64-max value made numpy's bincount write out of bounds (the heap corrupted, an
    # abort at interpreter exit)
    def run(dev):
        x = torch.tensor([1, 0], device=dev)
        w = torch.tensor([1.0, 0.5], device=dev)
        if case == "2d":
            torch.bincount(torch.tensor([[1, 2], [3, 4]], device=dev))
        elif case == "float":
            torch.bincount(torch.tensor([1.0, 0.3], device=dev))
        elif case == "minlength":
            torch.bincount(x, w, minlength=-1)
        elif case == "weights_2d":
            torch.bincount(x, w.expand(2, 2))
        elif case == "int64_max":
            torch.bincount(torch.tensor([3, 2**63 - 1], device=dev))
        elif case == "overflowing_size":
            torch.bincount(torch.tensor([2**62, 1], device=dev))
        elif case == "overflowing_minlength":
            torch.bincount(x, minlength=2**63 - 1)
        elif case == "unallocatable":  # numpy's MemoryError was raised, CPU's RuntimeError
            torch.bincount(torch.tensor([2**40], device=dev))
        else:
            torch.bincount(x, torch.tensor([1.0, 0.3, 0.5], device=dev))

    if case == "float":  # CPU names its kernel ("bincount_cpu")
        for dev in ("cpu", "tpu"):
            with pytest.raises(NotImplementedError, match="not implemented for 'Float'"):
                run(dev)
    elif case == "unallocatable":  # (CPU's message adds its allocator's source line)
        for dev in ("cpu", "tpu"):
            with pytest.raises(RuntimeError, match="can't allocate memory: you tried to "
                                                   "allocate 8796093022216 bytes"):
                run(dev)
    else:
        _same_error(run)


def test_nansum_over_a_dim_of_more_than_64_dims_raises_as_cpu():
    def run(dev):
        torch.nansum(torch.ones([1] * 65, device=dev), dim=-1)

    _same_error(run)


@pytest.mark.parametrize("values", [[1.0, float("inf")], [float("-inf")], [float("nan")],
                                    [2.0, float("nan")]])
def test_histc_of_data_with_a_non_finite_range_raises_as_cpu(values):
    # tpu returned all-zero counts
    for dev in ("cpu", "tpu"):  # (CPU's message widens an empty range by one ulp)
        with pytest.raises(RuntimeError, match=r"torch.histc: range of \[.*\] is not finite"):
            torch.histc(torch.tensor(values, device=dev), bins=4)

    def ok(dev):  # an explicit range ignores values outside it
        return (torch.histc(torch.tensor(values + [1.5], device=dev), bins=4, min=1, max=3),)

    _same_values(ok)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_aminmax_of_complex_raises_as_cpu(dtype):
    # tpu returned the 0-d input as its min and max
    def run(dev):
        torch.aminmax(torch.tensor(1.0, dtype=dtype, device=dev), dim=0)

    _same_error(run)


def test_mode_with_out_views_as_cpu():
    # mode.values' composite kernel refused the device ("mode only supports CPU, CUDA...")
    def run(dev):
        y = torch.arange(15.0, device=dev).reshape(5, 3) % 4
        values = torch.zeros(5, 3, device=dev)
        indices = torch.full((5, 3), -1, device=dev)
        torch.mode(y, 1, out=(values[:, 1], indices[:, 1]))
        return values, indices

    _same_values(run)


@pytest.mark.parametrize("op", ["var", "std", "var_mean", "std_mean"])
def test_var_std_warn_when_correction_leaves_no_degrees_of_freedom_as_cpu(op):
    def warned(dev, correction):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            getattr(torch, op)(torch.ones(10, 20, device=dev), dim=-1, correction=correction)
        return [str(m.message) for m in w if "degrees of freedom" in str(m.message)]

    for correction in (20, 5, 30):  # one executable for every correction on tpu
        cpu = [m.split(" (Triggered")[0] for m in warned("cpu", correction)]
        assert warned("tpu", correction) == cpu


@pytest.mark.parametrize("dtypes", [(torch.uint8, torch.int8, torch.int64),
                                    (torch.float32, torch.float32, torch.float64)])
def test_mode_out_of_another_dtype_raises_as_cpu(dtypes):
    x_ty, v_ty, i_ty = dtypes

    def run(dev):
        torch.mode(torch.ones(10, dtype=x_ty, device=dev), -1, True,
                   out=(torch.ones(10, dtype=v_ty, device=dev), torch.ones(10, dtype=i_ty, device=dev)))

    _same_error(run)


def _same_error_but_kernel_name(fn):
    """``fn(device)`` raises on CPU; tpu must raise the same type and message, up to the
    device in the kernel's name ("median_cpu" on CPU, "median_tpu" on tpu)."""
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with pytest.raises(cpu.type, match=re.escape(str(cpu.value)).replace("_cpu", "_(cpu|tpu)")):
        fn("tpu")


@pytest.mark.parametrize("op", ["median", "nanmedian"])
@pytest.mark.parametrize("case", ["all", "dim", "dim_keepdim", "zero_dim", "zero_dim_dim",
                                  "empty_other_dim", "out", "empty_all", "empty_dim"])
def test_median_of_bool_raises_as_cpu(op, case):
    """``median``/``nanmedian`` of a Bool tensor raise NotImplementedError on CPU
    (``"median_cpu"``, or ``"median_out"`` over a dim, not implemented for 'Bool'); tpu
    returned a value.  An empty tensor's checks come first, as on CPU (the median of all
    of no elements is NaN cast to Bool; an empty reduced dim is an IndexError)."""
    def run(dev):
        fn = getattr(torch, op)

        def b(*shape):
            return torch.ones(shape, dtype=torch.bool, device=dev)

        if case == "all":
            return (fn(b(3)),)
        if case == "dim":
            return tuple(fn(b(3), 0))
        if case == "dim_keepdim":
            return tuple(fn(b(2, 3), 1, True))
        if case == "zero_dim":
            return (fn(b()),)
        if case == "zero_dim_dim":
            return tuple(fn(b(), 0))
        if case == "empty_other_dim":
            return tuple(fn(b(0, 3), 1))
        if case == "out":
            out = (torch.empty(0, dtype=torch.bool, device=dev),
                   torch.empty(0, dtype=torch.long, device=dev))
            return tuple(fn(b(3), 0, out=out))
        if case == "empty_all":
            return (fn(b(0)),)
        return tuple(fn(b(0), 0))

    if case == "empty_all":
        _same_values(run)
    else:
        _same_error_but_kernel_name(run)


@pytest.mark.parametrize("shape", [(3,), (0, 3)])
def test_kthvalue_of_bool_raises_as_cpu(shape):
    """``kthvalue`` of a Bool tensor: ``"kthvalue_cpu" not implemented for 'Bool'`` on CPU
    (a 0-d one is returned as is there, and is here); tpu returned a value."""
    def run(dev):
        torch.ones(shape, dtype=torch.bool, device=dev).kthvalue(1)

    _same_error_but_kernel_name(run)
    _same_values(lambda dev: tuple(torch.tensor(True, device=dev).kthvalue(1)))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_mode_of_up_to_16_values_with_nan_and_signed_zeros_as_cpu(n, dtype):
    """CPU's mode ``std::sort``s (value, index) pairs with ``<`` on the value, which for up
    to 16 values is libstdc++'s insertion sort, NaNs staying where ``<`` leaves them, then
    takes the last pair of the first longest run (each NaN its own run, -0.0 and 0.0 one
    run).  tpu sorted NaN last and returned another value or index (and index -1 for a
    row of NaNs); ties without NaN already matched (the last occurrence).  (Longer rows:
    libstdc++'s introsort, not reproduced: the index among equal values differs.)"""
    g = torch.Generator().manual_seed(n)
    x = torch.randint(0, 3, (400, n), generator=g).to(dtype)
    x[torch.rand(400, n, generator=g) < 0.25] = float("nan")
    x[torch.rand(400, n, generator=g) < 0.15] = -0.0
    x[0] = float("nan")  # a row of NaNs
    cpu = x.mode(1)
    tpu = x.to("tpu").mode(1)
    values = tpu.values.cpu()
    assert torch.equal(values.isnan(), cpu.values.isnan())
    assert torch.equal(values.nan_to_num(), cpu.values.nan_to_num())
    assert torch.equal(values.signbit(), cpu.values.signbit())
    assert torch.equal(tpu.indices.cpu(), cpu.indices)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int64, torch.float16,
                                   torch.float32, torch.float64])
def test_hash_tensor_as_cpu(dtype):
    # was not lowered (NotImplementedError)
    def run(dev):
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(5, 3, 4, generator=g) * 3).to(dtype).to(dev)
        hs = [torch.hash_tensor(x), torch.hash_tensor(x, 0), torch.hash_tensor(x, [0, 2]),
              torch.hash_tensor(x, 1, keepdim=True), torch.hash_tensor(x[0, 0, 0])]
        return [h.view(torch.int64) for h in hs]  # uint64 compares as its bits

    _same_values(run)


def test_searchsorted_warns_once_for_non_contiguous_inputs_as_cpu():
    # CPU's once-per-program performance warnings; a fresh process for each device
    import subprocess
    import sys

    code = (
        "import warnings, torch, torchtpu\n"
        "v = torch.tensor([[[1, 3, 5], [2, 4, 6]], [[1, 2, 3], [4, 5, 6]]], device=DEV)\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    for _ in range(2):\n"
        "        torch.searchsorted(v.permute(2, 1, 0).double(), v.permute(2, 1, 0).int())\n"
        "print([str(m.message).split(' (Triggered')[0] for m in w if 'contiguous' in str(m.message)])\n")
    out = [subprocess.run([sys.executable, "-c", code.replace("DEV", repr(dev))],
                          capture_output=True, text=True, timeout=300).stdout
           for dev in ("cpu", "tpu")]
    assert "non-contiguous" in out[0]
    assert out[1] == out[0]


@pytest.mark.parametrize("dtype,out_int32", [(torch.float32, False), (torch.int32, False),
                                             (torch.int64, True)])
def test_searchsorted_out_of_the_wrong_dtype_raises_as_cpu(dtype, out_int32):
    # tpu cast the indices into out
    def run(dev):
        v = torch.arange(1, 10, device=dev)
        torch.searchsorted(v, v, out=v.to(dtype), out_int32=out_int32)

    _same_error(run)


def test_searchsorted_sorter_must_be_long_as_cpu():
    # tpu converted a float sorter to indices
    def run(dev):
        seq = torch.tensor([3.0, 1.0, 2.0], device=dev)
        torch.searchsorted(seq, seq, sorter=torch.tensor([1.0, 2.0, 0.0], device=dev))

    _same_error(run)

    def ok(dev):
        seq = torch.tensor([3.0, 1.0, 2.0], device=dev)
        return (torch.searchsorted(seq, seq, sorter=torch.tensor([1, 2, 0], device=dev)),)

    _same_values(ok)


@pytest.mark.parametrize("op", ["all", "any"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_all_any_over_an_empty_dim_list_reduce_nothing_as_cpu(op, keepdim):
    # tpu reduced every dim (and then failed its shape check)
    def run(dev):
        x = torch.tensor([[1.0, 0.0], [2.0, 3.0]], device=dev)
        return (getattr(torch, op)(x, dim=[], keepdim=keepdim),
                getattr(torch, op)(x.to(torch.uint8), dim=[], keepdim=keepdim))

    _same_values(run)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin_over_a_dim_of_more_than_64_dims_raises_as_cpu(op):
    def run(dev):
        getattr(torch, op)(torch.ones([1] * 65, device=dev), dim=0)

    _same_error(run)


# ---------------------------------------------------------------------------------------
# found by the session-6 fresh-clone break attempts (executor cache key)


def test_constant_float_arguments_signed_zero_and_nan_as_cpu(eager_mode, fresh_shape_buckets):
    """A float argument compiled into the executable is keyed by its value: -0.0 and 0.0
    compare equal, so ``nan_to_num(x, nan=0.0)`` after ``nan=-0.0`` reused the -0.0
    executable (CPU: +0.0); NaN compares unequal to itself, so every call with
    ``posinf=nan`` compiled again."""
    import torchtpu

    x = torch.tensor([float("nan"), 1.0, float("inf")])
    for nan in (-0.0, 0.0, -0.0):
        got = torch.nan_to_num(x.to("tpu"), nan=nan).cpu()
        want = torch.nan_to_num(x, nan=nan)
        assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit()), nan
    torchtpu.reset_metrics()
    for _ in range(3):
        got = torch.nan_to_num(x.to("tpu"), nan=2.0, posinf=float("nan")).cpu()
    want = torch.nan_to_num(x, nan=2.0, posinf=float("nan"))
    assert torch.equal(got.isnan(), want.isnan()) and got[1] == want[1]
    assert torchtpu.metrics()["cache_misses"] <= 1


def test_negative_index_raises_in_index_select_add_copy_as_cpu():
    """CPU's ``index_select``, ``index_add`` and ``index_copy`` reject a negative index
    (IndexError); tpu wrapped it around and returned the last row.  ``index_fill`` wraps
    on both."""
    idx = torch.tensor([0, -1])
    cases = {
        "index_select": lambda d: torch.arange(4.0, device=d).index_select(0, idx.to(d)),
        "index_add": lambda d: torch.zeros(4, device=d).index_add(0, idx.to(d),
                                                                  torch.ones(2, device=d)),
        "index_copy": lambda d: torch.zeros(4, device=d).index_copy(0, idx.to(d),
                                                                    torch.ones(2, device=d)),
        "index_select dim 1": lambda d: torch.ones(2, 4, device=d).index_select(1, idx.to(d)),
    }
    for name, f in cases.items():
        with pytest.raises((IndexError, RuntimeError)) as cpu_err:
            f("cpu")
        with pytest.raises(cpu_err.type):
            f("tpu").cpu()
    fill = lambda d: torch.zeros(4, device=d).index_fill(0, idx.to(d), 1.0)  # noqa: E731
    assert torch.equal(fill("tpu").cpu(), fill("cpu"))


# --- searchsorted follows CPU's binary search step for step (NaN in the boundaries) ---

@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_with_nan_in_boundaries_as_cpu(right, eager_mode):
    nan, inf = float("nan"), float("inf")
    queries = torch.tensor([2.5, 4, inf, nan, -1.0, -inf, 1, 2, 3])
    for seq in ([1, 2, 2, 3, nan], [nan, 1.0, 2.0], [nan, nan], [3.0, 1, 2, 5, 4]):
        s = torch.tensor(seq)
        want = torch.searchsorted(s, queries, right=right)
        got = torch.searchsorted(s.to("tpu"), queries.to("tpu"), right=right)
        assert torch.equal(got.cpu(), want), (seq, got, want)


def test_searchsorted_batched_with_sorter_and_nans_as_cpu():
    g = torch.Generator().manual_seed(3)
    s = torch.randint(-5, 5, (4, 17), generator=g).double()
    s[torch.rand(s.shape, generator=g) < 0.15] = float("nan")
    v = torch.randint(-6, 6, (4, 9), generator=g).double()
    sorter = torch.argsort(torch.rand(s.shape, generator=g), -1)
    for right in (False, True):
        want = torch.searchsorted(s, v, right=right, sorter=sorter)
        got = torch.searchsorted(s.to("tpu"), v.to("tpu"), right=right, sorter=sorter.to("tpu"))
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("sorter", [[0, 1, 5], [0, -1, 2]])
def test_searchsorted_sorter_out_of_range_raises_as_cpu(sorter):
    s, v = torch.tensor([1.0, 2, 3]), torch.tensor([2.5])
    with pytest.raises(RuntimeError, match="sorter index out of range"):
        torch.searchsorted(s, v, sorter=torch.tensor(sorter))
    with pytest.raises(RuntimeError, match="sorter index out of range"):
        # a device-side check: raised at the next sync point
        torch.searchsorted(s.to("tpu"), v.to("tpu"), sorter=torch.tensor(sorter).to("tpu")).cpu()


@pytest.mark.parametrize("correction", [-2, -1, 0, 1])
def test_var_of_nothing_is_nan_for_every_correction(correction):
    for shape, dim in (((0,), None), ((3, 0), 1)):
        x = torch.empty(shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for fn in (torch.var, torch.std):
                want = fn(x, dim=dim, correction=correction)
                got = fn(x.to("tpu"), dim=dim, correction=correction).cpu()
                torch.testing.assert_close(got, want, equal_nan=True)
            want_v, want_m = torch.var_mean(x, dim=dim, correction=correction)
            got_v, got_m = torch.var_mean(x.to("tpu"), dim=dim, correction=correction)
            torch.testing.assert_close(got_v.cpu(), want_v, equal_nan=True)
            torch.testing.assert_close(got_m.cpu(), want_m, equal_nan=True)


@pytest.mark.parametrize("fn, z", [
    (torch.log1p, -1 + 1e-30j), (torch.atanh, 1 + 1e-30j), (torch.atanh, -1 - 1e-30j),
    (torch.atan, 1e-30 + 1j), (torch.atan, -1e-30 - 1j), (torch.log1p, 0.3 - 0.2j),
    (torch.log1p, 3 + 4j), (torch.atanh, 0.2 + 0.1j), (torch.atan, 0.2 + 0.1j),
])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_log1p_atan_atanh_near_their_poles_as_cpu(fn, z, dtype):
    # |1 + z| or |1 -+ iz| tiny: its square underflows in complex64 (XLA gave inf)
    x = torch.tensor([z], dtype=dtype)
    want = fn(x)
    got = fn(x.to("tpu")).cpu()
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want)


# --- index_add / index_reduce: CPU's argument checks that PyTorch's meta kernels skip ---

@pytest.mark.parametrize("fn", ["index_add", "index_reduce"])
@pytest.mark.parametrize("self_shape, dim, n_index, source_shape", [
    ((6, 8), 1, 2, (1, 2)),   # a source that would broadcast
    ((6, 8), 0, 2, (2, 1)),
    ((5,), 0, 1, ()),         # 1-d self, 0-d source
    ((), 0, 1, (1,)),         # 0-d self, 1-d source
    ((), -1, 2, (2, 1)),
    ((2, 3), 1, 1, ()),       # dim past a 0-d source
    ((), 1, 1, ()),           # dim out of range for a 0-d self
    ((), 0, 2, ()),
    ((), 0, 2, (1,)),
    ((6, 8), 0, 2, (2, 8)),   # valid
    ((), 0, 1, ()),           # valid
    ((5,), 0, 1, (1,)),       # valid
])
def test_index_add_and_reduce_check_arguments_as_cpu(fn, self_shape, dim, n_index, source_shape):
    x = torch.zeros(self_shape)
    idx = torch.zeros(n_index, dtype=torch.long)
    src = torch.ones(source_shape)

    def run(x, idx, src):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if fn == "index_reduce":
                return x.index_reduce(dim, idx, src, "amax")
            return x.index_add(dim, idx, src)

    try:
        want = run(x, idx, src)
    except Exception as e:  # noqa: BLE001 - the CPU error is the expected one
        with pytest.raises(type(e)) as got:
            run(x.to("tpu"), idx.to("tpu"), src.to("tpu")).cpu()
        assert str(got.value) == str(e)
    else:
        assert torch.equal(run(x.to("tpu"), idx.to("tpu"), src.to("tpu")).cpu(), want)


@pytest.mark.parametrize("case", ["0-d boundaries", "0-d boundaries, scalar value",
                                  "2-d boundaries, scalar value", "complex", "bool",
                                  "bucketize bool"])
def test_searchsorted_argument_errors_as_cpu(case):
    def run(d):
        if case == "0-d boundaries":
            return torch.searchsorted(torch.tensor(1.0, device=d), torch.tensor([0.5], device=d))
        if case == "0-d boundaries, scalar value":
            return torch.searchsorted(torch.tensor(1.0, device=d), 0.5)
        if case == "2-d boundaries, scalar value":
            return torch.searchsorted(torch.ones(2, 2, device=d), 0.5)
        if case == "complex":
            return torch.searchsorted(torch.tensor([1.0, 2.0], device=d),
                                      torch.tensor([1j], device=d))
        if case == "bool":
            return torch.searchsorted(torch.tensor([False, True], device=d),
                                      torch.tensor([True], device=d))
        return torch.bucketize(torch.tensor([True], device=d),
                               torch.tensor([False, True], device=d))

    with pytest.raises(Exception) as cpu_err:
        run("cpu")
    with pytest.raises(type(cpu_err.value)) as tpu_err:
        run("tpu").cpu()
    # CPU's dtype error names its kernel ("searchsorted_out_cpu"); ours names tpu's
    assert str(tpu_err.value) == str(cpu_err.value).replace("_cpu", "_tpu")


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_log1p_keeps_the_sign_of_a_negative_zero_imaginary_part(dtype):
    x = torch.tensor([complex(-2, -0.0), complex(-1e30, -0.0), complex(-1.5, 0.0),
                      complex(-1.5, -0.0)], dtype=dtype)
    torch.testing.assert_close(torch.log1p(x.to("tpu")).cpu(), torch.log1p(x))


def test_tensors_stay_usable_when_a_device_check_raises_after_a_donating_op():
    x = torch.zeros(5, device="tpu")
    y_t = torch.zeros(5, device="tpu")
    good, one = torch.tensor([0, 4]), torch.ones(2)
    calls = 0
    with pytest.raises(IndexError, match="index out of range"):
        # reported later (DEBUG: at this op, and then the loop does not run)
        x.index_add_(0, torch.tensor([0, 7], device="tpu"), one.to("tpu"))
        for _ in range(400):  # y's signature donates; the pending check fires in a call
            calls += 1
            y_t.index_add_(0, good.to("tpu"), one.to("tpu"))
        torch.tpu.synchronize()  # DEFER_AND_FUSE reports device checks at a sync point
    y_c = torch.zeros(5).index_add_(0, good, one * calls)
    assert torch.equal(y_t.cpu(), y_c)  # y kept its array, and the call that raised ran


def test_constant_zero_and_nan_scalars_reach_lowerings_as_floats():
    """A constant Scalar argument of 0.0, -0.0 or NaN is keyed by its repr (so -0.0 and
    0.0 get their own executables); the lowering must still get the float, not the key
    (``torch.arange(0.0, 16)`` raised TypeError: test_indexing's test_advancedindex,
    test_byte_tensor_assignment, test_broadcast_subspace)."""
    for args in [(0.0, 16), (-0.0, 5), (0.0, 3.5, 0.5), (0.0, 1.0, 0.25)]:
        got, want = torch.arange(*args, device="tpu"), torch.arange(*args)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)
    x = torch.tensor([float("nan"), 1.0, -2.0, 0.0])
    for fn in (lambda t: torch.nan_to_num(t, nan=-0.0), lambda t: torch.nan_to_num(t, nan=0.0),
               lambda t: torch.full_like(t, float("nan")), lambda t: t.add(1, alpha=0.0)):
        got, want = fn(x.to("tpu")).cpu(), fn(x)
        torch.testing.assert_close(got, want, equal_nan=True)
        assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_out_resize_warns_once_at_the_callers_line_as_cpu():
    """An out= tensor of another shape with elements is resized with one warning at the
    caller's line on CPU; tpu gave two on the first call (PyTorch's reference warning
    from the meta computation, then ours), both pointing inside torch/torchtpu."""
    a = torch.randn(4, 5)

    def warned(dev):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            o = torch.empty(3, device=dev)
            torch.add(a.to(dev), 1, out=o)
            s = torch.empty(2, device=dev)
            torch.sum(a.to(dev), 0, out=s)
        got = [(x.filename, str(x.message).split(" (")[0]) for x in w if "resized" in str(x.message)]
        return got, o.cpu(), s.cpu()

    cpu, tpu = warned("cpu"), warned("tpu")
    assert [f for f, _ in tpu[0]] == [f for f, _ in cpu[0]] == [__file__, __file__]
    torch.testing.assert_close(tpu[1], cpu[1])
    torch.testing.assert_close(tpu[2], cpu[2])


@pytest.mark.parametrize("case", ["scalar_two_indices", "scalar_bad_index", "float_index",
                                  "matrix_index", "float_matrix_index"])
def test_index_select_argument_errors_as_cpu(case):
    """(helper-18) index_select returned values where CPU raises: a 0-d self with two
    indices or a non-zero one, a float index, a 2-D index."""
    def run(d):
        if case == "scalar_two_indices":
            return torch.tensor(5.0, device=d).index_select(0, torch.tensor([0, 1], device=d))
        if case == "scalar_bad_index":
            return torch.tensor(5.0, device=d).index_select(0, torch.tensor([-1], device=d))
        idx = {"float_index": [1.7], "matrix_index": [[1]], "float_matrix_index": [[1.5]]}[case]
        return torch.ones(3, 2, device=d).index_select(0, torch.tensor(idx, device=d))

    with pytest.raises((IndexError, RuntimeError)) as cpu_err:
        run("cpu")
    with pytest.raises(cpu_err.type) as tpu_err:
        run("tpu").cpu()
    assert str(tpu_err.value).split(" (in ")[0] == str(cpu_err.value)
