"""A lowering that returns another number of outputs than PyTorch's meta kernel gives is
an internal error naming the op and both counts, never a silently truncated (or padded)
result (project issue 27).  Private test ops (``torchtpu_issue27::*``) with a CPU kernel,
a fake kernel giving two outputs, and lowerings registered in the table for the test."""

import pytest
import torch

from torchtpu import ops

TPU = "tpu"

_lib = torch.library.Library("torchtpu_issue27", "DEF")
for _name in ("two_ok", "two_too_few", "two_too_many", "two_too_few_c", "two_too_many_c"):
    _lib.define(f"{_name}(Tensor x) -> (Tensor, Tensor)")
    _lib.impl(_name, lambda x: (x * 2, x + 1), "CPU")
    torch.library.register_fake(f"torchtpu_issue27::{_name}",
                                lambda x: (torch.empty_like(x), torch.empty_like(x)),
                                lib=_lib)

_LOWERINGS = {
    "two_ok": lambda x: (x * 2, x + 1),
    "two_too_few": lambda x: x * 2,
    "two_too_many": lambda x: (x * 2, x + 1, x - 1),
    "two_too_few_c": lambda x: (x * 2,),
    "two_too_many_c": lambda x: [x * 2, x + 1, x - 1],
}


def _op(name):
    return getattr(torch.ops.torchtpu_issue27, name).default


@pytest.fixture(autouse=True)
def lowerings(monkeypatch):
    table = ops.table()
    for name, fn in _LOWERINGS.items():
        monkeypatch.setitem(table, _op(name), ops.Lowering(fn))
    yield


def _call(name, x):
    return getattr(torch.ops.torchtpu_issue27, name)(x)


def _x():
    return torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7


def test_right_count_matches_cpu(strict_mode, no_stored_executables):
    x = _x()
    got, want = _call("two_ok", x.to(TPU)), _call("two_ok", x)
    assert len(got) == len(want) == 2
    for a, b in zip(got, want):
        assert a.device.type == TPU
        torch.testing.assert_close(a.cpu(), b)


@pytest.mark.parametrize("name,n", [("two_too_few", 1), ("two_too_many", 3)])
def test_wrong_count_raises_in_eager(name, n, strict_mode, no_stored_executables):
    with pytest.raises(RuntimeError) as e:
        _call(name, _x().to(TPU))
    msg = str(e.value)
    assert f"torchtpu_issue27.{name}" in msg
    assert f"returned {n} output" in msg and "meta kernel gives 2" in msg


@pytest.mark.parametrize("name,n", [("two_too_few_c", 1), ("two_too_many_c", 3)])
def test_wrong_count_raises_in_compiled_graph(name, n, no_stored_executables):
    torch._dynamo.reset()

    def fn(x):
        a, b = _call(name, x)
        return a + b

    f = torch.compile(fn, backend="tpu", fullgraph=True)
    try:
        with pytest.raises(Exception) as e:
            f(_x().to(TPU))
    finally:
        torch._dynamo.reset()
    msg = str(e.value)
    assert f"torchtpu_issue27.{name}" in msg
    assert f"returned {n} output" in msg and "meta kernel gives 2" in msg
