"""Scalars that do not fit the tensor's dtype: CPU's checked ``Scalar::to<T>()`` raises
"value cannot be converted to type int8_t without overflow" where tpu used to store a
wrapped or saturated value (``fill_(300)`` on int8 gave 44).  Every case is run on CPU
and on tpu; the results (values, or exception type and message) must be equal.

Cases where CPU has no kernel at all (float8/bool ``clamp``, float8 ``masked_fill`` /
``index_fill``: NotImplementedError) are skipped: tpu computes those."""

import _budget
import pytest
import torch
import torch.nn.functional as F

import torchtpu  # noqa: F401  (registers the tpu device)

DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2, torch.bool]
VALUES = [300, -1, -256, 127.9, 128.0, float("nan"), float("inf"), 2.0 ** 63, 1e6, 70000,
          1e300, 449, True, 1 + 2j, 1 + 0j]


def _z(d, dt, n=3):
    return torch.zeros(n, dtype=dt, device=d)


def _setitem(t, i, v):
    t[i] = v
    return t


OPS = {
    "fill_": lambda d, dt, v: _z(d, dt).fill_(v),
    "fill_ numel 1": lambda d, dt, v: _z(d, dt, 1).fill_(v),
    "full": lambda d, dt, v: torch.full((3,), v, dtype=dt, device=d),
    "full_like": lambda d, dt, v: torch.full_like(_z(d, dt), v),
    "masked_fill": lambda d, dt, v: _z(d, dt).masked_fill(
        torch.tensor([True, False, True], device=d), v),
    "index_fill": lambda d, dt, v: _z(d, dt).index_fill(0, torch.tensor([1], device=d), v),
    "clamp": lambda d, dt, v: _z(d, dt).clamp(max=v),
    "clamp_min": lambda d, dt, v: _z(d, dt).clamp_min(v),
    "setitem": lambda d, dt, v: _setitem(_z(d, dt), 1, v),
    "scalar_tensor": lambda d, dt, v: torch.scalar_tensor(v, dtype=dt, device=d),
}


def _run(f, *args):
    try:
        r = f(*args)
    except Exception as e:  # noqa: BLE001 - the exception is the result compared
        return ("raise", type(e), str(e))
    r = r.cpu()
    if r.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16):
        r = r.float()
    return ("value", r.dtype, r)


def _same(cpu, tpu):
    if cpu[0] == "raise" and cpu[1] is NotImplementedError and "not implemented for" in cpu[2]:
        pytest.skip("CPU has no kernel for this dtype; tpu computes it")
    assert cpu[0] == tpu[0], (cpu, tpu)
    if cpu[0] == "raise":
        assert (cpu[1], cpu[2]) == (tpu[1], tpu[2])
    else:
        assert cpu[1] == tpu[1]
        torch.testing.assert_close(tpu[2], cpu[2], equal_nan=True, rtol=0, atol=0)


# every other dtype by default (CI's time budget: int8, int32, float16, float32, float8_e4m3fn,
# bool); every one with TORCHTPU_FULL_TESTS=1
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", _budget.every(DTYPES, 2), ids=str)
def test_fill_like_scalars_fit_as_on_cpu(op, dtype):
    for v in VALUES:
        cpu = _run(OPS[op], "cpu", dtype, v)
        if cpu[0] == "raise" and cpu[1] is NotImplementedError and "not implemented for" in cpu[2]:
            continue
        _same(cpu, _run(OPS[op], "tpu", dtype, v))


NN = {
    "threshold value": lambda d: F.threshold(_z(d, torch.int8), 1, 300),
    "threshold threshold": lambda d: F.threshold(_z(d, torch.int8), 300, 1),
    "hardtanh half": lambda d: F.hardtanh(_z(d, torch.half), -1e6, 1e6),
    "hardtanh int8": lambda d: F.hardtanh(_z(d, torch.int8), -300, 300),
    "leaky_relu slope": lambda d: F.leaky_relu(_z(d, torch.float32), 1e300),
    "addcmul value": lambda d: torch.addcmul(_z(d, torch.int8), _z(d, torch.int8),
                                             _z(d, torch.int8), value=300),
    "add alpha": lambda d: torch.add(_z(d, torch.int8), _z(d, torch.int8), alpha=300),
    "add alpha promoted": lambda d: torch.add(_z(d, torch.int8), 2.5, alpha=300),
    "index_put other dtype": lambda d: _z(d, torch.int8).index_put_(
        (torch.tensor([0], device=d),), torch.tensor(3, device=d)),
    "setitem float64 value": lambda d: _setitem(
        _z(d, torch.float32), torch.tensor([0], device=d),
        torch.tensor(3.0, dtype=torch.float64, device=d)),
    "int64 fill 2**63": lambda d: _z(d, torch.int64).fill_(2.0 ** 63),
    # kernels that read the Scalar in the compute type (float32 for float16): no error
    "addcmul value half": lambda d: torch.addcmul(_z(d, torch.half), _z(d, torch.half),
                                                  _z(d, torch.half), value=1e6),
    "addcmul value half 1e40": lambda d: torch.addcmul(_z(d, torch.half), _z(d, torch.half),
                                                       _z(d, torch.half), value=1e40),
    "leaky_relu half": lambda d: F.leaky_relu(_z(d, torch.half) - 1, 1e6),
    "threshold half": lambda d: F.threshold(_z(d, torch.half), 1e6, 2),
    "add alpha half": lambda d: torch.add(_z(d, torch.half), _z(d, torch.half), alpha=1e6),
}

_I = lambda d: torch.tensor([0, 2], device=d)  # noqa: E731
_M = lambda d, dt=torch.int8: torch.ones(2, 2, dtype=dt, device=d)  # noqa: E731
_B = lambda d, dt=torch.int8: torch.ones(2, 2, 2, dtype=dt, device=d)  # noqa: E731
_H = lambda d: torch.linspace(-0.9, 0.9, 6, device=d).half()  # noqa: E731
NN.update({
    "scatter value": lambda d: _z(d, torch.int8).scatter(0, _I(d), 300),
    "scatter value half": lambda d: _z(d, torch.half).scatter(0, _I(d), 1e6),
    "scatter value float into int": lambda d: _z(d, torch.int8).scatter(0, _I(d), 2.5),
    "scatter_ value reduce": lambda d: _z(d, torch.int8).scatter_(0, _I(d), 300, reduce="add"),
    "index_add alpha": lambda d: _z(d, torch.int8).index_add(0, _I(d), _z(d, torch.int8, 2),
                                                             alpha=300),
    "index_add alpha half": lambda d: _z(d, torch.half).index_add(
        0, _I(d), _z(d, torch.half, 2), alpha=1e6),
    "index_add float alpha int": lambda d: _z(d, torch.int32).index_add(
        0, _I(d), torch.full((2,), 3, dtype=torch.int32, device=d), alpha=2.5),
    "index_add negative float alpha int": lambda d: _z(d, torch.int32).index_add(
        0, _I(d), torch.full((2,), 3, dtype=torch.int32, device=d), alpha=-2.5),
    "index_add bool alpha": lambda d: _z(d, torch.bool).index_add(
        0, _I(d), torch.ones(2, dtype=torch.bool, device=d), alpha=300),
    "pow int8": lambda d: (_z(d, torch.int8) + 1).pow(300),
    "pow_ int8": lambda d: (_z(d, torch.int8) + 1).pow_(300),
    "pow uint8 negative": lambda d: (_z(d, torch.uint8) + 1).pow(-1),
    "pow half": lambda d: _H(d).pow(1e5),
    "pow bfloat16": lambda d: _H(d).bfloat16().pow(1e39),
    "pow float32 (read as double)": lambda d: (_z(d, torch.float32) + 1).pow(1e39),
    "pow int8 float exponent": lambda d: (_z(d, torch.int8) + 1).pow(2.5),
    "addmm beta": lambda d: torch.addmm(_M(d), _M(d), _M(d), beta=300),
    "addmm alpha": lambda d: torch.addmm(_M(d), _M(d), _M(d), alpha=300),
    "addmm alpha half (float compute)": lambda d: torch.addmm(
        _M(d, torch.half), _M(d, torch.half), _M(d, torch.half), alpha=1e6),
    "addmm alpha bfloat16 1e39": lambda d: torch.addmm(
        _M(d, torch.bfloat16), _M(d, torch.bfloat16), _M(d, torch.bfloat16), alpha=1e39),
    "addmm float alpha int64": lambda d: torch.addmm(
        _M(d, torch.long), _M(d, torch.long), _M(d, torch.long), alpha=2.5),
    "addmv alpha": lambda d: torch.addmv(_M(d)[0], _M(d), _M(d)[0], alpha=300),
    "addmv alpha half": lambda d: torch.addmv(_M(d, torch.half)[0], _M(d, torch.half),
                                              _M(d, torch.half)[0], alpha=1e6),
    "addr alpha": lambda d: torch.addr(_M(d), _M(d)[0], _M(d)[0], alpha=300),
    "addr alpha half": lambda d: torch.addr(_M(d, torch.half), _M(d, torch.half)[0],
                                            _M(d, torch.half)[0], alpha=1e6),
    "addbmm alpha": lambda d: torch.addbmm(_M(d), _B(d), _B(d), alpha=300),
    "addbmm beta half 1e39": lambda d: torch.addbmm(
        _M(d, torch.half), _B(d, torch.half), _B(d, torch.half), beta=1e39),
    "baddbmm beta": lambda d: torch.baddbmm(_B(d), _B(d), _B(d), beta=300),
    "hardshrink half": lambda d: F.hardshrink(_H(d), 1e6),
    "hardshrink bfloat16": lambda d: F.hardshrink(_H(d).bfloat16(), 1e39),
    "logit eps half": lambda d: torch.logit(_H(d), eps=1e6),
    "logit eps float 1e40": lambda d: torch.logit(_H(d).float(), eps=1e40),
    "linspace int8": lambda d: torch.linspace(0, 300, 5, dtype=torch.int8, device=d),
    "linspace int8 start": lambda d: torch.linspace(-300, 3, 5, dtype=torch.int8, device=d),
    "linspace default dtype 1e40": lambda d: torch.linspace(0, 1e40, 3, device=d),
    "linspace float64 1e40": lambda d: torch.linspace(0, 1e40, 3, dtype=torch.float64,
                                                      device=d),
    "logspace int8": lambda d: torch.logspace(0, 300, 5, dtype=torch.int8, device=d),
    "histc max": lambda d: torch.histc(torch.linspace(0, 1, 6, device=d), 10, 0, 1e40),
    "histc min": lambda d: torch.histc(torch.linspace(0, 1, 6, device=d), 10, -1e40, 1),
    "masked_fill tpu tensor value": lambda d: _z(d, torch.int8).masked_fill(
        torch.tensor([True, False, True], device=d), torch.tensor(300, device=d)),
    "masked_fill float tensor value into half": lambda d: _z(d, torch.half).masked_fill(
        torch.tensor([True, False, True], device=d), torch.tensor(1e6, device=d)),
    "masked_fill tensor value that fits": lambda d: _z(d, torch.int8).masked_fill(
        torch.tensor([True, False, True], device=d), torch.tensor(100, device=d)),
    "index_fill tpu tensor value": lambda d: _z(d, torch.int8).index_fill(
        0, _I(d), torch.tensor(300, device=d)),
})

# random ops: only the argument checks are compared (the values are random)
_U = lambda d, dt: torch.empty(3, dtype=dt, device=d)  # noqa: E731
RANDOM = {
    "uniform_ to half": lambda d: _U(d, torch.half).uniform_(0, 1e6),
    "uniform_ from half": lambda d: _U(d, torch.half).uniform_(-1e6, 0),
    "uniform_ to-from half": lambda d: _U(d, torch.half).uniform_(-6e4, 6e4),
    "uniform_ from > to": lambda d: _U(d, torch.float32).uniform_(1, 0),
    "uniform_ to bfloat16": lambda d: _U(d, torch.bfloat16).uniform_(0, 1e39),
    "uniform_ to float inf": lambda d: _U(d, torch.float32).uniform_(0, float("inf")),
    "uniform_ to float nan": lambda d: _U(d, torch.float32).uniform_(0, float("nan")),
    "uniform_ to-from double": lambda d: _U(d, torch.float64).uniform_(-1e308, 1e308),
    "uniform_ to complex64": lambda d: _U(d, torch.complex64).uniform_(0, 1e39),
    "random_ int8": lambda d: _U(d, torch.int8).random_(0, 300),
    "random_ int16 from": lambda d: _U(d, torch.int16).random_(-2 ** 62, 5),
    "random_ bool": lambda d: _U(d, torch.bool).random_(0, 2 ** 62),
    "random_ half": lambda d: _U(d, torch.half).random_(0, 2 ** 62),
    "random_ float32 beyond 2**24 (warns)": lambda d: _U(d, torch.float32).random_(0, 2 ** 30),
    "rrelu lower > upper": lambda d: F.rrelu(_H(d).float(), 0.5, 0.1, training=True),
}


@pytest.mark.parametrize("case", sorted(RANDOM))
def test_random_op_arguments_as_on_cpu(case):
    cpu, tpu = _run(RANDOM[case], "cpu"), _run(RANDOM[case], "tpu")
    assert cpu[0] == tpu[0], (cpu, tpu)
    if cpu[0] == "raise":
        assert (cpu[1], cpu[2]) == (tpu[1], tpu[2])
    else:
        assert (cpu[1], cpu[2].shape) == (tpu[1], tpu[2].shape)


COMPILED = {
    "fill_": (lambda x: x.clone().fill_(300), torch.int8),
    "fill_ fits": (lambda x: x.clone().fill_(100), torch.int8),
    "add alpha": (lambda x: torch.add(x, x, alpha=300), torch.int8),
    "pow negative": (lambda x: x.pow(-1), torch.int8),
    "clamp": (lambda x: x.clamp(0, 300), torch.int8),
    "masked_fill": (lambda x: x.masked_fill(x > 0, 300), torch.int8),
    "full_like": (lambda x: torch.full_like(x, 300), torch.int8),
    "full_like 2**63 into int64": (lambda x: torch.full_like(x, 2.0 ** 63), torch.int64),
    "addmm beta": (lambda x: torch.addmm(x, x, x, beta=300), torch.int8),
    "scatter value": (lambda x: x.scatter(0, torch.zeros_like(x, dtype=torch.long), 300),
                      torch.int8),
    "pow half": (lambda x: x.pow(1e5), torch.half),
}


@pytest.mark.parametrize("case", sorted(COMPILED))
def test_compiled_graph_checks_constant_scalars(case):
    """The same checks inside ``torch.compile(backend="tpu")`` graphs (constant Scalars
    are checked when the graph is built; the error is raised at each call, as eager)."""
    fn, dt = COMPILED[case]
    x = torch.ones(2, 2, dtype=dt)
    cpu = _run(fn, x)
    compiled = torch.compile(fn, backend="tpu", fullgraph=True)
    _same(cpu, _run(compiled, x.to("tpu")))
    _same(cpu, _run(compiled, x.to("tpu")))  # again: the cached graph raises too


@pytest.mark.parametrize("case", sorted(NN))
def test_other_scalar_arguments_as_on_cpu(case):
    _same(_run(NN[case], "cpu"), _run(NN[case], "tpu"))


def _outcome(f):
    try:
        r = f()
        return ("ok", r.cpu())
    except Exception as e:  # noqa: BLE001 - the exception type is what is compared
        return (type(e).__name__, None)


UNSIGNED_CASES = {
    "mul": lambda t, v: t * v,
    "add": lambda t, v: t + v,
    "rsub": lambda t, v: v - t,
    "lt": lambda t, v: t < v,
    "eq": lambda t, v: t == v,
    "div": lambda t, v: t / v,
    "floordiv": lambda t, v: t // v,
    "remainder": lambda t, v: torch.remainder(t, v),
    "pow": lambda t, v: t ** v,
    "clamp": lambda t, v: t.clamp(max=v),
    "bitand": lambda t, v: t & v,
    "where": lambda t, v: torch.where(t > 0, t, v),
    "full": lambda t, v: torch.full((2,), v, dtype=t.dtype, device=t.device),
    "fill_": lambda t, v: t.clone().fill_(v),
    "masked_fill": lambda t, v: t.masked_fill(torch.ones_like(t, dtype=torch.bool), v),
    "add_alpha": lambda t, v: t.add(t, alpha=v),
}


@pytest.mark.parametrize("case", list(UNSIGNED_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32,
                                   torch.uint8, torch.bool])
def test_python_ints_past_int64_as_cpu(case, dtype):
    """A Python int in [2**63, 2**64) is an unsigned 64-bit Scalar to PyTorch: CPU
    computes ``x * 2**63`` (9.2234e18 for float, a wrapped -2**63 for int64) or refuses to
    promote it with a bool tensor; tpu raised ``OverflowError`` converting it to int64.
    Three calls each (the first compiles, the next ones take the hot path)."""
    f = UNSIGNED_CASES[case]
    base = torch.tensor([1, 0, 3, 1]).to(dtype)
    for v in (2 ** 63, 2 ** 64 - 1, 2 ** 63 + 12345):
        want = _outcome(lambda: f(base, v))
        for _ in range(3):
            got = _outcome(lambda: f(base.to("tpu"), v))
            assert got[0] == want[0], (case, dtype, v, got, want)
            if got[0] == "ok":
                assert got[1].dtype == want[1].dtype and torch.equal(got[1], want[1]), (
                    case, dtype, v, got, want)
