"""One rank of tests/test_distributed.py: ``python tests/_dist_worker.py RANK WORLD PORT OUT``.

Runs each check as user code would (the collective on tpu tensors, then the same
collective on cpu tensors with gloo in the same process as the reference) and writes
``{check name: "ok" | error text}`` to ``OUT/rank{RANK}.json``.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from _dist_checks import (  # noqa: F401
    OUT, PORT, RANK, WORLD, assert_same, check, data, results, write_results,
)


def cpu_reference(name, x, op):
    """The collective on cpu tensors with gloo; ops gloo lacks for a dtype are reduced on
    the cpu from gloo's all_gather."""
    c = x.clone()
    try:
        if op == "AVG":
            raise RuntimeError("gloo has no AVG")
        dist.all_reduce(c, op=getattr(dist.ReduceOp, op))
        return c
    except (RuntimeError, ValueError):
        parts = [torch.empty_like(x) for _ in range(WORLD)]
        dist.all_gather(parts, x.clone())
        if op in ("SUM", "AVG"):
            r = parts[0]
            for p in parts[1:]:
                r = r + p
            if op == "AVG":
                r = torch.div(r, WORLD, rounding_mode="trunc") if not x.is_floating_point() \
                    else r / WORLD
            return r
        fn = {"PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum}[op]
        r = parts[0]
        for p in parts[1:]:
            r = fn(r, p)
        return r


# a device query before init_process_group (a common user pattern) starts JAX's backend;
# the bring-up restarts it under jax.distributed
assert torch.tpu.is_available() and torch.tpu.device_count() == 1
# init_process_group() with no backend: tpu_dist for the tpu accelerator
dist.init_process_group(init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK, world_size=WORLD)
pg = dist.distributed_c10d._get_default_group()
results["backend"] = "ok" if pg.name() == "tpu_dist" else f"backend {pg.name()}"

for dtype in (torch.float32, torch.bfloat16, torch.int64):
    dn = str(dtype).split(".")[1]
    # every reduce op on float32; the dtype-specific ones on bfloat16 and int64
    ops = {torch.float32: ("SUM", "AVG", "MIN", "MAX", "PRODUCT"),
           torch.bfloat16: ("SUM", "MAX"), torch.int64: ("SUM", "AVG", "PRODUCT")}[dtype]
    for op in ops:
        @check(f"all_reduce[{dn}-{op}]")
        def _():
            x = data(dtype)
            t = x.to("tpu")
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            assert_same(t.cpu(), cpu_reference("all_reduce", x, op), "all_reduce")

    @check(f"broadcast[{dn}]")
    def _():
        x = data(dtype)
        t = x.to("tpu")
        dist.broadcast(t, src=1)
        c = x.clone()
        dist.broadcast(c, src=1)
        assert_same(t.cpu(), c, "broadcast")

    if dtype is torch.float32:
        @check(f"all_gather[{dn}]")
        def _():
            x = data(dtype)
            outs = [torch.empty(2, 3, dtype=dtype, device="tpu") for _ in range(WORLD)]
            dist.all_gather(outs, x.to("tpu"))
            ref = [torch.empty_like(x) for _ in range(WORLD)]
            dist.all_gather(ref, x)
            for o, r in zip(outs, ref):
                assert_same(o.cpu(), r, "all_gather")

    @check(f"all_gather_into_tensor[{dn}]")
    def _():
        x = data(dtype)
        out = torch.empty(2 * WORLD, 3, dtype=dtype, device="tpu")
        dist.all_gather_into_tensor(out, x.to("tpu"))
        ref = torch.empty(2 * WORLD, 3, dtype=dtype)
        dist.all_gather_into_tensor(ref, x)
        assert_same(out.cpu(), ref, "all_gather_into_tensor")

    for op in ("SUM", "MAX") if dtype is torch.float32 else ("SUM",):
        @check(f"reduce_scatter_tensor[{dn}-{op}]")
        def _():
            x = data(dtype, (2 * WORLD, 3))
            out = torch.empty(2, 3, dtype=dtype, device="tpu")
            dist.reduce_scatter_tensor(out, x.to("tpu"), op=getattr(dist.ReduceOp, op))
            full = cpu_reference("reduce_scatter_tensor", x, op)
            assert_same(out.cpu(), full[2 * RANK: 2 * RANK + 2], "reduce_scatter_tensor")


for op in ("BAND", "BOR", "BXOR"):
    @check(f"all_reduce[int32-{op}]")
    def _():
        x = data(torch.int32) * 7 + 3
        t = x.to("tpu")
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
        assert_same(t.cpu(), x, "all_reduce")


@check("reduce_scatter[float32]")
def _():
    ins = [data(torch.float32, rank=RANK + 3 * i) for i in range(WORLD)]
    out = torch.empty(2, 3, device="tpu")
    dist.reduce_scatter(out, [i.to("tpu") for i in ins])
    ref = torch.empty(2, 3)
    try:
        dist.reduce_scatter(ref, ins)
    except RuntimeError:  # gloo has no reduce_scatter: sum of everyone's chunk RANK
        parts = [torch.empty_like(ins[RANK]) for _ in range(WORLD)]
        dist.all_gather(parts, ins[RANK])
        ref = parts[0] + parts[1]
    assert_same(out.cpu(), ref, "reduce_scatter")


@check("all_reduce_view")
def _():
    # a strided view: the write lands in the base tensor, as on cpu
    base = data(torch.float32, (4, 3))
    t = base.to("tpu")
    dist.all_reduce(t[:, 1])
    col = base[:, 1].contiguous()  # gloo reduces a strided view as if it were contiguous
    dist.all_reduce(col)
    base[:, 1] = col
    assert_same(t.cpu(), base, "all_reduce of a view")


@check("all_reduce_async")
def _():
    x = data(torch.float32)
    t = x.to("tpu")
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert work.is_completed()
    fut = work.get_future()
    fut.wait()
    dist.all_reduce(x)
    assert_same(t.cpu(), x, "async all_reduce")


@check("barrier")
def _():
    dist.barrier()


@check("send_recv")
def _():
    if RANK == 0:
        dist.send(data(torch.float32).to("tpu"), dst=1)
    else:
        r = torch.zeros(2, 3, device="tpu")
        dist.recv(r, src=0)
        assert_same(r.cpu(), data(torch.float32, rank=0), "recv")


@check("batch_isend_irecv")
def _():
    # both ranks post a send and a receive before either waits
    other = 1 - RANK
    s = data(torch.float32).to("tpu")
    r = torch.zeros(2, 3, device="tpu")
    ops = [dist.P2POp(dist.isend, s, other), dist.P2POp(dist.irecv, r, other)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert_same(r.cpu(), data(torch.float32, rank=other), "irecv")


@check("all_to_all_single")
def _():
    inp = torch.arange(4 * WORLD, dtype=torch.float32) + 100 * RANK
    out = torch.empty(4 * WORLD, device="tpu")
    dist.all_to_all_single(out, inp.to("tpu"))
    ref = torch.empty(4 * WORLD)
    dist.all_to_all_single(ref, inp)
    assert_same(out.cpu(), ref, "all_to_all_single")


@check("functional_collectives")
def _():
    import torch.distributed._functional_collectives as funcol

    x = data(torch.float32)
    t = x.to("tpu")
    w = dist.group.WORLD
    assert_same(funcol.all_reduce(t, "sum", w).cpu(), funcol.all_reduce(x, "sum", w),
                "funcol.all_reduce")
    assert_same(funcol.all_gather_tensor(t, 0, w).cpu(), funcol.all_gather_tensor(x, 0, w),
                "funcol.all_gather_tensor")
    y = data(torch.float32, (2 * WORLD, 3))
    assert_same(funcol.reduce_scatter_tensor(y.to("tpu"), "sum", 0, w).cpu(),
                funcol.reduce_scatter_tensor(y, "sum", 0, w), "funcol.reduce_scatter_tensor")


@check("broadcast_object_list")
def _():
    objs = [{"step": 3}, "tpu"] if RANK == 1 else [None, None]
    dist.broadcast_object_list(objs, src=1)
    assert objs == [{"step": 3}, "tpu"], objs


@check("all_gather_object")
def _():
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK})
    assert objs == [{"rank": r} for r in range(WORLD)], objs


@check("shape_mismatch")
def _():
    t = torch.ones(3 + RANK, device="tpu")
    try:
        dist.all_reduce(t)
    except ValueError as e:
        msg = str(e)
        for part in ("all_reduce", "rank 0", "[3]", "rank 1", "[4]"):
            assert part in msg, msg
        return
    raise AssertionError("no error for different shapes across ranks")


@check("shape_mismatch_seen_before")
def _():
    # both ranks have run all_reduce on [5] and on [6] before: the check still raises
    a, b = torch.ones(5, device="tpu"), torch.ones(6, device="tpu")
    dist.all_reduce(a)
    dist.all_reduce(b)
    try:
        dist.all_reduce(a if RANK == 0 else b)
    except ValueError as e:
        msg = str(e)
        for part in ("all_reduce", "rank 0", "[5]", "rank 1", "[6]"):
            assert part in msg, msg
    else:
        raise AssertionError("no error for different shapes across ranks")
    dist.all_reduce(a)  # the group still works
    assert_same(a.cpu(), torch.full((5,), 2.0 * WORLD), "all_reduce after a mismatch")


@check("collective_mismatch")
def _():
    # different collectives on the two ranks (same shape): named per rank
    t = torch.ones(4, 2, device="tpu")
    try:
        if RANK == 0:
            dist.broadcast(t, src=1)
        else:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
    except ValueError as e:
        msg = str(e)
        for part in ("rank 0: broadcast [4, 2] torch.float32, 1",
                     "rank 1: all_reduce [4, 2] torch.float32, MAX"):
            assert part in msg, msg
    else:
        raise AssertionError("no error for different collectives across ranks")


@check("shape_mismatch_async")
def _():
    # async_op=True: the error comes from wait(); never waited for, from the next sync
    a, b = torch.ones(7, device="tpu"), torch.ones(8, device="tpu")
    dist.all_reduce(a)
    dist.all_reduce(b)
    work = dist.all_reduce(a if RANK == 0 else b, async_op=True)
    try:
        work.wait()
    except ValueError as e:
        assert "[7]" in str(e) and "[8]" in str(e), str(e)
    else:
        raise AssertionError("no error from wait() for different shapes across ranks")
    dist.all_reduce(a if RANK == 0 else b, async_op=True)  # not waited for
    try:
        a.sum().item()
    except ValueError as e:
        assert "[7]" in str(e) and "[8]" in str(e) and "sync point" in str(e), str(e)
    else:
        raise AssertionError("no error at the next sync for different shapes across ranks")


@check("metrics")
def _():
    import torchtpu

    m = torchtpu.metrics()["collectives"]
    assert m["xla"]["allreduce"] > 0, m
    assert m["gloo"]["send"] >= 1 and m["gloo"]["recv"] >= 1, m  # send/recv, batch_isend_irecv
    assert m["cpu"]["allreduce"] > 0, m  # the gloo references on cpu tensors


def ddp_equivalence():
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    ref = copy.deepcopy(model)  # single process, whole batch, on cpu
    ddp = DDP(copy.deepcopy(model).to("tpu"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    per = 4
    for step in range(3):
        X = torch.randn(per * WORLD, 8, generator=g)
        Y = torch.randn(per * WORLD, 4, generator=g)
        xs, ys = X[RANK * per:(RANK + 1) * per], Y[RANK * per:(RANK + 1) * per]
        loss = F.mse_loss(ddp(xs.to("tpu")), ys.to("tpu"))
        opt.zero_grad()
        loss.backward()
        ref_loss = F.mse_loss(ref(X), Y)
        ref_opt.zero_grad()
        ref_loss.backward()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
        torch.testing.assert_close(mean_loss.cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6)
        for (n, p), rp in zip(ddp.module.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu(), rp.grad, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"step {step} grad {n}: {m}")
        opt.step()
        ref_opt.step()
    for p, rp in zip(ddp.module.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), rp.detach(), rtol=1e-5, atol=1e-6)


check("ddp")(ddp_equivalence)


@check("defer_and_fuse")
def _():
    # collectives inside DEFER_AND_FUSE segments, with rank-divergent code between them
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        x = data(torch.float32)
        t = x.to("tpu") * 2 + 1  # pending in the segment
        dist.all_reduce(t)
        u = t * 3 - 1
        if RANK == 0:
            print("rank 0 logs", u.sum().cpu().item(), flush=True)  # only rank 0 syncs here
        dist.all_reduce(u, op=dist.ReduceOp.MAX)
        v = u + 1
    c = x * 2 + 1
    dist.all_reduce(c)
    cu = c * 3 - 1
    dist.all_reduce(cu, op=dist.ReduceOp.MAX)
    assert_same(v.cpu(), cu + 1, "all_reduce in defer_and_fuse")


@check("ddp_defer_and_fuse")
def _():
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        ddp_equivalence()


@check("new_group")
def _():
    # subgroups: each rank alone, and both ranks in the reverse order
    alone = [dist.new_group([r]) for r in range(WORLD)]
    both = dist.new_group([1, 0])
    x = data(torch.float32)
    t = x.to("tpu")
    dist.all_reduce(t, group=alone[RANK])
    assert_same(t.cpu(), x, "all_reduce in a group of one")
    dist.all_reduce(t, group=both)
    dist.all_reduce(x, group=both)
    assert_same(t.cpu(), x, "all_reduce in new_group([1, 0])")
    out = torch.empty(2 * WORLD, 3, device="tpu")
    dist.all_gather_into_tensor(out, t, group=both)
    ref = torch.empty(2 * WORLD, 3)
    dist.all_gather_into_tensor(ref, x, group=both)
    assert_same(out.cpu(), ref, "all_gather_into_tensor in new_group([1, 0])")


@check("reinit")
def _():
    # destroy_process_group() then a new init_process_group() in the same processes
    dist.destroy_process_group()
    dist.init_process_group(init_method=f"file://{OUT}/reinit_store", rank=RANK,
                            world_size=WORLD, device_id=torch.device("tpu", 0))
    assert dist.get_backend() == "tpu_dist", dist.get_backend()
    x = data(torch.float32)
    t = x.to("tpu")
    dist.all_reduce(t)
    dist.all_reduce(x)
    assert_same(t.cpu(), x, "all_reduce after re-init")


write_results()
dist.destroy_process_group()
