"""New-shape cost: a few ops looped over N distinct shapes, tpu vs CPU, in one run.

    python -m torchtpu.bench shapes [--n 40] [--tiers] [--json PATH]

PyTorch's device tests (and a model's first step) run many signatures only once, so
their cost is compile cost, not per-op dispatch.  For each of N shapes this runs
``uniform_``, ``randn``, ``cumsum``, ``abs``, ``max``, a dtype conversion, an
``index_put`` with accumulate and a read back to the host, on CPU and then on ``tpu``,
and prints the time per shape (wall and process CPU seconds), the tpu/CPU ratio and the
compile counters (``compiles``, ``quick_compiles``, ``tier_ups``, compile seconds).
``--tiers`` switches the opt-in quick compile tier on (``torchtpu.eager.tiers``).

Decoding with growing shapes (a first ``generate()``, a new prompt length, the same call
again, each against CPU in the same process) is ``python -m torchtpu.bench generate
--models llama128 --modes strict --tokens 64 --prompts 12,17,17``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def _body(n, device):
    d = torch.empty(n, dtype=torch.float64, device=device).uniform_(-1, 1)
    idx = d.cumsum(0).long().abs()
    x = torch.randn(n + 3, device=device, dtype=torch.float64)
    v = torch.randn(n, device=device, dtype=torch.float64)
    out = x.index_put((idx % (n + 3),), v, accumulate=True)
    return float(out.max()) + float(x.abs().sum())


def _run(device, sizes):
    t0, p0 = time.perf_counter(), time.process_time()
    for n in sizes:
        _body(n, device)
    if device != "cpu":
        torch.tpu.synchronize()
    return time.perf_counter() - t0, time.process_time() - p0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=40, help="number of distinct shapes")
    p.add_argument("--start", type=int, default=1000, help="first size")
    p.add_argument("--tiers", action="store_true",
                   help="switch the opt-in quick compile tier on (TORCHTPU_COMPILE_TIERS=1)")
    p.add_argument("--json")
    args = p.parse_args(argv)

    import torchtpu
    from torchtpu.eager import tiers

    if args.tiers:
        tiers.set_enabled(True)
    _body(7, "cpu")
    _body(7, "tpu")  # one-time costs (imports, the first executable) out of the timing
    sizes = list(range(args.start, args.start + args.n))
    cw, cc = _run("cpu", sizes)
    torchtpu.reset_metrics()
    tw, tc = _run("tpu", sizes)
    m = torchtpu.metrics()
    res = {
        "shapes": args.n, "tiers": tiers.quick_options() is not None,
        "cpu_wall_s": cw, "cpu_process_s": cc, "tpu_wall_s": tw, "tpu_process_s": tc,
        "ratio_wall": tw / cw, "ratio_process": tc / cc,
        **{k: m[k] for k in ("compiles", "compile_seconds", "quick_compiles",
                             "quick_compile_seconds", "tier_ups", "tier_up_seconds",
                             "cache_hits", "cache_misses")},
    }
    print(f"{args.n} shapes, quick tier {'on' if res['tiers'] else 'off'}: ms per shape "
          f"(wall / process CPU)")
    print(f"  cpu  {cw / args.n * 1e3:9.1f} / {cc / args.n * 1e3:9.1f}")
    print(f"  tpu  {tw / args.n * 1e3:9.1f} / {tc / args.n * 1e3:9.1f}")
    print(f"  ratio tpu/cpu  {res['ratio_wall']:7.1f}x wall  {res['ratio_process']:7.1f}x CPU")
    print(f"  compiles {m['compiles']} ({m['compile_seconds']:.2f} s), quick {m['quick_compiles']} "
          f"({m['quick_compile_seconds']:.2f} s), tier-ups {m['tier_ups']} "
          f"({m['tier_up_seconds']:.2f} s), cache hits {m['cache_hits']}, "
          f"misses {m['cache_misses']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
