"""One rank of tests/test_distributed_groups.py (4 ranks):
``python tests/_dist_groups_worker.py RANK WORLD PORT OUT``.

Subgroups on ``tpu_dist``: ``dist.split_group`` and ``dist.new_group`` with a subset of
the ranks.  Each check runs collectives on tpu tensors in the subgroup and the same
collectives on cpu tensors in the same subgroup (gloo), and writes
``{check name: "ok" | error text}`` to ``OUT/rank{RANK}.json``.
"""

import datetime

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from _dist_checks import PORT, RANK, WORLD, check, write_results  # noqa: F401


def data(shape=(2, 3), rank=RANK):
    return torch.arange(1, 1 + torch.Size(shape).numel()).reshape(shape) * (rank + 1.0) - rank


def assert_same(got, want, what):
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: tpu {got} != cpu {want}")


def collectives_match_gloo(group, what):
    """all_reduce, all_gather_into_tensor, reduce_scatter_tensor and broadcast in
    ``group`` on tpu tensors, then on cpu tensors (gloo)."""
    n = dist.get_world_size(group)
    x = data()
    t = x.to("tpu")
    dist.all_reduce(t, group=group)
    c = x.clone()
    dist.all_reduce(c, group=group)
    assert_same(t, c, f"all_reduce in {what}")
    out = torch.empty(2 * n, 3, device="tpu")
    dist.all_gather_into_tensor(out, x.to("tpu"), group=group)
    ref = torch.empty(2 * n, 3)
    dist.all_gather_into_tensor(ref, x, group=group)
    assert_same(out, ref, f"all_gather_into_tensor in {what}")
    y = data((2 * n, 3))
    out = torch.empty(2, 3, device="tpu")
    dist.reduce_scatter_tensor(out, y.to("tpu"), group=group)
    ref = torch.empty(2, 3)
    dist.reduce_scatter_tensor(ref, y, group=group)
    assert_same(out, ref, f"reduce_scatter_tensor in {what}")
    src = dist.get_global_rank(group, n - 1)
    t = x.to("tpu")
    dist.broadcast(t, src=src, group=group)
    c = x.clone()
    dist.broadcast(c, src=src, group=group)
    assert_same(t, c, f"broadcast in {what}")


# split_group needs a device bound to the default group (as with nccl)
dist.init_process_group(init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK, world_size=WORLD,
                        timeout=datetime.timedelta(seconds=120),
                        device_id=torch.device("tpu", 0))


@check("split_group_halves")
def _():
    g = dist.split_group(split_ranks=[[0, 1], [2, 3]])
    assert g is not None and g.getBackendName() == "tpu_dist", g
    assert dist.get_process_group_ranks(g) == ([0, 1] if RANK < 2 else [2, 3])
    collectives_match_gloo(g, "split_group([[0, 1], [2, 3]])")


@check("split_group_interleaved")
def _():
    from torchtpu import _compat

    g = dist.split_group(split_ranks=[[2, 0], [3, 1]])
    # torch 2.13 sorts each list; from 2.14 on a rank's position in its list is its rank
    want = ([RANK % 2 + 2, RANK % 2] if _compat.torch_at_least(2, 14)
            else [RANK % 2, RANK % 2 + 2])
    assert dist.get_process_group_ranks(g) == want, (dist.get_process_group_ranks(g), want)
    # PyTorch's group rank and the tpu_dist group's own agree
    assert dist.get_rank(g) == want.index(RANK) == g.rank(), (dist.get_rank(g), g.rank())
    collectives_match_gloo(g, "split_group([[2, 0], [3, 1]])")


@check("split_group_non_member")
def _():
    g = dist.split_group(split_ranks=[[0, 1, 2]])
    if RANK == 3:
        # None on torch 2.13, GroupMember.NON_GROUP_MEMBER from 2.14 on
        assert g is None or g == dist.GroupMember.NON_GROUP_MEMBER, g
    else:
        collectives_match_gloo(g, "split_group([[0, 1, 2]])")


@check("new_group_subset")
def _():
    g = dist.new_group([3, 1])
    if RANK in (1, 3):
        collectives_match_gloo(g, "new_group([3, 1])")
    else:
        assert g == dist.GroupMember.NON_GROUP_MEMBER, g


@check("compiled_in_split_group")
def _():
    g = dist.split_group(split_ranks=[[0, 1], [2, 3]])

    def fn(x):
        return funcol.all_gather_tensor(funcol.all_reduce(x * 2, "sum", g), 0, g)

    torch._dynamo.reset()
    got = torch.compile(fn, backend="tpu")(data().to("tpu"))
    assert_same(got, fn(data()), "compiled collectives in split_group([[0, 1], [2, 3]])")


write_results()
dist.barrier()
dist.destroy_process_group()
