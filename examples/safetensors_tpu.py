"""safetensors straight onto tpu: ``load_file(..., device="tpu")``, ``safe_open(...,
device="tpu")`` and ``load_model(model_on_tpu, path)``; outputs compared with the CPU model.

    python examples/safetensors_tpu.py
"""

import os
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_model
from torch import nn


def main() -> int:
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    x = torch.randn(8, 16)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        save_model(cpu_model, path)
        state = load_file(path, device="tpu")
        print("load_file:", {k: str(v.device) for k, v in state.items()})
        with safe_open(path, framework="pt", device="tpu") as f:
            w = f.get_tensor("0.weight")
            rows = f.get_slice("0.weight")[:2]
        print("safe_open:", w.device, tuple(rows.shape))
        tpu_model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu")
        missing, unexpected = load_model(tpu_model, path, device="tpu")
    out = tpu_model(x.to("tpu")).cpu()
    ref = cpu_model(x)
    ok = not missing and not unexpected and torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    print(f"max |tpu - cpu| = {(out - ref).abs().max().item():.2e}: "
          f"{'matches CPU' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
