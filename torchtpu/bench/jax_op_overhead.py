"""``torchtpu.jax_op`` call overhead vs a native lowered op, per eager mode.

    python -m torchtpu.bench.jax_op_overhead [--iters 500] [--size 16] [--grad] [--json PATH]

Times ``torch.sin(x)`` (the ATen op, through the lowering table) and a ``jax_op`` wrapping
``jnp.sin`` on the same small ``tpu`` tensor, in STRICT, DEBUG and DEFER_AND_FUSE.  As in
``torchtpu.bench overhead``, what is measured is the host-side cost of issuing one call
(results are not waited for, except DEBUG, which waits for every op by definition); one
``torch.tpu.synchronize()`` ends each batch.  :func:`measure` is importable (the
``kernels`` benchmark reports it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

MODES = ("strict", "debug", "defer_and_fuse")
_OP = []


def _sin_op():
    if not _OP:
        import jax.numpy as jnp

        import torchtpu

        _OP.append(torchtpu.jax_op("torchtpu_bench::jax_sin", lambda x: jnp.sin(x)))
    return _OP[0]


def _median_us(fn, iters, reps):
    for _ in range(max(20, iters // 10)):
        fn()
    torch.tpu.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.tpu.synchronize()
        times.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(times)


def _pair(x, op, iters, reps):
    holder = {}

    def lowered():
        holder["v"] = torch.sin(x)

    def jaxop():
        holder["v"] = op(x)

    # interleaved, best of 3, so both see the same machine load
    a, b = [], []
    for _ in range(3):
        a.append(_median_us(lowered, iters, reps))
        b.append(_median_us(jaxop, iters, reps))
    return min(a), min(b)


def measure(modes=MODES, iters: int = 500, reps: int = 7, size: int = 16,
            grad: bool = False) -> dict:
    """Median µs per call of ``torch.sin`` and of a ``jax_op`` of ``jnp.sin`` on a
    ``size x size`` float32 tpu tensor, per eager mode.

    Args:
        modes: eager mode names (as ``torch.tpu.set_eager_mode`` takes them).
        iters, reps: calls per timed batch, batches per median.
        grad: also time calls on an input that requires grad (autograd records them).

    Returns:
        ``{mode: {"lowered_us": float, "jax_op_us": float, "ratio": jax_op/lowered}}``;
        with ``grad``, each mode also has ``"lowered_grad_us"``, ``"jax_op_grad_us"``,
        ``"grad_ratio"``.
    """
    import torchtpu  # noqa: F401

    op = _sin_op()
    x = torch.randn(size, size, device="tpu")
    xg = x.clone().requires_grad_()
    res = {}
    for mode in modes:
        with torch.tpu.set_eager_mode(mode):
            lo, jo = _pair(x, op, iters, reps)
            r = res[mode] = {"lowered_us": lo, "jax_op_us": jo, "ratio": jo / lo}
            if grad:
                lo, jo = _pair(xg, op, iters, reps)
                r.update(lowered_grad_us=lo, jax_op_grad_us=jo, grad_ratio=jo / lo)
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--grad", action="store_true", help="also time inputs requiring grad")
    p.add_argument("--json")
    args = p.parse_args(argv)
    res = measure(iters=args.iters, size=args.size, grad=args.grad)
    print(f"µs per call, {args.size}x{args.size} float32 (torch.sin vs jax_op(jnp.sin)):")
    for mode, r in res.items():
        print(f"  {mode:15s} lowered {r['lowered_us']:8.2f}  jax_op {r['jax_op_us']:8.2f}  "
              f"ratio {r['ratio']:5.2f}x")
        if args.grad:
            print(f"  {mode + ' +grad':15s} lowered {r['lowered_grad_us']:8.2f}  jax_op "
                  f"{r['jax_op_grad_us']:8.2f}  ratio {r['grad_ratio']:5.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
