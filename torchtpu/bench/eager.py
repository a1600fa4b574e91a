"""Training-step throughput of the eager modes, measured in one process.

    python -m torchtpu.bench eager [--steps N] [--rounds R] [--warmup W] [--workloads llama,mlp,cnn]
                                   [--modes strict,defer_and_fuse,debug] [--json PATH]

Each workload runs training steps (forward, backward, AdamW, ``loss.item()`` once per
step, as a logging loop does) in every eager mode on ``tpu`` and in plain PyTorch on CPU
for context, timed by the rule of :mod:`torchtpu.bench.timing`: warm-up until nothing new
is built, then R rounds of N steps.  Reported per (workload, mode): ms per step (median,
min..max over rounds), ratio to STRICT, warm-up steps, executables built while timing,
peak memory where it lives (PJRT statistics on TPU/GPU, peak RSS growth on the CPU
platform), peak bytes of live tpu tensor storages, host syncs per step; the load average
beside the table.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
import torch.nn as nn

import torchtpu
from torchtpu.bench import timing


def llama_workload():
    """The small Llama of the benchmarks: ``(model, batch, loss)``.

    ``model``: a random ``LlamaForCausalLM`` on CPU (vocab 1000, hidden 128, MLP 256,
    2 layers, 4 heads; ``torch.manual_seed(0)``); ``batch``: ``(input_ids,)``, int64
    ``(4, 32)``; ``loss(model, input_ids)``: its causal-LM loss (labels = inputs), a
    float32 scalar on the inputs' device.  Shared with ``torchtpu.bench.compile``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=128)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, 1000, (4, 32), generator=g)

    def loss(m, x):
        return m(input_ids=x, labels=x).loss

    return model, (batch,), loss


def mlp_workload(sizes=(784, 1024, 1024, 10), batch=64):
    """An MLP (``nn.Sequential`` of Linear/ReLU, ``sizes`` features) with cross-entropy:
    ``(model, (x, y), loss)``; ``x`` float32 ``(batch, sizes[0])``, ``y`` int64 classes.
    Defaults: the eager benchmark's MLP (784-1024-1024-10, batch 64)."""
    torch.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    model = nn.Sequential(*layers)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randn(batch, sizes[0], generator=g),
            torch.randint(0, sizes[-1], (batch,), generator=g))

    def loss(m, x, y):
        return nn.functional.cross_entropy(m(x), y)

    return model, (x, y), loss


def cnn_workload():
    """A small CNN (two 3x3 conv + ReLU + 2x2 max-pool blocks, a Linear) with
    cross-entropy on 32x32 RGB images: ``(model, (x, y), loss)``, ``x`` float32
    ``(32, 3, 32, 32)``, ``y`` int64 ``(32,)``."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10),
    )
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)

    def loss(m, x, y):
        return nn.functional.cross_entropy(m(x), y)

    return model, (x, y), loss


def _eager_form(workload):
    """``(model, loss_fn(m, dev))``: the batch moved to ``dev`` at every step."""
    def make():
        model, batch, loss = workload()

        def loss_fn(m, dev):
            return loss(m, *(t.to(dev) for t in batch))

        return model, loss_fn

    return make


_llama, _mlp, _cnn = (_eager_form(w) for w in (llama_workload, mlp_workload, cnn_workload))


WORKLOADS = {"llama": _llama, "mlp": _mlp, "cnn": _cnn}
MODES = ("strict", "defer_and_fuse", "debug")


def _run(model0, loss_fn, dev, mode, steps, rounds, min_warmup):
    """One (workload, mode) column: warm-up until nothing new is built, then ``rounds``
    timed rounds of ``steps`` steps (``torchtpu.bench.timing``), memory measured where it
    lives (``timing.memory_probe``)."""
    model = copy.deepcopy(model0).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tpu = dev == "tpu"

    def step():
        opt.zero_grad()
        loss = loss_fn(model, dev)
        loss.backward()
        opt.step()
        return loss.item()

    def sync(v):
        if tpu:
            torch.tpu.synchronize()
        return v

    ctx = torch.tpu.set_eager_mode(mode) if tpu else _nullctx()
    with ctx:
        w = timing.warm_up(step, sync, min_steps=min_warmup, steps=steps)
        m0 = torchtpu.metrics()
        with timing.memory_probe() as mem:
            r = timing.time_rounds(step, sync, rounds=rounds, steps=steps)
        m1 = torchtpu.metrics()
    res = {"steps_per_s": 1e3 / r["ms_median"], "ms_per_step": r["ms_median"],
           "ms_min": r["ms_min"], "ms_max": r["ms_max"], "warmup_steps": w["steps"],
           "warmup_settled": w["settled"], "built_while_timing": r["built_while_timing"],
           "first_loss": w["values"][0]}
    if tpu:
        res["memory"] = mem.result
        syncs = m1["host_syncs_total"] - m0["host_syncs_total"]
        res["syncs_per_step"] = syncs / (steps * rounds)
        if m1["segments_run"] > m0["segments_run"]:
            res["ops_per_segment"] = ((m1["segment_ops"] - m0["segment_ops"])
                                      / (m1["segments_run"] - m0["segments_run"]))
    return res


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main(argv=None):
    p = argparse.ArgumentParser(description="eager-mode training-step benchmark")
    p.add_argument("--steps", type=int, default=10, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (median, min..max)")
    p.add_argument("--warmup", type=int, default=3,
                   help="minimum warm-up steps; the warm-up goes on until no executable, "
                        "segment or donating variant is built for 3 steps")
    p.add_argument("--workloads", default="llama,mlp,cnn")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--no-cpu", action="store_true", help="skip the plain-CPU context run")
    p.add_argument("--json")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    out = {"workloads": {}, "load_before": timing.load_line(),
           "torch_threads": torch.get_num_threads()}
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        def tqdm(x, **k):
            return x
    jobs = [(w, m) for w in args.workloads.split(",") for m in
            (modes + ([] if args.no_cpu else ["cpu"]))]
    models = {}
    for w, mode in tqdm(jobs, desc="bench eager", unit="run"):
        if w not in models:
            models[w] = WORKLOADS[w]()
        model, loss_fn = models[w]
        dev = "cpu" if mode == "cpu" else "tpu"
        r = _run(model, loss_fn, dev, mode if dev == "tpu" else None, args.steps,
                 args.rounds, args.warmup)
        out["workloads"].setdefault(w, {})[mode] = r
    out["load_after"] = timing.load_line()
    print()
    print(f"{out['load_before']} (before) / {out['load_after']} (after); torch CPU "
          f"threads {out['torch_threads']}, XLA uses every core")
    hdr = (f"{'workload':9s} {'mode':15s} {'ms/step median (min..max)':>27s} {'x strict':>8s} "
           f"{'warm-up':>7s} {'built*':>6s} {'peak MiB':>8s} {'where':>5s} {'tensors MiB':>11s} "
           f"{'syncs/step':>10s} {'ops/seg':>7s}")
    print(hdr)
    print("-" * len(hdr))
    for w, rows in out["workloads"].items():
        base = rows.get("strict", {}).get("steps_per_s")
        for mode, r in rows.items():
            ratio = r["steps_per_s"] / base if base else float("nan")
            r["ratio_to_strict"] = ratio
            mem = r.get("memory") or {}
            peak = mem.get("peak_bytes")
            print(f"{w:9s} {mode:15s} {timing.fmt_ms({'ms_median': r['ms_per_step'], 'ms_min': r['ms_min'], 'ms_max': r['ms_max']}):>27s} "
                  f"{ratio:8.2f} {r['warmup_steps']:>6d}{'' if r['warmup_settled'] else '!'} "
                  f"{r['built_while_timing']:6d} "
                  f"{(peak / 2**20) if peak is not None else float('nan'):8.1f} "
                  f"{mem.get('where', '-'):>5s} "
                  f"{mem.get('tensor_bytes_peak', 0) / 2**20:11.1f} "
                  f"{r.get('syncs_per_step', 0):10.2f} {r.get('ops_per_segment', 0):7.0f}")
    print("* executables, segments or donating variants built during the timed rounds "
          "(0: warm); '!': the warm-up never settled.  peak MiB: where='host': growth of the "
          "process's peak RSS during the timed rounds (CPU platform); 'pjrt': the device's "
          "peak bytes in use.  tensors MiB: peak bytes of live tpu tensor storages.")
    for w, rows in out["workloads"].items():
        if "strict" in rows and "defer_and_fuse" in rows:
            d, s = rows["defer_and_fuse"], rows["strict"]
            print(f"{w}: DEFER_AND_FUSE / STRICT speed = {d['steps_per_s'] / s['steps_per_s']:.2f}x; "
                  f"first-step losses: " + ", ".join(
                      f"{m} {r['first_loss']:.6f}" for m, r in rows.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0
