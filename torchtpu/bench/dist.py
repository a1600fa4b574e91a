"""Collective bandwidth and data-parallel training scaling on ``tpu_dist``.

    python -m torchtpu.bench dist [--world 2,4] [--sizes 4K,...,64M] [--iters N]
                                  [--steps N] [--warmup N] [--train ddp,fsdp2,ddp_cpu]
                                  [--pin] [--no-train] [--json PATH]

For each world size, launches that many processes on this machine (one per device,
``init_process_group()`` over ``tcp://127.0.0.1``) and measures, in the same run:

* ``all_reduce`` (SUM), ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (SUM) on
  float32 tensors of 4 KiB to 64 MiB, on tpu tensors (``tpu_dist``: XLA collectives) and
  on cpu tensors (the group's gloo), as time per call (the slowest rank's mean over
  ``--iters`` calls after 2 warm-up calls, the device queue drained at the end), also
  without ``tpu_dist``'s cross-rank signature check (``TORCHTPU_DIST_CHECK=0``), and bus
  bandwidth in the nccl-tests convention: ``size / time * 2 (n - 1) / n`` for
  all_reduce, ``size / time * (n - 1) / n`` for the other two (``size``: the all_reduce
  tensor, the gathered output, the scattered input);
* the training step of the eager benchmark's MLP (784-1024-1024-10, AdamW, batch 64 per
  rank) under ``DistributedDataParallel`` and under FSDP2 (``fully_shard`` of each Linear
  and the root over ``init_device_mesh("tpu", (n,))``), at 1 process and at every world
  size: steps/s and scaling efficiency ``t(1) / t(n)`` (the same per-rank batch, so 1.0
  is perfect weak scaling), after ``--warmup`` untimed steps (enough for the eager
  modes' lazily built executables, e.g. the donating ones of the optimizer update, to be
  out of the timed steps).  ``ddp_cpu`` (in ``--train``) is the reference: the same step
  under DDP on cpu tensors with gloo (PyTorch's own stack, one intra-op thread per rank).

``--pin``: each process is bound to one CPU core (rank ``r`` to core ``r mod cores``,
``taskset``; the 1-process run to core 0), so every rank, like a device, has the same
compute in every world size; unpinned, the 1-process run also uses the idle cores (XLA's
and PyTorch's threads, the async dispatch of per-op executables) that the ranks of a
larger world compete for.

The processes inherit the environment (``TORCHTPU_PLATFORM`` picks the PJRT platform).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

KIB = 1024
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")


def _parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": KIB, "M": KIB ** 2, "G": KIB ** 3}.get(s[-1:], 1)
    return int(float(s.rstrip("KMG")) * mult)


def _fmt_size(n: int) -> str:
    for unit, m in (("MiB", KIB ** 2), ("KiB", KIB)):
        if n >= m:
            return f"{n // m} {unit}"
    return f"{n} B"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------- worker
def _time_collective(name, device, nbytes, world, iters):
    import torch
    import torch.distributed as dist

    n = nbytes // 4
    if name == "all_reduce":
        x = torch.ones(n, device=device)

        def call():
            dist.all_reduce(x)
            return x
    elif name == "all_gather_into_tensor":  # nbytes: the gathered output
        x = torch.ones(n // world, device=device)
        out = torch.empty(n // world * world, device=device)

        def call():
            dist.all_gather_into_tensor(out, x)
            return out
    else:  # reduce_scatter_tensor, nbytes: the scattered input
        x = torch.ones(n // world * world, device=device)
        out = torch.empty(n // world, device=device)

        def call():
            dist.reduce_scatter_tensor(out, x)
            return out
    for _ in range(2):
        call()
    call()[:1].cpu()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        r = call()
    r[:1].cpu()  # drain the device queue
    dt = (time.perf_counter() - t0) / iters
    worst = torch.tensor([dt], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # cpu tensor: gloo
    return worst.item()


def _train(kind, world, rank, steps, warmup):
    """``(seconds per step, the slowest rank's; the loss of the last step)`` of the MLP
    step under ``kind`` (``ddp``, ``fsdp2``, ``ddp_cpu``), after ``warmup`` untimed steps.
    Every rank trains on the same batch, so the losses equal a one-process run's."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from torchtpu.bench.eager import mlp_workload

    device = "cpu" if kind == "ddp_cpu" else "tpu"
    torch.set_num_threads(1)  # CPU PyTorch (ddp_cpu): one intra-op thread per rank
    model, (x, y), _ = mlp_workload()
    model = model.to(device)
    if kind in ("ddp", "ddp_cpu"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("tpu", (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = x.to(device), y.to(device)

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    for _ in range(warmup):
        step().item()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    last = loss.item()
    dt = (time.perf_counter() - t0) / steps
    worst = torch.tensor([dt], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item(), last


def worker(argv) -> None:
    """One rank: ``--worker RANK WORLD PORT OUT.json SIZES ITERS STEPS WARMUP TRAIN``."""
    rank, world, port, out = int(argv[0]), int(argv[1]), argv[2], argv[3]
    sizes = [int(s) for s in argv[4].split(",") if s]
    iters, steps, warmup, train = int(argv[5]), int(argv[6]), int(argv[7]), argv[8]
    import torch.distributed as dist

    from torchtpu.distributed import process_group

    check = process_group._CHECK
    dist.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    res = {"collectives": {}, "train": {}, "train_last_loss": {}}
    for name in COLLECTIVES if world > 1 else ():
        for nbytes in sizes:
            for backend, device in (("tpu_dist", "tpu"), ("tpu_dist_nocheck", "tpu"),
                                    ("gloo", "cpu")):
                # tpu_dist_nocheck: without the cross-rank signature check
                # (TORCHTPU_DIST_CHECK=0): the bare XLA collective, dispatched without
                # waiting (the check adds a small all-gather to the program, and a
                # synchronous call then waits for the collective)
                process_group._CHECK = backend != "tpu_dist_nocheck"
                t = _time_collective(name, device, nbytes, world, iters)
                res["collectives"].setdefault(name, {}).setdefault(str(nbytes), {})[backend] = t
    process_group._CHECK = check
    for kind in [k for k in train.split(",") if k]:
        res["train"][kind], res["train_last_loss"][kind] = _train(kind, world, rank,
                                                                  steps, warmup)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------- driver
def _launch(world, sizes, args, train, tmp):
    out = os.path.join(tmp, f"world{world}.json")
    port = str(_free_port())
    cmd = [sys.executable, "-m", "torchtpu.bench.dist", "--worker"]
    cores = os.cpu_count() or 1

    def pin(r):  # taskset -c CORE: rank r bound to one core (--pin)
        return ["taskset", "-c", str(r % cores)] if args.pin else []

    procs = [subprocess.Popen(pin(r) + cmd + [str(r), str(world), port, out,
                                     ",".join(map(str, sizes)), str(args.iters),
                                     str(args.steps), str(args.warmup), train],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs) or not os.path.exists(out):
        raise RuntimeError(f"bench dist: world {world} failed:\n" + logs[0][-4000:]
                           + "\n" + logs[-1][-4000:])
    with open(out) as f:
        return json.load(f)


def _busbw(name, nbytes, world, t):
    factor = 2 * (world - 1) / world if name == "all_reduce" else (world - 1) / world
    return nbytes / t * factor / 1e9  # GB/s


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--worker":
        worker(argv[1:])
        return 0
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench dist",
                                description="tpu_dist collective bandwidth and DDP/FSDP2 "
                                            "scaling against gloo")
    p.add_argument("--world", default="2,4", help="process counts, e.g. 2,4")
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--iters", type=int, default=5, help="timed calls per collective")
    p.add_argument("--steps", type=int, default=10, help="timed training steps")
    p.add_argument("--warmup", type=int, default=20, help="untimed training steps")
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--train", default="ddp,fsdp2,ddp_cpu",
                   help="training steps: ddp, fsdp2 (tpu_dist), ddp_cpu (gloo on cpu "
                        "tensors, the reference)")
    p.add_argument("--pin", action="store_true",
                   help="bind each process to one CPU core (taskset)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    worlds = [int(w) for w in args.world.split(",") if w.strip()]
    sizes = [_parse_size(s) for s in args.sizes.split(",") if s.strip()]
    train = "" if args.no_train else args.train
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "worlds": {}}
    with tempfile.TemporaryDirectory() as tmp:
        runs = ([1] if train else []) + worlds
        for w in runs:
            print(f"world {w}: running...", flush=True)
            out["worlds"][str(w)] = _launch(w, sizes if w > 1 else [], args, train, tmp)
    print()
    for w in worlds:
        coll = out["worlds"][str(w)]["collectives"]
        for name in COLLECTIVES:
            print(f"{name}, {w} processes, float32")
            print(f"{'size':>8s} | {'tpu_dist ms':>11s} {'GB/s':>7s} | {'no check ms':>11s} "
                  f"{'GB/s':>7s} | {'gloo cpu ms':>11s} {'GB/s':>7s} | {'tpu_dist/gloo':>13s}")
            for nbytes in sizes:
                r = coll[name][str(nbytes)]
                bw = {b: _busbw(name, nbytes, w, t) for b, t in r.items()}
                r["busbw_GBps"] = bw
                print(f"{_fmt_size(nbytes):>8s} | {r['tpu_dist'] * 1e3:11.3f} "
                      f"{bw['tpu_dist']:7.3f} | {r['tpu_dist_nocheck'] * 1e3:11.3f} "
                      f"{bw['tpu_dist_nocheck']:7.3f} | {r['gloo'] * 1e3:11.3f} "
                      f"{bw['gloo']:7.3f} | {bw['tpu_dist'] / bw['gloo']:12.2f}x")
            print()
    if train:
        print("MLP training step (784-1024-1024-10, AdamW, batch 64 per rank)")
        print(f"{'':7s} {'procs':>5s} {'ms/step':>9s} {'steps/s':>8s} {'samples/s':>10s} "
              f"{'efficiency':>10s}")
        for kind in [k for k in train.split(",") if k]:
            t1 = out["worlds"]["1"]["train"][kind]
            for w in [1] + worlds:
                t = out["worlds"][str(w)]["train"][kind]
                out["worlds"][str(w)].setdefault("train_summary", {})[kind] = {
                    "ms_per_step": t * 1e3, "steps_per_s": 1 / t,
                    "samples_per_s": 64 * w / t, "efficiency": t1 / t}
                print(f"{kind:7s} {w:5d} {t * 1e3:9.1f} {1 / t:8.2f} {64 * w / t:10.0f} "
                      f"{t1 / t:10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
