"""Scalars that do not fit the tensor's dtype: CPU's checked ``Scalar::to<T>()`` raises
"value cannot be converted to type int8_t without overflow" where tpu used to store a
wrapped or saturated value (``fill_(300)`` on int8 gave 44).  Every case is run on CPU
and on tpu; the results (values, or exception type and message) must be equal.

Cases where CPU has no kernel at all (float8/bool ``clamp``, float8 ``masked_fill`` /
``index_fill``: NotImplementedError) are skipped: tpu computes those."""

import pytest
import torch
import torch.nn.functional as F

import torchtpu  # noqa: F401

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


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
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


@pytest.mark.parametrize("case", sorted(NN))
def test_other_scalar_arguments_as_on_cpu(case):
    _same(_run(NN[case], "cpu"), _run(NN[case], "tpu"))
