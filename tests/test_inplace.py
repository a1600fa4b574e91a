"""In-place ops reach their own tpu kernels: values and CPU's errors (type and text)."""

import pytest
import torch

CASES = {
    "long.mul_(1.5)": lambda d: torch.ones(3, dtype=torch.long, device=d).mul_(1.5),
    "long.add_(float)": lambda d: torch.ones(3, dtype=torch.long, device=d).add_(
        torch.ones(3, device=d)),
    "bool.add_(1)": lambda d: torch.ones(3, dtype=torch.bool, device=d).add_(1),
    "mul_ broadcast grows self": lambda d: torch.ones(3, device=d).mul_(
        torch.ones(2, 3, device=d)),
    "int.div_(2)": lambda d: torch.ones(3, dtype=torch.int32, device=d).div_(2),
    "long.pow_(0.5)": lambda d: torch.ones(3, dtype=torch.long, device=d).pow_(0.5),
    "lerp_": lambda d: torch.arange(3.0, device=d).lerp_(torch.zeros(3, device=d), 0.3),
    "half.add_(float)": lambda d: torch.ones(3, dtype=torch.float16, device=d).add_(
        torch.full((3,), 0.1, device=d)),
    "addcdiv_": lambda d: torch.arange(3.0, device=d).addcdiv_(
        torch.ones(3, device=d), torch.full((3,), 2.0, device=d), value=0.5),
    "clamp_": lambda d: torch.arange(3.0, device=d).clamp_(0.5, 1.5),
    "complex.mul_": lambda d: torch.ones(3, dtype=torch.complex64, device=d).mul_(1j),
    "mul_ through a view": lambda d: torch.arange(6.0, device=d).view(2, 3).t().mul_(
        torch.tensor([1.0, 2.0], device=d)).t().contiguous(),
    # memory overlap between the written tensor and an input: CPU refuses
    "add_ partial overlap": lambda d: (lambda x: x[1:].add_(x[:-1]))(
        torch.arange(5.0, device=d)),
    "mul_ into expanded": lambda d: torch.ones(1, device=d).expand(3).mul_(2),
    "add_ transposed self": lambda d: (lambda x: x.add_(x.t()))(
        torch.arange(9.0, device=d).view(3, 3)),
    "eq_ broadcast grows self": lambda d: torch.ones(5, 1, device=d).eq_(
        torch.ones(5, device=d)),
    "out= aliasing an input cannot grow": lambda d: (lambda x: torch.mul(
        x, torch.arange(3.0, device=d), out=x))(torch.ones(3, 1, device=d)),
    "long lerp": lambda d: torch.ones(3, dtype=torch.long, device=d).lerp_(
        torch.zeros(3, dtype=torch.long, device=d), 0.5),
    "long fmod broadcast": lambda d: torch.fmod(
        torch.arange(250, device=d).view(5, 10, 5) + 7,
        torch.arange(1, 51, device=d).view(10, 5)),
}


def _outcome(f, device):
    try:
        return "ok", f(device).cpu()
    except Exception as e:  # the error is part of the behaviour under test
        return type(e).__name__, str(e).split("\n")[0]


@pytest.mark.parametrize("name", list(CASES))
def test_inplace_matches_cpu(name, eager_mode):
    cpu = _outcome(CASES[name], "cpu")
    tpu = _outcome(CASES[name], "tpu")
    assert cpu[0] == tpu[0], (cpu, tpu)
    if cpu[0] == "ok":
        assert tpu[1].dtype == cpu[1].dtype
        assert torch.equal(tpu[1], cpu[1]), (cpu[1], tpu[1])
    else:
        assert tpu[1] == cpu[1]
