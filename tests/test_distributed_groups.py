"""Subgroups and devices on the ``tpu_dist`` backend: ``dist.split_group`` and
``dist.new_group`` with a subset of the ranks (4 ranks on the CPU platform), and
``LOCAL_RANK`` picking the process's local device (2 ranks with 2 CPU devices each).

The ranks are spawned once per module (``tests/_dist_groups_worker.py`` and
``tests/_dist_local_rank_worker.py``, with the spawning helper of
tests/test_distributed.py); each check there runs collectives in the subgroup on tpu
tensors and the same collectives in the same subgroup on cpu tensors (gloo).
"""

import pytest
import torch

from torchtpu.distributed import bringup

from test_distributed import _assert, spawn_ranks

WORLD = 4


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks("_dist_groups_worker.py", WORLD, tmp_path_factory.mktemp("dist_groups"))


@pytest.mark.parametrize("name", [
    "split_group_halves", "split_group_interleaved", "split_group_non_member",
])
def test_split_group_collectives_match_gloo(ranks, name):
    _assert(ranks, name)


def test_new_group_subset_collectives_match_gloo(ranks):
    _assert(ranks, "new_group_subset")


def test_compiled_collectives_in_a_split_group(ranks):
    _assert(ranks, "compiled_in_split_group")


@pytest.fixture(scope="module")
def local_ranks(tmp_path_factory):
    return spawn_ranks("_dist_local_rank_worker.py", 2, tmp_path_factory.mktemp("local_rank"))


@pytest.mark.parametrize("name", [
    "local_rank_device", "local_rank_collectives", "local_rank_compiled",
])
def test_local_rank_picks_the_local_device(local_ranks, name):
    # torch.tpu.current_device(), new tensors, collectives and compiled graphs of the
    # process with LOCAL_RANK=k are on its local device k
    _assert(local_ranks, name)


def test_local_device_index_from_local_rank():
    assert bringup.local_device_index(4, {"LOCAL_RANK": "3"}) == 3
    assert bringup.local_device_index(4, {}) is None  # no launcher: the current device
    # one device visible per process (the CPU platform, or JAX restricted to its chip)
    assert bringup.local_device_index(1, {"LOCAL_RANK": "5"}) == 0
    with pytest.raises(RuntimeError, match="LOCAL_RANK=4 but this process sees 4 tpu"):
        bringup.local_device_index(4, {"LOCAL_RANK": "4"})
    with pytest.raises(RuntimeError, match="LOCAL_RANK='x' is not a number"):
        bringup.local_device_index(2, {"LOCAL_RANK": "x"})
