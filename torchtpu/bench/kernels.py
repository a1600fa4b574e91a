"""``python -m torchtpu.bench kernels``: the hardware-layer kernels, measured.

Three tables (not a timed test; numbers depend on the machine):

1. **SDPA forward + backward**, causal, float32, batch 4, 8 heads, head dim 64, sequence
   512/1024/2048/4096 (``--seqs``): the fused path (``sdpa_kernel([FLASH_ATTENTION])``;
   on tpu the blockwise / Pallas / cuDNN kernel of ``torchtpu.ops.sdpa``, on CPU PyTorch's
   ``_scaled_dot_product_flash_attention_for_cpu``) against the math path
   (``sdpa_kernel([MATH])``, the full score matrix), on tpu and on CPU PyTorch.  Each
   configuration runs in a fresh subprocess.  Columns:

   * ``step ms``: median wall time of one forward+backward step after a warm-up step
     (which compiles), synchronized (``torch.tpu.synchronize()``);
   * ``peak MiB``: the process's peak resident memory *during the timed steps* above what
     it held when they started (Linux ``VmHWM`` after resetting it through
     ``/proc/self/clear_refs``, minus ``VmRSS`` then).  On the CPU PJRT platform device
     memory is host memory, so this is the device peak, XLA temporaries inside an
     executable included; compilation is excluded (it happens in the warm-up step);
   * ``live MiB`` (tpu only): peak bytes of live tpu tensors
     (``torch.tpu.max_memory_allocated()`` minus the inputs), which omits temporaries
     inside one executable (the blockwise kernel's score blocks);
   * ``path``: ``torchtpu.metrics()["sdpa"]``'s counter that moved (the path that ran).

2. **float32 1024x1024 matmul** on tpu at each ``torch.set_float32_matmul_precision``
   setting: time per product and the largest relative error against a float64 product.

3. **jax_op overhead**: ``torchtpu.bench.jax_op_overhead.measure()``.

``--json PATH`` writes every row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _status() -> dict:
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                d[line.split(":")[0]] = int(line.split()[1]) * 1024
    return d


def _reset_peak() -> int | None:
    """Reset the process's peak RSS; returns the current RSS (None where unsupported)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status()["VmRSS"]
    except OSError:
        return None


def _one(device: str, path: str, seq: int, batch: int, heads: int, dim: int, repeats: int,
         budget_s: float) -> dict:
    """One configuration, in this process (run by :func:`main` in a subprocess)."""
    import gc

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tpu = device == "tpu"
    if tpu:
        import torchtpu
    backend = [SDPBackend.FLASH_ATTENTION] if path == "fused" else [SDPBackend.MATH]
    g = torch.Generator().manual_seed(0)
    q, k, v, go = (torch.randn(batch, heads, seq, dim, generator=g) for _ in range(4))
    q, k, v = (t.to(device).requires_grad_() for t in (q, k, v))
    go = go.to(device)

    def sync():
        if tpu:
            torch.tpu.synchronize()

    def step():
        for t in (q, k, v):
            t.grad = None
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(go)
        sync()

    before = dict(torchtpu.metrics()["sdpa"]) if tpu else None
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    # the timing rule of torchtpu.bench.timing: warm up until a step builds nothing
    # (each step costs seconds here, so one quiet step, at most 4 warm-up steps)
    from torchtpu.bench import timing

    counters = timing.build_counters if tpu else (lambda: ())
    warm = 1
    while warm < 4:
        c0 = counters()
        step()
        warm += 1
        if counters() == c0:
            break
    c0 = counters()
    for t in (q, k, v):
        t.grad = None
    gc.collect()
    if tpu:
        torch.tpu.reset_peak_memory_stats()
        base_alloc = torch.tpu.memory_allocated()
    rss0 = _reset_peak()
    times = []
    while len(times) < repeats and (not times or sum(times) < budget_s):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = _status()["VmHWM"] - rss0 if rss0 is not None else None
    row = {"device": device, "path": path, "seq": seq, "batch": batch, "heads": heads,
           "head_dim": dim, "step_ms": statistics.median(times) * 1e3,
           "step_ms_min": min(times) * 1e3, "step_ms_max": max(times) * 1e3,
           "first_step_ms": first * 1e3, "steps": len(times), "warmup_steps": warm,
           "built_while_timing": sum(b - a for a, b in zip(c0, counters())),
           "peak_rss_bytes": peak, "loadavg": list(os.getloadavg())}
    if tpu:
        row["live_tensor_bytes"] = torch.tpu.max_memory_allocated() - base_alloc
        after = torchtpu.metrics()["sdpa"]
        row["ran"] = [p for p in after if after[p] != before[p]]
    return row


def _matmul_rows(n: int = 1024, reps: int = 10) -> list:
    import torch

    import torchtpu  # noqa: F401

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    ref = a.double() @ b.double()
    at, bt = a.to("tpu"), b.to("tpu")
    old = torch.get_float32_matmul_precision()
    rows = []
    try:
        for setting in ("highest", "high", "medium"):
            torch.set_float32_matmul_precision(setting)
            c = at @ bt
            torch.tpu.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                c = at @ bt
            torch.tpu.synchronize()
            dt = (time.perf_counter() - t0) / reps
            err = ((c.cpu().double() - ref).abs().max() / ref.abs().max()).item()
            rows.append({"setting": setting, "ms": dt * 1e3, "max_rel_err_vs_f64": err})
    finally:
        torch.set_float32_matmul_precision(old)
    return rows


def _jax_op_rows():
    """``torchtpu.bench.jax_op_overhead.measure()`` (µs per call of a jax_op vs a lowered
    op in each eager mode), or the error text when it fails."""
    from torchtpu.bench import jax_op_overhead

    try:
        return jax_op_overhead.measure()
    except Exception as e:  # report, keep the other tables
        return f"failed: {type(e).__name__}: {e}"


def _mib(b):
    return "-" if b is None else f"{b / 2**20:.0f}"


def _print_sdpa(rows):
    print("\nSDPA forward+backward, causal, float32 "
          f"(batch {rows[0]['batch']}, heads {rows[0]['heads']}, head dim {rows[0]['head_dim']})"
          if rows else "")
    from torchtpu.bench import timing

    print(timing.load_line())
    print("| seq | device | path | step ms median (min..max) | built while timed | "
          "peak MiB (RSS) | live MiB | ran |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['seq']} | {r['device']} | {r['path']} | {r['error']} | | | | |")
            continue
        print(f"| {r['seq']} | {r['device']} | {r['path']} | {r['step_ms']:.1f} "
              f"({r['step_ms_min']:.1f}..{r['step_ms_max']:.1f}) | {r['built_while_timing']} | "
              f"{_mib(r['peak_rss_bytes'])} | {_mib(r.get('live_tensor_bytes'))} | "
              f"{','.join(r.get('ran', [])) or '-'} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench kernels",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", default="512,1024,2048,4096",
                   help="comma-separated sequence lengths (default 512,1024,2048,4096)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="timed steps per configuration")
    p.add_argument("--budget", type=float, default=30.0,
                   help="stop repeating a configuration after this many seconds")
    p.add_argument("--devices", default="tpu,cpu", help="tpu, cpu or both (default)")
    p.add_argument("--paths", default="fused,math", help="fused, math or both (default)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds per configuration subprocess")
    p.add_argument("--skip-sdpa", action="store_true")
    p.add_argument("--json", metavar="PATH", help="write every row as JSON")
    p.add_argument("--one", nargs=3, metavar=("DEVICE", "PATH", "SEQ"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        row = _one(a.one[0], a.one[1], int(a.one[2]), a.batch, a.heads, a.dim, a.repeats,
                   a.budget)
        print("ROW " + json.dumps(row))
        return 0
    result = {"sdpa": [], "matmul": [], "jax_op": None}
    if not a.skip_sdpa:
        for seq in [int(s) for s in a.seqs.split(",") if s]:
            for device in a.devices.split(","):
                for path in a.paths.split(","):
                    cmd = [sys.executable, "-m", "torchtpu.bench", "kernels", "--one", device,
                           path, str(seq), "--batch", str(a.batch), "--heads", str(a.heads),
                           "--dim", str(a.dim), "--repeats", str(a.repeats), "--budget",
                           str(a.budget)]
                    try:
                        cp = subprocess.run(cmd, capture_output=True, text=True,
                                            timeout=a.timeout, env=dict(os.environ))
                        line = [x for x in cp.stdout.splitlines() if x.startswith("ROW ")]
                        if line:
                            row = json.loads(line[-1][4:])
                        else:
                            tail = (cp.stderr.strip().splitlines() or ["?"])[-1]
                            row = {"device": device, "path": path, "seq": seq,
                                   "error": f"failed (rc {cp.returncode}: {tail[:120]})"}
                    except subprocess.TimeoutExpired:
                        row = {"device": device, "path": path, "seq": seq,
                               "error": f"timed out after {a.timeout:.0f} s"}
                    result["sdpa"].append(row)
                    print(json.dumps(row), flush=True)
        _print_sdpa(result["sdpa"])
    result["matmul"] = _matmul_rows()
    print("\nfloat32 1024x1024 matmul on tpu by torch.set_float32_matmul_precision")
    print("| setting | XLA precision | ms | max rel err vs float64 |")
    print("|---|---|---|---|")
    xla = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}
    for r in result["matmul"]:
        print(f"| {r['setting']} | {xla[r['setting']]} | {r['ms']:.2f} | "
              f"{r['max_rel_err_vs_f64']:.2e} |")
    jr = _jax_op_rows()
    result["jax_op"] = jr
    print("\njax_op call overhead vs a lowered op (torch.sin vs a jax_op of jnp.sin, "
          "16x16 float32, µs per call)")
    if isinstance(jr, dict):
        print("| mode | lowered µs | jax_op µs | ratio |")
        print("|---|---|---|---|")
        for mode, r in jr.items():
            print(f"| {mode} | {r['lowered_us']:.1f} | {r['jax_op_us']:.1f} | "
                  f"{r['ratio']:.2f}x |")
    else:
        print(jr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
