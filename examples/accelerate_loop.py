"""A plain accelerate training loop: ``Accelerator()`` picks tpu; compare with ``cpu=True``.

    python examples/accelerate_loop.py [--mixed-precision bf16]

Exits non-zero if the tpu losses differ from the CPU losses (1e-5, or 2e-2 under bf16).
"""

import argparse
import sys

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from torch import nn


def run(cpu: bool, mixed_precision: str):
    AcceleratorState._reset_state(reset_partial_state=True)
    acc = Accelerator(cpu=cpu, mixed_precision=mixed_precision)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(1, keepdim=True).sin()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model, opt, loader = acc.prepare(model, opt, loader)
    losses = []
    for _ in range(3):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb).float(), yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return acc.device, losses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mixed-precision", default="no", choices=["no", "bf16"])
    a = p.parse_args()
    dev, tpu = run(False, a.mixed_precision)
    _, cpu = run(True, a.mixed_precision)
    tol = 2e-2 if a.mixed_precision == "bf16" else 1e-5
    worst = max(abs(t - c) for t, c in zip(tpu, cpu))
    ok = dev.type == "tpu" and worst <= tol * max(1.0, max(map(abs, cpu)))
    print(f"Accelerator().device = {dev}; final loss tpu {tpu[-1]:.6f} cpu {cpu[-1]:.6f}; "
          f"max |diff| {worst:.2e}: {'matches CPU' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
