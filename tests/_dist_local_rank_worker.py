"""One rank of tests/test_distributed_groups.py's LOCAL_RANK test:
``python tests/_dist_local_rank_worker.py RANK WORLD PORT OUT``.  It runs with
``LOCAL_RANK=RANK`` and two CPU devices per process
(``XLA_FLAGS=--xla_force_host_platform_device_count=2``), as ``torchrun`` starts one
process per chip on a host with several chips.  Checks that the process uses its local
device ``LOCAL_RANK`` and writes ``{check name: "ok" | error text}`` to
``OUT/rank{RANK}.json``.
"""

import datetime
import os
import sys

# what torchrun --nproc-per-node 2 gives each process on a host with two chips (set before
# JAX starts: ``import torch`` does not start it)
os.environ["LOCAL_RANK"] = sys.argv[1]
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=2").strip()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402

from _dist_checks import PORT, RANK, WORLD, check, write_results  # noqa: F401


def on_local_device(t, what):
    """``t`` is on ``tpu:LOCAL_RANK`` and its JAX array on local device ``LOCAL_RANK``."""
    import jax

    from torchtpu._tensor import storage

    k = int(os.environ["LOCAL_RANK"])
    assert t.device == torch.device("tpu", k), f"{what}: on {t.device}, expected tpu:{k}"
    arr = storage.data(t).get()
    assert arr.devices() == {jax.local_devices()[k]}, (what, arr.devices(), jax.local_devices())


dist.init_process_group(init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK, world_size=WORLD,
                        timeout=datetime.timedelta(seconds=120))


@check("local_rank_device")
def _():
    assert torch.tpu.device_count() == 2, torch.tpu.device_count()
    assert torch.tpu.current_device() == RANK, torch.tpu.current_device()
    assert torch.accelerator.current_device_index() == RANK
    on_local_device(torch.ones(3, device="tpu"), "torch.ones(device='tpu')")


@check("local_rank_collectives")
def _():
    x = torch.arange(6.0).reshape(2, 3) * (RANK + 1)
    t = x.to("tpu")
    on_local_device(t, "x.to('tpu')")
    dist.all_reduce(t)
    c = x.clone()
    dist.all_reduce(c)
    on_local_device(t, "all_reduce result")
    assert torch.equal(t.cpu(), c), (t.cpu(), c)
    out = torch.empty(2 * WORLD, 3, device="tpu")
    dist.all_gather_into_tensor(out, x.to("tpu"))
    ref = torch.empty(2 * WORLD, 3)
    dist.all_gather_into_tensor(ref, x)
    assert torch.equal(out.cpu(), ref), (out.cpu(), ref)


@check("local_rank_compiled")
def _():
    def fn(x):
        return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1

    x = torch.arange(6.0) * (RANK + 1)
    got = torch.compile(fn, backend="tpu")(x.to("tpu"))
    on_local_device(got, "compiled graph result")
    assert torch.equal(got.cpu(), fn(x)), (got.cpu(), fn(x))


write_results()
dist.barrier()
dist.destroy_process_group()
