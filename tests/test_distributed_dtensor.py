"""Functional collectives, DTensor, tensor parallelism and FSDP2 on tpu tensors (the
``tpu_dist`` backend), 2 ranks (1-D mesh) and 4 ranks (2-D mesh) on the CPU platform.

The ranks are spawned once per module (``tests/_dtensor_worker.py``, with the spawning
helper of tests/test_distributed.py); each check there compares with the same computation
on CPU: the functional collective on cpu tensors with gloo in the same process, or the
single-process model on the whole batch.  Plus single-process tests of
``UntypedStorage.resize_`` on tpu, which FSDP2 uses to free and re-allocate parameters.
"""


import _budget
import pytest
import torch

from test_distributed import _assert, spawn_ranks

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks("_dtensor_worker.py", WORLD, tmp_path_factory.mktemp("dtensor"))


@pytest.mark.parametrize("name", [
    "funcol_all_reduce", "funcol_all_gather_tensor", "funcol_reduce_scatter_tensor",
    "funcol_all_to_all_single", "funcol_c10d_functional_ops_and_wait_tensor",
    "funcol_async_result_used_by_ops",
])
def test_functional_collectives_match_gloo_on_cpu(ranks, name):
    _assert(ranks, name)


@pytest.mark.parametrize("name", [
    "dtensor_distribute_full_tensor", "dtensor_redistribute", "dtensor_ops",
])
def test_dtensor_on_a_tpu_mesh(ranks, name):
    _assert(ranks, name)


def test_tensor_parallel_mlp_matches_single_process(ranks):
    _assert(ranks, "tensor_parallel_mlp")


def test_fsdp2_step_matches_single_process(ranks):
    _assert(ranks, "fsdp2_step")


def test_fsdp2_step_in_defer_and_fuse(ranks):
    _assert(ranks, "fsdp2_step_defer_and_fuse")


def test_fsdp2_distributed_checkpoint_round_trip(ranks):
    _assert(ranks, "fsdp2_dcp_round_trip")


@pytest.fixture(scope="module")
def ranks4(tmp_path_factory):
    return spawn_ranks("_dtensor_worker.py", 4, tmp_path_factory.mktemp("mesh2d"))


_FOUR_RANKS = pytest.mark.skipif(
    not _budget.FULL,
    reason="4 rank processes (~25 s on CI's 2 cores): "
    "TORCHTPU_FULL_TESTS=1; the default run tests DTensor and FSDP2 on 2 ranks")


@_FOUR_RANKS
def test_dtensor_on_a_2d_mesh(ranks4):
    _assert(ranks4, "mesh2d_dtensor")


@_FOUR_RANKS
def test_fsdp2_with_tensor_parallel_on_a_2d_mesh(ranks4):
    _assert(ranks4, "mesh2d_fsdp2_tp_step")


# ------------------------------------------------------------ UntypedStorage.resize_


def _resize_cycle(device):
    x = torch.arange(8.0).reshape(4, 2).to(device)
    view = x[1:]
    st = x.untyped_storage()
    st.resize_(0)  # FSDP2's free_storage
    sizes = [st.nbytes(), x.untyped_storage().nbytes(), view.untyped_storage().nbytes()]
    st.resize_(32)  # FSDP2's alloc_storage, then the all-gather writes into it
    sizes.append(x.untyped_storage().nbytes())
    x.copy_(torch.full((4, 2), 3.0))
    return sizes, view.cpu()


def test_storage_resize_free_and_reallocate_like_cpu():
    (got_sizes, got), (want_sizes, want) = _resize_cycle("tpu"), _resize_cycle("cpu")
    assert got_sizes == want_sizes == [0, 0, 0, 32]
    assert torch.equal(got, want)


def test_storage_resize_keeps_the_leading_bytes_like_cpu():
    def grow(device):
        y = torch.arange(6.0).to(device)
        st = y.untyped_storage()
        st.resize_(40)
        return torch.empty(0, device=device).set_(st, 0, (6,), (1,)).cpu(), st.nbytes()

    def shrink(device):
        y = torch.arange(6.0).to(device)
        st = y.untyped_storage()
        st.resize_(16)
        return torch.empty(0, device=device).set_(st, 0, (4,), (1,)).cpu(), st.nbytes()

    for f in (grow, shrink):
        (got, gn), (want, wn) = f("tpu"), f("cpu")
        assert gn == wn
        assert torch.equal(got, want)


def test_reading_a_freed_storage_raises():
    # CPU reads freed memory here (undefined); tpu raises instead of returning zeros
    x = torch.ones(4, 2, device="tpu")
    x.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 0"):
        (x + 1).cpu()
