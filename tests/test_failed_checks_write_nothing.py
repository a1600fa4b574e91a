"""A device-side check that fails (an index out of range, raised at the next sync point as
CUDA's device-side asserts are) leaves every tensor as it was: CPU raises before writing
anything, so the base of a view written through a bad index keeps its values."""

from __future__ import annotations

import warnings

import pytest
import torch

# eager_mode tests run in DEFER_AND_FUSE too in the default run (tests/conftest.py)
DEFER_BY_DEFAULT = True

TPU = "tpu"


def _i(dev):
    # out of range of the view's 2 rows; computed on the device, so that the device-side
    # check sees it (an index the host knows is checked before the op runs)
    return torch.tensor([1], device=dev) + 2


def setitem_tensor(y, dev):
    y[_i(dev)] = -1


def setitem_list(y, dev):
    y[[3]] = -1


def index_put_(y, dev):
    y.index_put_((_i(dev),), torch.tensor(-1, device=dev))


def index_put_accumulate(y, dev):
    y.index_put_((_i(dev),), torch.tensor([-1], device=dev), accumulate=True)


def index_copy_(y, dev):
    y.index_copy_(0, _i(dev), torch.tensor([-1], device=dev))


def index_fill_(y, dev):
    y.index_fill_(0, _i(dev), -1)


def scatter_(y, dev):
    y.scatter_(0, _i(dev), -1)


WRITES = [setitem_tensor, setitem_list, index_put_, index_put_accumulate, index_copy_,
          index_fill_, scatter_]


@pytest.mark.parametrize("write", WRITES, ids=lambda f: f.__name__)
def test_out_of_range_write_through_a_view_changes_nothing(eager_mode, write):
    # CPU raises and leaves its tensor as it was
    xc = torch.arange(4)
    with pytest.raises((IndexError, RuntimeError)):
        write(xc[:2], "cpu")
    assert xc.tolist() == [0, 1, 2, 3]
    x = torch.arange(4, device=TPU)
    with pytest.raises((IndexError, RuntimeError)):
        write(x[:2], TPU)
        torch.tpu.synchronize()
    assert x.cpu().tolist() == [0, 1, 2, 3]


def test_compiled_out_of_range_write_changes_nothing():
    def f(x, i):
        y = x[:2]
        y[i] = -1
        return x

    x = torch.arange(4, device=TPU)
    with pytest.raises(IndexError):
        torch.compile(f, backend="tpu")(x, torch.tensor([3], device=TPU))
        torch.tpu.synchronize()
    assert x.cpu().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("write", WRITES, ids=lambda f: f.__name__)
def test_out_of_range_write_to_a_whole_tensor_changes_nothing(eager_mode, write):
    # index 3 is out of range of the 2 rows; row 0 or 1 must not be written either
    def both(y, dev):
        write(y, dev)

    xc = torch.arange(2)
    with pytest.raises((IndexError, RuntimeError)):
        both(xc, "cpu")
    assert xc.tolist() == [0, 1]
    x = torch.arange(2, device=TPU)
    with pytest.raises((IndexError, RuntimeError)):
        write(x, TPU)
        torch.tpu.synchronize()
    assert x.cpu().tolist() == [0, 1]


def test_partly_out_of_range_index_copy_writes_no_row():
    x = torch.arange(4, device=TPU)
    with pytest.raises(IndexError):
        x.index_copy_(0, torch.tensor([1, 7], device=TPU), torch.tensor([-1, -1], device=TPU))
        torch.tpu.synchronize()
    assert x.cpu().tolist() == [0, 1, 2, 3]
    with pytest.raises(RuntimeError):
        x.scatter_(0, torch.tensor([1, 7], device=TPU), -1)
        torch.tpu.synchronize()
    assert x.cpu().tolist() == [0, 1, 2, 3]


def _raises_as_cpu(fn, dev_args, cpu_args):
    """``fn`` raises on tpu (at the next sync point) the exception type CPU raises."""
    with pytest.raises(Exception) as cpu_err:
        fn(*cpu_args)
    with pytest.raises(cpu_err.type):
        fn(*dev_args)
        torch.tpu.synchronize()


def test_masked_scatter_with_too_few_source_elements_raises_and_writes_nothing(eager_mode):
    # was: no error, the last source element repeated where the source ran out
    def fn(x, m, s):
        return x.masked_scatter_(m, s)

    cpu = (torch.zeros(5), torch.tensor([1, 1, 1, 0, 1], dtype=torch.bool), torch.ones(2))
    dev = tuple(t.to(TPU) for t in cpu)
    _raises_as_cpu(fn, dev, cpu)
    assert dev[0].cpu().tolist() == [0.0] * 5
    with pytest.raises(RuntimeError, match="Number of elements of source"):
        torch.masked_scatter(dev[0], dev[1], dev[2][:0]).cpu()
    # enough source elements: CPU's values
    s = torch.arange(1.0, 9.0)
    assert torch.equal(fn(dev[0], dev[1], s.to(TPU)).cpu(), fn(cpu[0], cpu[1], s))


@pytest.mark.parametrize("index", [[-1], [3], [0, 3]])
@pytest.mark.parametrize("op", ["index_add_", "index_reduce_amax", "index_reduce_prod"])
def test_index_add_and_index_reduce_reject_indices_as_cpu(eager_mode, op, index):
    # index_reduce wrapped -1 to the last row (CPU raises IndexError); index_add raised
    # IndexError where CPU raises RuntimeError
    def fn(x, i, s):
        if op == "index_add_":
            return x.index_add_(0, i, s)
        return x.index_reduce_(0, i, s, op.rsplit("_", 1)[1])

    cpu = (torch.zeros(3, 2), torch.tensor(index), torch.full((len(index), 2), 5.0))
    dev = tuple(t.to(TPU) for t in cpu)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # index_reduce() is in beta
        _raises_as_cpu(fn, dev, cpu)
    # (CPU writes row 0 of [0, 3] before it raises; a failed check writes nothing here)
    assert dev[0].cpu().tolist() == [[0.0, 0.0]] * 3


@pytest.mark.parametrize("case", ["setitem_list", "getitem_list", "negative", "second_dim",
                                  "tensor_from_list", "index_put_"])
def test_host_known_indices_raise_at_the_op_with_cpus_message(eager_mode, case):
    # indices the host knows without a sync (a Python list, a CPU tensor, a small tensor
    # just moved to the device) are checked before the op runs, as CPU does: the error
    # comes at the op, not at the next sync point
    def run(dev):
        x = torch.arange(4, device=dev)
        y = x[:2]
        if case == "setitem_list":
            y[[3]] = -1
        elif case == "getitem_list":
            y[[3]]
        elif case == "negative":
            y[[0, -3]] = -1
        elif case == "second_dim":
            x.view(2, 2)[[0, 1], [0, 2]]
        elif case == "tensor_from_list":
            y[torch.tensor([3], device=dev)] = -1
        else:
            y.index_put_((torch.tensor([1, 3]),), torch.tensor(-1, device=dev))
        return x

    with pytest.raises(IndexError) as cpu_err:
        run("cpu")
    torch.tpu.synchronize()
    before = torchtpu_metrics_syncs()
    with pytest.raises(IndexError) as tpu_err:
        run(TPU)  # (no synchronize(): raised by the op itself)
    assert str(tpu_err.value) == str(cpu_err.value)
    assert torchtpu_metrics_syncs() == before


def torchtpu_metrics_syncs():
    import torchtpu

    return torchtpu.metrics()["host_syncs_total"]


OUT_READS = {
    "index_select": lambda x, i, out: torch.index_select(x, 0, i, out=out),
    "gather": lambda x, i, out: torch.gather(x, 0, i, out=out),
    "take": lambda x, i, out: torch.take(x, i, out=out),
    "embedding_like": lambda x, i, out: torch.index_select(x.view(4, 1), 0, i,
                                                            out=out.view(2, 1)),
}


@pytest.mark.parametrize("op", sorted(OUT_READS))
def test_out_of_range_read_into_out_leaves_out_as_it_was(eager_mode, op):
    # the out= tensor got the gather's garbage (int64 min) for a failed device-side check;
    # CPU raises (after writing the rows before the bad one; tpu writes none)
    x = torch.arange(4, device=TPU) * 10
    out = torch.full((2,), 7, device=TPU)
    with pytest.raises((IndexError, RuntimeError)):
        OUT_READS[op](x, torch.tensor([1], device=TPU) + torch.tensor([0, 8], device=TPU), out)
        torch.tpu.synchronize()
    assert out.cpu().tolist() == [7, 7]
    with pytest.raises((IndexError, RuntimeError)):
        OUT_READS[op](torch.arange(4) * 10, torch.tensor([1, 9]), torch.full((2,), 7))
    OUT_READS[op](x, torch.tensor([3, 0], device=TPU), out)  # a good index still writes
    assert out.cpu().tolist() == [30, 0]
