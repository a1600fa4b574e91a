"""Fine-tune a tiny Llama with the Hugging Face Trainer on tpu, and on the CPU, and compare.

No device argument and no environment variable: with torchtpu installed, the default
``TrainingArguments`` and accelerate pick the ``tpu`` device.  Run:

    python examples/hf_trainer.py [--steps 4] [--compile]

``--compile``: the tpu run with ``TrainingArguments(torch_compile=True)`` (the Trainer
compiles the model with ``backend="inductor"``, which torchtpu compiles with its ``"tpu"``
backend, warning once; the training graphs are stitched into one program per step).

Prints both loss curves and exits non-zero if the final losses differ by more than 1e-4.
"""

import argparse
import sys
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


def train(use_cpu: bool, steps: int, compile: bool = False):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64)
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(4 * steps):
        ids = torch.randint(0, cfg.vocab_size, (32,), generator=g)
        data.append({"input_ids": ids, "labels": ids})
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, use_cpu=use_cpu, per_device_train_batch_size=4,
                                 max_steps=steps, logging_steps=1, learning_rate=3e-3,
                                 save_strategy="no", report_to=[], disable_tqdm=True,
                                 **(dict(torch_compile=True)
                                    if compile else {}))
        trainer = Trainer(model=model, args=args, train_dataset=data)
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return args.device, losses, seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--compile", action="store_true",
                   help="torch_compile=True for the tpu run")
    a = p.parse_args()
    dev, tpu_losses, tpu_s = train(use_cpu=False, steps=a.steps, compile=a.compile)
    _, cpu_losses, cpu_s = train(use_cpu=True, steps=a.steps)
    print(f"device picked by TrainingArguments: {dev}")
    print(f"tpu losses{' (compiled)' if a.compile else ''}: "
          f"{[round(x, 5) for x in tpu_losses]}  ({tpu_s:.1f} s)")
    print(f"cpu losses: {[round(x, 5) for x in cpu_losses]}  ({cpu_s:.1f} s)")
    diff = abs(tpu_losses[-1] - cpu_losses[-1])
    ok = dev.type == "tpu" and diff <= 1e-4
    print(f"final loss |tpu - cpu| = {diff:.2e}: {'matches CPU' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
