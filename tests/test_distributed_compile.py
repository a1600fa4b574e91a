"""Collectives inside ``torch.compile(backend="tpu")`` graphs on the ``tpu_dist`` backend,
2 ranks on the CPU platform.

The ranks are spawned once per module (``tests/_dist_compile_worker.py``, with the
spawning helper of tests/test_distributed.py); each check there compiles user code that
calls functional collectives (or ``dist.all_reduce``, which Dynamo rewrites to them) and
compares its result with the same code run uncompiled on cpu tensors, whose collectives
run on gloo.  The graph's collectives run inside its one executable (an SPMD program over
the group's devices); a graph over several groups runs op by op in eager.
"""

import pytest

from test_distributed import _assert, spawn_ranks

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks("_dist_compile_worker.py", WORLD, tmp_path_factory.mktemp("dist_compile"))


def test_compiled_all_reduce_every_op_and_dtype(ranks):
    _assert(ranks, "all_reduce")


@pytest.mark.parametrize("name", [
    "all_gather_reduce_scatter", "broadcast_all_to_all_coalesced", "plain_all_reduce",
    "group_of_one", "eager_modes", "gradient_sync",
])
def test_compiled_collectives_match_gloo_on_cpu(ranks, name):
    _assert(ranks, name)


def test_collectives_run_inside_one_executable_and_are_counted(ranks):
    _assert(ranks, "one_executable")


def test_graph_over_two_groups_runs_in_eager(ranks):
    _assert(ranks, "two_groups_eager")
