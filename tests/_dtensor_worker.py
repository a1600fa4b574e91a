"""One rank of tests/test_distributed_dtensor.py: ``python tests/_dtensor_worker.py RANK WORLD PORT OUT``.

With 2 ranks: the 1-D mesh checks; with 4 ranks: the 2-D mesh checks.

Functional collectives, DTensor, tensor parallelism and FSDP2 on tpu tensors over the
``tpu_dist`` group, each checked against the same computation on CPU (the functional
collective on cpu tensors with gloo in the same process, or the single-process model on
the whole batch).  Writes ``{check name: "ok" | error text}`` to ``OUT/rank{RANK}.json``
(the format of tests/_dist_worker.py).
"""

import copy
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from _dist_checks import OUT, PORT, RANK, WORLD, write_results  # noqa: F401
from _dist_checks import check as _check  # noqa: E402


def check(name, world=2):
    """Check ``name``, run only when the job has ``world`` ranks (the 1-D checks with 2
    ranks, the 2-D mesh checks with 4)."""
    return _check(name, enabled=WORLD == world)


def assert_same(got, want, what, exact=True):
    got = got.cpu()
    if exact:
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            raise AssertionError(f"{what}: tpu {got} != cpu {want}")
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")


dist.init_process_group(init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK, world_size=WORLD,
                        timeout=datetime.timedelta(seconds=120))
torch.tpu.set_device(0)  # one device per process (LOCAL_RANK picks it under torchrun)

import torch.distributed._functional_collectives as funcol  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard,  # noqa: E402
                                      distribute_tensor)

W = dist.group.WORLD


def data(shape, rank=RANK):
    return (torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
            * 0.37 - 1.1) * (rank + 1) + rank


@check("funcol_all_reduce")
def _():
    x = data((2, 3))
    for op in ("sum", "avg", "max"):
        assert_same(funcol.all_reduce(x.to("tpu"), op, W), funcol.all_reduce(x, op, W),
                    f"all_reduce {op}")


@check("funcol_all_gather_tensor")
def _():
    x = data((2, 3))
    for dim in (0, 1):
        assert_same(funcol.all_gather_tensor(x.to("tpu"), dim, W),
                    funcol.all_gather_tensor(x, dim, W), f"all_gather_tensor dim {dim}")


@check("funcol_reduce_scatter_tensor")
def _():
    x = data((2 * WORLD, 4))
    for dim in (0, 1):
        assert_same(funcol.reduce_scatter_tensor(x.to("tpu"), "sum", dim, W),
                    funcol.reduce_scatter_tensor(x, "sum", dim, W),
                    f"reduce_scatter_tensor dim {dim}")


@check("funcol_all_to_all_single")
def _():
    x = torch.arange(8.0) + 10 * RANK
    assert_same(funcol.all_to_all_single(x.to("tpu"), None, None, W),
                funcol.all_to_all_single(x, None, None, W), "all_to_all_single even")
    # uneven: rank 0 keeps 3 and sends 5, rank 1 sends 5 and keeps 3
    splits = [3, 5] if RANK == 0 else [5, 3]
    assert_same(funcol.all_to_all_single(x.to("tpu"), splits, splits, W),
                funcol.all_to_all_single(x, splits, splits, W), "all_to_all_single uneven")


@check("funcol_c10d_functional_ops_and_wait_tensor")
def _():
    # the ops DTensor and FSDP2 dispatch, called directly: each returns a tensor that
    # wait_tensor makes ready
    ops = torch.ops._c10d_functional
    name = W.group_name
    x = data((4, 3))
    got = {}
    for dev in ("tpu", "cpu"):
        t = x.to(dev)
        got[dev] = [
            ops.wait_tensor(ops.all_reduce(t, "sum", name)),
            ops.wait_tensor(ops.all_gather_into_tensor(t, WORLD, name)),
            ops.wait_tensor(ops.reduce_scatter_tensor(t, "sum", WORLD, name)),
            ops.wait_tensor(ops.all_to_all_single(t, [2, 2], [2, 2], name)),
        ]
        a, b = t.clone(), t.clone() * 2
        outs = ops.all_reduce_coalesced([a, b], "sum", name)
        got[dev] += [ops.wait_tensor(o) for o in outs]
        c = t.clone()
        ops.all_reduce_(c, "max", name)  # in place
        got[dev].append(ops.wait_tensor(c))
    for i, (g, w) in enumerate(zip(got["tpu"], got["cpu"])):
        assert_same(g, w, f"_c10d_functional op #{i}")


@check("funcol_async_result_used_by_ops")
def _():
    # an AsyncCollectiveTensor is waited for by the first op that reads it
    x = data((2, 3))
    r = funcol.all_reduce(x.to("tpu"), "sum", W)
    y = r * 2 + 1
    assert_same(y, funcol.all_reduce(x, "sum", W) * 2 + 1, "op on an async result")


X = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
Wt = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))


@check("dtensor_distribute_full_tensor")
def _():
    mesh = init_device_mesh("tpu", (WORLD,))
    assert mesh.device_type == "tpu", mesh
    for pl in (Shard(0), Shard(1), Replicate()):
        d = distribute_tensor(X.to("tpu"), mesh, [pl])
        assert d.to_local().device.type == "tpu"
        want = X.chunk(WORLD, pl.dim)[RANK] if isinstance(pl, Shard) else X
        assert_same(d.to_local(), want, f"local shard of {pl}")
        assert_same(d.full_tensor(), X, f"full_tensor of {pl}")


@check("dtensor_redistribute")
def _():
    mesh = init_device_mesh("tpu", (WORLD,))
    d = distribute_tensor(X.to("tpu"), mesh, [Shard(0)])
    r = d.redistribute(mesh, [Replicate()])
    assert_same(r.to_local(), X, "Shard(0) -> Replicate")
    s1 = d.redistribute(mesh, [Shard(1)])
    assert_same(s1.to_local(), X.chunk(WORLD, 1)[RANK], "Shard(0) -> Shard(1)")
    s0 = r.redistribute(mesh, [Shard(0)])
    assert_same(s0.to_local(), X.chunk(WORLD, 0)[RANK], "Replicate -> Shard(0)")
    # Partial -> Replicate (all_reduce) and Partial -> Shard (reduce_scatter)
    p = DTensor.from_local(data((4, 2)).to("tpu"), mesh, [Partial()])
    total = data((4, 2), 0) + data((4, 2), 1)
    assert_same(p.redistribute(mesh, [Replicate()]).to_local(), total, "Partial -> Replicate",
                exact=False)
    assert_same(p.redistribute(mesh, [Shard(0)]).to_local(), total.chunk(WORLD)[RANK],
                "Partial -> Shard(0)", exact=False)


@check("dtensor_ops")
def _():
    mesh = init_device_mesh("tpu", (WORLD,))
    d = distribute_tensor(X.to("tpu"), mesh, [Shard(0)])
    w = distribute_tensor(Wt.to("tpu"), mesh, [Replicate()])
    e = torch.relu(d * 2 + 1)
    assert e.placements == (Shard(0),), e.placements
    assert_same(e.full_tensor(), torch.relu(X * 2 + 1), "elementwise on Shard(0)")
    s = e.sum()
    assert s.placements == (Partial(),), s.placements
    assert_same(s.full_tensor(), torch.relu(X * 2 + 1).sum(), "sum of Shard(0)", exact=False)
    m = d @ w
    assert_same(m.full_tensor(), X @ Wt, "Shard(0) @ Replicate", exact=False)
    dc = distribute_tensor(X.to("tpu"), mesh, [Shard(1)])
    wr = distribute_tensor(Wt.to("tpu"), mesh, [Shard(0)])
    m2 = dc @ wr  # contraction dim sharded: a Partial result
    assert_same(m2.full_tensor(), X @ Wt, "Shard(1) @ Shard(0)", exact=False)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(8, 16)
        self.w2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


@check("tensor_parallel_mlp")
def _():
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    mesh = init_device_mesh("tpu", (WORLD,))
    torch.manual_seed(0)
    ref = MLP()
    tp = parallelize_module(copy.deepcopy(ref).to("tpu"), mesh,
                            {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    assert tp.w1.weight.placements == (Shard(0),) and tp.w2.weight.placements == (Shard(1),)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(2))
    out = tp(x.to("tpu"))
    out.sum().backward()
    want = ref(x)
    want.sum().backward()
    assert_same(out, want.detach(), "TP forward", exact=False)
    for (n, p), rp in zip(tp.named_parameters(), ref.parameters()):
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        assert_same(g, rp.grad, f"TP grad {n}", exact=False)


def fsdp_model(seed):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    ref = MLP()
    m = copy.deepcopy(ref).to("tpu")
    mesh = init_device_mesh("tpu", (WORLD,))
    fully_shard(m.w1, mesh=mesh)
    fully_shard(m.w2, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, ref


def fsdp2_equivalence():
    m, ref = fsdp_model(0)
    assert isinstance(m.w1.weight, DTensor) and m.w1.weight.placements == (Shard(0),)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    per = 4
    for step in range(2):
        X_ = torch.randn(per * WORLD, 8, generator=g)
        Y = torch.randn(per * WORLD, 4, generator=g)
        mine = slice(RANK * per, (RANK + 1) * per)
        loss = F.mse_loss(m(X_[mine].to("tpu")), Y[mine].to("tpu"))
        opt.zero_grad()
        loss.backward()  # gradients reduce-scattered: the mean over the ranks
        ref_loss = F.mse_loss(ref(X_), Y)
        ref_opt.zero_grad()
        ref_loss.backward()
        mean = funcol.all_reduce(loss.detach(), "avg", W)
        assert_same(mean, ref_loss.detach(), f"step {step} loss", exact=False)
        for (n, p), rp in zip(m.named_parameters(), ref.parameters()):
            assert_same(p.grad.full_tensor(), rp.grad, f"step {step} grad {n}", exact=False)
        opt.step()
        ref_opt.step()
    for (n, p), rp in zip(m.named_parameters(), ref.parameters()):
        assert_same(p.full_tensor(), rp.detach(), f"parameter {n} after 2 steps", exact=False)
    return m


@check("fsdp2_step")
def _():
    global TRAINED
    TRAINED = fsdp2_equivalence()


@check("fsdp2_step_defer_and_fuse")
def _():
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        fsdp2_equivalence()


@check("fsdp2_dcp_round_trip")
def _():
    import torch.distributed.checkpoint as dcp

    m = TRAINED
    path = os.path.join(OUT, "ckpt")
    dcp.save({"model": m.state_dict()}, checkpoint_id=path)
    fresh, _ = fsdp_model(5)  # other weights
    sd = {"model": fresh.state_dict()}
    dcp.load(sd, checkpoint_id=path)
    fresh.load_state_dict(sd["model"])
    for (n, p), q in zip(m.named_parameters(), fresh.parameters()):
        assert q.to_local().device.type == "tpu"
        assert_same(q.to_local(), p.to_local().cpu(), f"loaded shard of {n}")
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(3)).to("tpu")
    assert_same(fresh(x), m(x).detach().cpu(), "forward of the loaded model", exact=False)


# ------------------------------------------------------------- 2-D mesh, 4 ranks


@check("mesh2d_dtensor", world=4)
def _():
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    d = distribute_tensor(X.to("tpu"), mesh, [Shard(0), Shard(1)])
    dp, tp = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    assert_same(d.to_local(), X.chunk(2, 0)[dp].chunk(2, 1)[tp],
                "local block of (Shard(0), Shard(1))")
    assert_same(d.full_tensor(), X, "full_tensor on a 2-D mesh")
    r = d.redistribute(mesh, [Replicate(), Shard(0)])
    assert_same(r.to_local(), X.chunk(2, 0)[tp],
                "(Shard(0), Shard(1)) -> (Replicate(), Shard(0))")
    s = (d * 2).sum()
    assert_same(s.full_tensor(), (X * 2).sum(), "sum on a 2-D mesh", exact=False)
    w = distribute_tensor(Wt.to("tpu"), mesh, [Replicate(), Replicate()])
    assert_same((d @ w).full_tensor(), X @ Wt, "matmul on a 2-D mesh", exact=False)


@check("mesh2d_fsdp2_tp_step", world=4)
def _():
    # tensor parallel inside each "tp" pair, FSDP2 across the "dp" pairs
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    ref = MLP()
    m = parallelize_module(copy.deepcopy(ref).to("tpu"), mesh["tp"],
                           {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    fully_shard(m, mesh=mesh["dp"])
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    dp, per = mesh.get_local_rank("dp"), 4
    for step in range(2):
        X_ = torch.randn(per * 2, 8, generator=g)
        Y = torch.randn(per * 2, 4, generator=g)
        mine = slice(dp * per, (dp + 1) * per)  # the tp pair shares its batch
        loss = F.mse_loss(m(X_[mine].to("tpu")), Y[mine].to("tpu"))
        opt.zero_grad()
        loss.backward()
        ref_loss = F.mse_loss(ref(X_), Y)
        ref_opt.zero_grad()
        ref_loss.backward()
        for (n, p), rp in zip(m.named_parameters(), ref.parameters()):
            assert_same(p.grad.full_tensor(), rp.grad, f"step {step} grad {n}", exact=False)
        opt.step()
        ref_opt.step()
    for (n, p), rp in zip(m.named_parameters(), ref.parameters()):
        assert_same(p.full_tensor(), rp.detach(), f"parameter {n} after 2 steps", exact=False)


write_results()
dist.destroy_process_group()
