"""First calls of constant factories are made on the host (torchtpu.eager.host_fills): no
XLA compile, no host sync; values, dtypes, shapes and strides equal CPU PyTorch's, and the
signature's second call runs the compiled executable with the same result."""

import numpy as np
import pytest
import torch

import torchtpu
from torchtpu.eager import buckets, executables, host_fills

pytestmark = pytest.mark.usefixtures("strict_mode")

X = torch.randn(3, 4)

CASES = [
    lambda d: torch.zeros(3, 5, device=d),
    lambda d: torch.ones(7, dtype=torch.int32, device=d),
    lambda d: torch.full((2, 2), 7, device=d),  # int64, inferred as on CPU
    lambda d: torch.full((2,), True, device=d),
    lambda d: torch.full((3,), 1.1, dtype=torch.bfloat16, device=d),
    lambda d: torch.full((4,), -0.0, dtype=torch.float64, device=d),
    lambda d: torch.full((0, 3), 2.5, device=d),
    lambda d: torch.zeros_like(X.to(d)),
    lambda d: torch.ones_like(X.to(d), dtype=torch.float64),
    lambda d: torch.full_like(X.to(d), float("-inf")),
    lambda d: torch.scalar_tensor(3, device=d),
    lambda d: torch.scalar_tensor(True, dtype=torch.bool, device=d),
]


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
    an, bn = a.cpu(), b
    if an.dtype == torch.bfloat16:
        an, bn = an.view(torch.int16), bn.view(torch.int16)
    assert np.array_equal(an.numpy(), bn.numpy())
    if an.dtype.is_floating_point:
        assert np.array_equal(np.signbit(an.numpy()), np.signbit(bn.numpy()))


@pytest.fixture
def fresh():
    """No executable built yet, no op churning through shapes (a churning factory's new
    sizes are made padded by shape buckets instead: eager.buckets)."""
    executables.CACHE.clear()
    buckets.set_policy()
    host_fills.set_enabled(True)
    yield
    host_fills.set_enabled(True)
    buckets.set_policy()


@pytest.mark.parametrize("k", range(len(CASES)))
def test_first_call_on_the_host_second_compiled_both_as_cpu(fresh, k):
    make = CASES[k]
    want = make("cpu")
    m0 = torchtpu.metrics()
    first = make("tpu")
    m1 = torchtpu.metrics()
    assert m1["host_fills"]["runs"] == m0["host_fills"]["runs"] + 1
    assert m1["cache_misses"] == m0["cache_misses"]  # (no executable built or loaded)
    assert sum(m1["host_syncs"].values()) == sum(m0["host_syncs"].values())
    _same(first, want)
    second = make("tpu")
    m2 = torchtpu.metrics()
    assert m2["host_fills"]["runs"] == m1["host_fills"]["runs"]  # compiled now
    _same(second, want)
    _same(first + second, want + want)  # both are ordinary device arrays


def test_not_covered_calls_take_the_compiled_path(fresh):
    """A ``_like`` of a non-contiguous tensor (PyTorch preserves its strides), a result
    over MAX_BYTES and a value PyTorch refuses are not host fills; they behave as CPU."""
    xt = X.to("tpu").t()
    r0 = torchtpu.metrics()["host_fills"]["runs"]
    z = torch.zeros_like(xt)
    assert z.stride() == torch.zeros_like(X.t()).stride()
    big = torch.ones(host_fills.MAX_BYTES // 4 + 1, device="tpu")
    assert torchtpu.metrics()["host_fills"]["runs"] == r0
    assert float(big.sum()) == host_fills.MAX_BYTES // 4 + 1
    with pytest.raises(RuntimeError) as cpu_err:
        torch.full((2,), 300, dtype=torch.uint8)
    with pytest.raises(RuntimeError) as tpu_err:
        torch.full((2,), 300, dtype=torch.uint8, device="tpu").cpu()
    assert "overflow" in str(cpu_err.value) and "overflow" in str(tpu_err.value)


def test_off_switch(fresh):
    host_fills.set_enabled(False)
    r0 = torchtpu.metrics()["host_fills"]["runs"]
    c0 = torchtpu.metrics()["cache_misses"]
    _same(torch.full((5, 3), 4.0, device="tpu"), torch.full((5, 3), 4.0))
    assert torchtpu.metrics()["host_fills"]["runs"] == r0
    assert torchtpu.metrics()["cache_misses"] == c0 + 1  # (compiled, or loaded from disk)
