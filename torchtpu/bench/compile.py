"""``python -m torchtpu.bench compile``: an MLP AdamW training step, compiled vs eager vs JAX.

Minimal first version (issue 10): the MLP only.  For each size it measures steady-state
ms/step of the same training step (forward, cross-entropy, backward, AdamW update) as

* ``compiled``: the forward and loss compiled (``backend="tpu"``; AOTAutograd compiles
  its backward too) plus a compiled ``opt.step``;
* ``strict`` / ``defer_and_fuse``: the eager modes;
* ``cpu``: plain PyTorch on CPU;
* ``jax``: the same step hand-written in JAX and ``jax.jit``-ed (same shapes, initial
  weights and AdamW math: the XLA limit on this machine),

and prints ratios to the JAX step, plus the compiled step's first-call latency split as
in ``torchtpu.metrics()["compile"]``.  Not a timed test.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 1e-2


class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x):
        for i, lin in enumerate(self.layers):
            x = lin(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


def _torch_step(model, x, y, compiled):
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)

    def loss_fn(x, y):
        return F.cross_entropy(model(x), y)

    def opt_step():
        opt.step()

    if compiled:  # forward+loss (and its backward) as one graph each, the update as one
        loss_fn = torch.compile(loss_fn, backend="tpu")
        opt_step = torch.compile(opt_step, backend="tpu")

    def step():
        loss = loss_fn(x, y)
        loss.backward()
        opt_step()
        opt.zero_grad()
        return loss

    return step


def _jax_step(model, x, y):
    import jax
    import jax.numpy as jnp
    import numpy as np

    params = [(jnp.asarray(np.array(lin.weight.detach())), jnp.asarray(np.array(lin.bias.detach())))
              for lin in model.layers]
    state = (params, jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params),
             jnp.zeros((), jnp.float32))  # float32: b1 ** t stays float32 under x64
    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())

    def loss_fn(ps):
        h = xj
        for i, (w, b) in enumerate(ps):
            h = h @ w.T + b
            if i < len(ps) - 1:
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, yj[:, None], axis=1))

    @jax.jit
    def step(state):
        ps, m, v, t = state
        loss, g = jax.value_and_grad(loss_fn)(ps)
        t = t + 1
        b1, b2 = BETAS
        m = jax.tree.map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
        v = jax.tree.map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t

        def upd(p, m_, v_):
            p = p * (1 - LR * WD)
            return p - LR * (m_ / c1) / (jnp.sqrt(v_ / c2) + EPS)

        ps = jax.tree.map(upd, ps, m, v)
        return (ps, m, v, t), loss

    box = [state]

    def run():
        box[0], loss = step(box[0])
        return loss

    return run


def _time(step, steps, warmup, sync):
    for _ in range(warmup):
        out = step()
    sync(out)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = step()
    sync(out)
    return (time.perf_counter() - t0) / steps * 1e3


def bench(sizes, batch, steps, warmup):
    import torchtpu

    torch.manual_seed(0)
    base = MLP(sizes)
    x = torch.randn(batch, sizes[0])
    y = torch.randint(0, sizes[-1], (batch,))
    res = {}

    def tsync(out):
        float(out.detach().cpu())

    def jsync(out):
        out.block_until_ready()

    res["jax"] = _time(_jax_step(base, x, y), steps, warmup, jsync)
    res["cpu"] = _time(_torch_step(copy.deepcopy(base), x, y, False), steps, warmup, tsync)
    xt, yt = x.to("tpu"), y.to("tpu")
    for mode in ("strict", "defer_and_fuse"):
        with torch.tpu.set_eager_mode(mode):
            res[mode] = _time(_torch_step(copy.deepcopy(base).to("tpu"), xt, yt, False),
                              steps, warmup, tsync)
    torch._dynamo.reset()
    torchtpu.reset_metrics()
    step = _torch_step(copy.deepcopy(base).to("tpu"), xt, yt, True)
    t0 = time.perf_counter()
    tsync(step())
    first = time.perf_counter() - t0
    c0 = torchtpu.metrics()["compile"]
    res["compiled"] = _time(step, steps, warmup, tsync)
    c1 = torchtpu.metrics()["compile"]
    return {
        "sizes": sizes, "batch": batch, "ms_per_step": res,
        "ratio_to_jax": {k: v / res["jax"] for k, v in res.items()},
        "compiled_first_call_s": first,
        "compile_split_s": {k: c0[k] for k in ("tracing_seconds", "lowering_seconds",
                                                "xla_seconds")},
        "recompiles_after_first_step": c1["recompiles"] - c0["recompiles"],
        "executables_after_first_step": c1["executables"] - c0["executables"],
    }


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torchtpu.bench compile")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = [bench([784, 1024, 1024, 10], 64, args.steps, args.warmup),
            bench([128, 256, 256, 10], 16, args.steps, args.warmup)]
    print("| MLP | batch | " + " | ".join(f"{k} ms (x JAX)" for k in rows[0]["ms_per_step"])
          + " | first call s (tracing/lowering/XLA) | recompiles |")
    print("|---" * (len(rows[0]["ms_per_step"]) + 4) + "|")
    for r in rows:
        cells = [f"{v:.2f} ({r['ratio_to_jax'][k]:.2f}x)" for k, v in r["ms_per_step"].items()]
        sp = r["compile_split_s"]
        print(f"| {'-'.join(map(str, r['sizes']))} | {r['batch']} | " + " | ".join(cells)
              + f" | {r['compiled_first_call_s']:.1f} ({sp['tracing_seconds']:.1f}/"
              f"{sp['lowering_seconds']:.1f}/{sp['xla_seconds']:.1f}) | "
              f"{r['recompiles_after_first_step']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
