"""One rank of tests/test_distributed.py's re-initialisation test:
``python tests/_dist_reinit_worker.py RANK WORLD PORT CYCLES DIR``.

``CYCLES`` times, as a user re-creating the default group would (``env://`` on one port):
``init_process_group`` (tpu_dist), an all_reduce of tpu tensors, one of CPU tensors (the
group's gloo part), a DDP training step, ``destroy_process_group``; each cycle's values
are checked against what every rank contributed.  Between a ``destroy_process_group``
and the next ``init_process_group`` the ranks wait for each other through files in
``DIR``: PyTorch's ``env://`` rendezvous itself races when a rank re-initialises before
the master rank has dropped its old TCPStore server (plain gloo fails the same way, about
one run in two of six quick cycles, a helper's finding), which is not what this tests.  Then it initialises once more, prints
``ready`` and sleeps: the test ends it with SIGTERM, which must end the process.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

RANK, WORLD, PORT, CYCLES = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
DIR = sys.argv[5]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=PORT, RANK=str(RANK),
                  WORLD_SIZE=str(WORLD))


def cycle(c):
    dist.init_process_group(device_id=torch.device("tpu", 0))
    assert dist.get_backend() == "tpu_dist", dist.get_backend()
    x = torch.full((4,), float(RANK + c), device="tpu")
    dist.all_reduce(x)
    want = float(sum(r + c for r in range(WORLD)))
    assert x.cpu().tolist() == [want] * 4, (c, x.cpu())
    y = torch.full((2,), float(RANK + c))
    dist.all_reduce(y)
    assert y.tolist() == [want] * 2, (c, y)
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(3, 2).to("tpu"))
    ddp(torch.full((4, 3), float(RANK + 1), device="tpu")).sum().backward()
    # DDP averages the gradients: every rank holds the mean of the ranks' gradients
    g = ddp.module.weight.grad.cpu()
    mean = sum(torch.full((2, 3), 4.0 * (r + 1)) for r in range(WORLD)) / WORLD
    assert torch.allclose(g, mean), (c, g)
    dist.destroy_process_group()


def wait_for_all(c):
    """Every rank has finished cycle ``c``'s destroy_process_group (files in DIR)."""
    open(os.path.join(DIR, f"c{c}_r{RANK}"), "w").close()
    deadline = time.monotonic() + 120
    while not all(os.path.exists(os.path.join(DIR, f"c{c}_r{r}")) for r in range(WORLD)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"cycle {c}: the other ranks did not finish")
        time.sleep(0.01)


for c in range(CYCLES):
    cycle(c)
    print(f"cycle {c} ok", flush=True)
    wait_for_all(c)
dist.init_process_group(device_id=torch.device("tpu", 0))
x = torch.ones(2, device="tpu")
dist.all_reduce(x)
print("ready", flush=True)
time.sleep(600)
