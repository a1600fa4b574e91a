"""Per-op eager overhead: median microseconds for a small op, measured in one run.

    python -m torchtpu.bench overhead [--size 16] [--cold-start] [--json PATH]

Compares, for ``a + b`` on ``size x size`` float32: native PyTorch on CPU, raw
``jax.numpy`` on the same PJRT platform as ``tpu``, a jitted JAX call, and torchtpu on
``tpu``:

* ``strict``: STRICT eager as a program gets it (the per-op hot path, ``eager.hotpath``,
  in its C++ form once the C++ helper is loaded; the benchmark loads it first);
* ``strict_python_hot``: the hot path's Python form (``TORCHTPU_HOT_PATH_NATIVE=0``);
* ``strict_general``: the hot path off (``TORCHTPU_HOT_PATH=0``: every call takes the
  executor's general path, as before the hot path existed);
* ``inplace``: ``x.add_(y)`` in STRICT;
* ``defer_record``: DEFER_AND_FUSE, per op: recording a chain of adds, with the fused
  segment of each batch of ops run at the batch's sync (its compile is in the warm-up).

Host-side dispatch cost is what is measured (results are not waited for, exactly as an
eager program issues ops); one final sync per batch.  Not a timed test.

``--cold-start``: the small MLP (128-256-256-10, batch 16, AdamW) training step in a fresh
process in STRICT with an empty persistent cache (``TORCHTPU_CACHE_DIR=<new dir>``):
seconds to import, to move the model, and of the first and second steps (each ending in
``loss.item()``), and the XLA executables the first step built.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def median_us(fn, sync, n=2000, reps=9):
    for _ in range(200):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


_COLD = r"""
import json, time, sys
t0 = time.perf_counter()
import torch, torchtpu
from torchtpu.bench import eager as be
t1 = time.perf_counter()
torch.manual_seed(0)
model, batch, loss_fn = be.mlp_workload((128, 256, 256, 10), 16)
model = model.to("tpu"); batch = [b.to("tpu") for b in batch]
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
t2 = time.perf_counter()
def step():
    opt.zero_grad(); l = loss_fn(model, *batch); l.backward(); opt.step(); return l.item()
x0 = torchtpu.metrics()["xla"]["compiled"]
loss = step()
t3 = time.perf_counter()
x1 = torchtpu.metrics()["xla"]["compiled"]
step()
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "to_device_s": t2 - t1, "first_step_s": t3 - t2,
                  "second_step_s": t4 - t3, "first_step_xla_compiles": x1 - x0,
                  "first_loss": loss}))
"""


def cold_start() -> dict:
    """The small MLP's first steps in a fresh STRICT process with an empty cache."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TORCHTPU_CACHE_DIR=d, TORCHTPU_EAGER_MODE="strict")
        out = subprocess.run([sys.executable, "-c", _COLD], env=env, capture_output=True,
                             text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--cold-start", action="store_true",
                   help="also time the small MLP's first step in a fresh process")
    p.add_argument("--json")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import torchtpu  # noqa: F401
    from torchtpu._device import runtime
    from torchtpu._tensor import native
    from torchtpu.bench import timing
    from torchtpu.eager import hotpath

    try:  # the C++ form of the hot path (built once per machine, ~30 s)
        native.module()
        native_form = True
    except NotImplementedError:
        native_form = False
    load_before = timing.load_line()
    n = args.size
    a, b = torch.randn(n, n), torch.randn(n, n)
    x, y = a.to("tpu"), b.to("tpu")
    dev = runtime.jax_device(0)
    ja, jb = jax.device_put(a.numpy(), dev), jax.device_put(b.numpy(), dev)
    jadd = jax.jit(jnp.add)
    res = {"hot_path_form": "C++" if native_form else "Python"}
    holder = {}

    def keep(v):
        holder["v"] = v

    def tpu_add():
        keep(x + y)

    res["torch_cpu_us"] = median_us(lambda: keep(a + b), lambda: None)
    res["jax_numpy_us"] = median_us(lambda: keep(jnp.add(ja, jb)),
                                    lambda: holder["v"].block_until_ready())
    res["jax_jit_us"] = median_us(lambda: keep(jadd(ja, jb)),
                                  lambda: holder["v"].block_until_ready())
    with torch.tpu.set_eager_mode("strict"):
        res["torchtpu_strict_us"] = median_us(tpu_add, torch.tpu.synchronize)
        prev = hotpath.set_native(False)
        res["torchtpu_strict_python_hot_us"] = median_us(tpu_add, torch.tpu.synchronize)
        hotpath.set_native(prev)
        prev = hotpath.set_enabled(False)
        res["torchtpu_strict_general_us"] = median_us(tpu_add, torch.tpu.synchronize)
        hotpath.set_enabled(prev)
        res["torchtpu_inplace_us"] = median_us(lambda: x.add_(y), torch.tpu.synchronize)
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        chain = {"v": x}

        def record():
            chain["v"] = chain["v"] + y

        def run_segment():
            chain["v"].cpu()
            chain["v"] = x

        res["torchtpu_defer_record_us"] = median_us(record, run_segment)
    res["platform"] = runtime.platform()
    res["load"] = [load_before, timing.load_line()]
    res["ratio_torchtpu_vs_jax_numpy"] = res["torchtpu_strict_us"] / res["jax_numpy_us"]
    res["ratio_torchtpu_vs_torch_cpu"] = res["torchtpu_strict_us"] / res["torch_cpu_us"]
    print(f"{n}x{n} float32 add, median us per op (platform {res['platform']}; "
          f"hot path: {res['hot_path_form']} form; {load_before} before, "
          f"{res['load'][1]} after):")
    for k in ("torch_cpu_us", "jax_numpy_us", "jax_jit_us", "torchtpu_strict_us",
              "torchtpu_strict_python_hot_us", "torchtpu_strict_general_us",
              "torchtpu_inplace_us", "torchtpu_defer_record_us"):
        print(f"  {k:31s} {res[k]:8.2f}")
    print(f"  strict / jax.numpy              {res['ratio_torchtpu_vs_jax_numpy']:8.2f}x")
    if args.cold_start:
        res["cold_start"] = c = cold_start()
        print(f"small MLP in a fresh STRICT process, empty cache: import {c['import_s']:.2f} s, "
              f"model to tpu {c['to_device_s']:.2f} s, first step {c['first_step_s']:.2f} s "
              f"({c['first_step_xla_compiles']} XLA compiles), second step "
              f"{c['second_step_s'] * 1e3:.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
