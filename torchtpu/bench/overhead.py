"""Per-op eager overhead: median microseconds for a small op, measured in one run.

    python -m torchtpu.bench overhead [--size 16] [--json PATH]

Compares, for ``a + b`` on ``size x size`` float32: native PyTorch on CPU, raw
``jax.numpy`` on the same PJRT platform as ``tpu``, a jitted JAX call, and torchtpu's
strict eager (``tpu``).  Host-side dispatch cost is what is measured (results are not
waited for, exactly as an eager program issues ops); one final sync per batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--json")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import torchtpu  # noqa: F401
    from torchtpu._device import runtime

    n = args.size
    a, b = torch.randn(n, n), torch.randn(n, n)
    x, y = a.to("tpu"), b.to("tpu")
    dev = runtime.jax_device(0)
    ja, jb = jax.device_put(a.numpy(), dev), jax.device_put(b.numpy(), dev)
    jadd = jax.jit(jnp.add)
    res = {}
    holder = {}

    def keep(v):
        holder["v"] = v

    res["torch_cpu_us"] = median_us(lambda: keep(a + b), lambda: None)
    res["jax_numpy_us"] = median_us(lambda: keep(jnp.add(ja, jb)),
                                    lambda: holder["v"].block_until_ready())
    res["jax_jit_us"] = median_us(lambda: keep(jadd(ja, jb)),
                                  lambda: holder["v"].block_until_ready())
    res["torchtpu_strict_us"] = median_us(lambda: keep(x + y), torch.tpu.synchronize)
    res["torchtpu_inplace_us"] = median_us(lambda: x.add_(y), torch.tpu.synchronize)
    res["platform"] = runtime.platform()
    res["ratio_torchtpu_vs_jax_numpy"] = res["torchtpu_strict_us"] / res["jax_numpy_us"]
    res["ratio_torchtpu_vs_torch_cpu"] = res["torchtpu_strict_us"] / res["torch_cpu_us"]
    print(f"{n}x{n} float32 add, median us per op (platform {res['platform']}):")
    for k in ("torch_cpu_us", "jax_numpy_us", "jax_jit_us", "torchtpu_strict_us",
              "torchtpu_inplace_us"):
        print(f"  {k:24s} {res[k]:8.2f}")
    print(f"  torchtpu / jax.numpy     {res['ratio_torchtpu_vs_jax_numpy']:8.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
