"""Lightning on tpu with no code change: ``Trainer(accelerator="auto")`` and Fabric's
``setup(model, optimizer)`` pick tpu (no torch_xla); each run is compared with the CPU.

    python examples/lightning_train.py [--precision bf16-mixed] [--accelerator tpu]

Exits non-zero if the tpu losses differ from the CPU losses (1e-5, or 2e-2 under bf16).
"""

import argparse
import sys
import time

import lightning as L
import torch
from torch import nn


class Regressor(L.LightningModule):
    """A small MLP fitting ``sin(sum(x))``."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).float(), y)
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def loader():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(1, keepdim=True).sin()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)


def trainer_run(accelerator, precision):
    torch.manual_seed(0)
    model = Regressor()
    trainer = L.Trainer(accelerator=accelerator, precision=precision, max_epochs=3,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    t0 = time.perf_counter()
    trainer.fit(model, loader())
    dt = time.perf_counter() - t0
    return trainer.strategy.root_device, [v.item() for v in model.losses], dt


def fabric_run(accelerator, precision):
    fabric = L.Fabric(accelerator=accelerator, devices=1, precision=precision)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = fabric.setup(model, opt)
    data = fabric.setup_dataloaders(loader())
    losses = []
    t0 = time.perf_counter()
    for _ in range(3):
        for x, y in data:
            loss = nn.functional.mse_loss(model(x).float(), y)
            fabric.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return fabric.device, losses, time.perf_counter() - t0


def compare(what, run, accelerator, precision, tol):
    dev, tpu, t_first = run(accelerator, precision)  # the first run compiles each op
    _, _, t_tpu = run(accelerator, precision)
    _, cpu, t_cpu = run("cpu", precision)
    worst = max(abs(a - b) for a, b in zip(tpu, cpu))
    ok = dev.type == "tpu" and len(tpu) == len(cpu) and worst <= tol * max(1.0, max(map(abs, cpu)))
    print(f"{what}: device {dev}; final loss tpu {tpu[-1]:.6f} cpu {cpu[-1]:.6f}; "
          f"max |diff| {worst:.2e}; time tpu {t_tpu:.2f}s (first run {t_first:.1f}s) "
          f"cpu {t_cpu:.2f}s: "
          f"{'matches CPU' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    p.add_argument("--accelerator", default="auto", choices=["auto", "tpu"])
    a = p.parse_args()
    tol = 2e-2 if a.precision == "bf16-mixed" else 1e-5
    ok1 = compare(f"Trainer(accelerator={a.accelerator!r})", trainer_run, a.accelerator,
                  a.precision, tol)
    ok2 = compare(f"Fabric(accelerator={a.accelerator!r}).setup(model, optimizer)", fabric_run,
                  a.accelerator, a.precision, tol)
    return 0 if ok1 and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())
