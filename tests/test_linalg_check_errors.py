"""``check_errors=True`` of ``linalg.inv_ex`` / ``cholesky_ex`` / ``lu_factor_ex`` /
``solve_ex`` and the always-checking ``torch.cholesky``: on a singular or
non-positive-definite input PyTorch raises (naming the batch element); tpu returned values
instead, in eager and compiled.  Against CPU's exact error type and message."""

import warnings

import pytest
import torch

import torchtpu  # noqa: F401

TPU = "tpu"
SING = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
NOTPD = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
GOOD = torch.tensor([[4.0, 1.0], [1.0, 3.0]])

CASES = {
    "inv_ex": (lambda a: torch.linalg.inv_ex(a, check_errors=True)[0], SING),
    "cholesky_ex": (lambda a: torch.linalg.cholesky_ex(a, check_errors=True)[0], NOTPD),
    "cholesky_ex_upper": (lambda a: torch.linalg.cholesky_ex(a, upper=True,
                                                             check_errors=True)[0], NOTPD),
    "lu_factor_ex": (lambda a: torch.linalg.lu_factor_ex(a, check_errors=True)[0], SING * 0),
    "solve_ex": (lambda a: torch.linalg.solve_ex(a, a[..., :1], check_errors=True)[0], SING),
    "torch.cholesky": (lambda a: torch.cholesky(a), NOTPD),
}


def _call(fn, a):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.cholesky is deprecated
        return fn(a)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_check_errors_raises_cpus_error(name, batched, compiled):
    fn, bad = CASES[name]
    if name == "torch.cholesky" and not hasattr(torch.ops.aten, "cholesky"):
        pytest.skip("torch.cholesky is gone from this PyTorch")
    if batched:  # only the second matrix is bad: the error names batch element 1
        bad = torch.stack([GOOD, bad])
    f = torch.compile(fn, backend="tpu", fullgraph=True) if compiled else fn
    with pytest.raises(Exception) as cpu:
        _call(fn, bad)
    with pytest.raises(type(cpu.value)) as tpu:
        _call(f, bad.to(TPU))
    assert str(tpu.value) == str(cpu.value)
    # a good input passes the check and matches CPU
    good = torch.stack([GOOD, GOOD]) if batched else GOOD
    torch.testing.assert_close(_call(f, good.to(TPU)).cpu(), _call(fn, good))


def test_without_check_errors_the_info_is_returned():
    bad = torch.stack([GOOD, SING])
    for fn in (lambda a: torch.linalg.inv_ex(a)[1],
               lambda a: torch.linalg.lu_factor_ex(a)[2],
               lambda a: torch.linalg.cholesky_ex(torch.stack([GOOD, NOTPD]).to(a.device))[1]):
        want = fn(bad)
        assert torch.equal(fn(bad.to(TPU)).cpu(), want)
        assert torch.equal(torch.compile(fn, backend="tpu")(bad.to(TPU)).cpu(), want)


def test_out_form_checks_too():
    out = (torch.empty(2, 2, device=TPU), torch.empty((), dtype=torch.int32, device=TPU))
    with pytest.raises(torch.linalg.LinAlgError, match="^linalg.inv_ex: The diagonal"):
        torch.linalg.inv_ex(SING.to(TPU), check_errors=True, out=out)
