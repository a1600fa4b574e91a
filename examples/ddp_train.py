"""Data-parallel training on tpu with PyTorch's own DDP: the CUDA program, unchanged.

    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py   # 2 processes
    python examples/ddp_train.py                                      # 1 process

Each step trains on the same global batch of 16 samples, split across the processes;
rank 0 prints the loss of the whole batch (the mean of the ranks' losses), so both
commands print the same losses.  ``init_process_group()`` with no backend picks
``tpu_dist`` for the tpu accelerator, as it picks ``nccl`` for cuda.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

GLOBAL_BATCH, STEPS = 16, 5

device = torch.accelerator.current_accelerator()
distributed = "RANK" in os.environ  # launched by torchrun
if distributed:
    dist.init_process_group()
rank = dist.get_rank() if distributed else 0
world = dist.get_world_size() if distributed else 1

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
if distributed:
    model = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

data = torch.Generator().manual_seed(1)
per_rank = GLOBAL_BATCH // world
for step in range(STEPS):
    x = torch.randn(GLOBAL_BATCH, 32, generator=data)
    y = torch.randint(0, 10, (GLOBAL_BATCH,), generator=data)
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    loss = F.cross_entropy(model(x[mine].to(device)), y[mine].to(device))
    opt.zero_grad()
    loss.backward()
    opt.step()
    report = loss.detach().clone()
    if distributed:
        dist.all_reduce(report, op=dist.ReduceOp.AVG)
    if rank == 0:
        print(f"step {step} loss {report.item():.6f}", flush=True)

if distributed:
    dist.destroy_process_group()
