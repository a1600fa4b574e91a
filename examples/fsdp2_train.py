"""Fully sharded data-parallel training on tpu with PyTorch's FSDP2: the CUDA program, unchanged.

    torchrun --standalone --nproc-per-node 2 examples/fsdp2_train.py   # 2 processes
    python examples/fsdp2_train.py                                      # 1 process

``fully_shard`` over ``init_device_mesh("tpu", (world,))`` shards every parameter across
the processes (each holds half of each weight as a DTensor); the forward all-gathers a
layer's weights before it runs, and the backward reduce-scatters its gradients.  Each step
trains on the same global batch of 16 samples, split across the processes; rank 0 prints
the loss of the whole batch, so both commands print the same losses (up to float32
rounding in the last printed digit: the reduce-scatter sums the two halves' gradients in
another order than one process does).  At the end the
sharded state dict is saved with ``torch.distributed.checkpoint`` (each rank writes its
shards) and loaded back.
"""

import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

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
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

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
    import torch.distributed.checkpoint as dcp

    # a sharded checkpoint: every rank writes its own shards, then reads them back
    ckpt = [tempfile.mkdtemp(prefix="fsdp2_ckpt_") if rank == 0 else None]
    dist.broadcast_object_list(ckpt, src=0)
    dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt[0])
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=ckpt[0])
    model.load_state_dict(state["model"])
    dist.barrier()
    if rank == 0:
        print(f"saved and loaded a sharded checkpoint ({ckpt[0]}, removed)", flush=True)
        shutil.rmtree(ckpt[0])
    dist.destroy_process_group()
