"""``x[mask] = values`` in a compiled graph when the graph compiler cannot tell from the
graph's fake tensors whether the value's size must equal the mask's count (project issue
27): the node runs eagerly, where CPU's "shape mismatch" check is made on the actual
count, instead of being compiled without the check."""

import pytest
import torch

import torchtpu
from torchtpu.compile import staged
from torchtpu.ops import indexing

TPU = "tpu"


pytestmark = pytest.mark.usefixtures("capture_data_dependent_ops")


def _index_put_node():
    """An FX ``index_put(x, [mask], v)`` node whose inputs carry fake tensors, as
    AOTAutograd's graphs do (``meta["val"]``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    g = torch.fx.Graph()
    x, m, v = g.placeholder("x"), g.placeholder("m"), g.placeholder("v")
    x.meta["val"] = mode.from_tensor(torch.zeros(3))
    m.meta["val"] = mode.from_tensor(torch.zeros(3, dtype=torch.bool))
    v.meta["val"] = mode.from_tensor(torch.zeros(3))
    return g.call_function(torch.ops.aten.index_put.default, (x, [m], v))


def _undecidable(monkeypatch):
    """``mask_count_decides`` raising on fake tensors (as on sizes it cannot compare), and
    answering as before on real tensors (eager's own check)."""
    from torch._subclasses.fake_tensor import FakeTensor

    real = indexing.mask_count_decides

    def raising(x, indices, values):
        if isinstance(x, FakeTensor):
            raise RuntimeError("cannot decide on these sizes")
        return real(x, indices, values)

    monkeypatch.setattr(indexing, "mask_count_decides", raising)


def test_undecided_mask_count_means_eager(monkeypatch):
    n = _index_put_node()
    assert staged._mask_count_decides(n) is True  # (a value of 3 depends on the count)
    assert staged.is_sync_node(n)
    _undecidable(monkeypatch)
    assert staged._mask_count_decides(n) is True
    assert staged.is_sync_node(n)


def test_undecided_masked_assignment_matches_cpu(monkeypatch):
    _undecidable(monkeypatch)

    def put(x, v):
        x[x > 0] = v
        return x * 1

    f = torch.compile(put, backend="tpu", fullgraph=True)
    x, bad, good = torch.tensor([1.0, -1.0, 2.0]), torch.tensor([10.0, 20.0, 30.0]), \
        torch.tensor([10.0, 20.0])
    before = torchtpu.metrics()["compile"]["eager_stages"]
    with pytest.raises(RuntimeError) as cpu:
        put(x.clone(), bad)
    with pytest.raises(RuntimeError) as tpu:
        f(x.clone().to(TPU), bad.to(TPU))
    assert str(tpu.value) == str(cpu.value)
    torch.testing.assert_close(f(x.clone().to(TPU), good.to(TPU)).cpu(), put(x.clone(), good))
    assert torchtpu.metrics()["compile"]["eager_stages"] > before


def test_unbacked_value_size_matches_cpu(monkeypatch):
    """The case that reaches the undecided path in practice: the value's size is read from
    tensor values (``y[y > 0]``: an unbacked size ``u0``), so ``u0 == 1`` cannot be
    decided on the fake tensors."""
    real, raised = indexing.mask_count_decides, []

    def spy(x, indices, values):
        try:
            return real(x, indices, values)
        except Exception as e:
            raised.append(e)
            raise

    monkeypatch.setattr(indexing, "mask_count_decides", spy)

    def put(x, y):
        x[x > 0] = y[y > 0]
        return x * 1

    f = torch.compile(put, backend="tpu", fullgraph=True)
    x = torch.tensor([1.0, -1.0, 2.0])
    bad, good = torch.tensor([5.0, 6.0, 7.0]), torch.tensor([5.0, -6.0, 7.0])
    with pytest.raises(RuntimeError) as cpu:
        put(x.clone(), bad)
    with pytest.raises(RuntimeError) as tpu:
        f(x.clone().to(TPU), bad.to(TPU))
    assert str(tpu.value) == str(cpu.value)
    torch.testing.assert_close(f(x.clone().to(TPU), good.to(TPU)).cpu(), put(x.clone(), good))
    assert raised  # (the premise: the fake tensors' sizes could not be compared)


@pytest.mark.parametrize("mask", [[True, False, True], [[True, False]], [[[True]]]],
                         ids=["length", "rows", "too_many_dims"])
def test_compiled_mask_of_the_wrong_shape_raises_cpus_index_error(mask):
    # was: RuntimeError from the lowering's broadcasting (eager checks the mask's shape on
    # the host; a compiled graph's node reached the lowering without that check)
    def f(x, m):
        x[m] = 0
        return x

    m = torch.tensor(mask)
    with pytest.raises(IndexError) as cpu:
        f(torch.arange(6.0).view(2, 3), m)
    torch._dynamo.reset()
    try:
        with pytest.raises(IndexError) as tpu:
            torch.compile(f, backend="tpu")(torch.arange(6.0, device="tpu").view(2, 3),
                                            m.to("tpu"))
    finally:
        torch._dynamo.reset()
    assert str(cpu.value).splitlines()[0] in str(tpu.value)
