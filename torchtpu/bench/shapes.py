"""New-shape cost: a few ops looped over N distinct shapes, tpu vs CPU, in one run.

    python -m torchtpu.bench shapes [--n 40] [--tiers] [--json PATH]
    python -m torchtpu.bench shapes --varlen [--compiled]

PyTorch's device tests (and a model's first step) run many signatures only once, so
their cost is compile cost, not per-op dispatch.  For each of N shapes this runs
``uniform_``, ``randn``, ``cumsum``, ``abs``, ``max``, a dtype conversion, an
``index_put`` with accumulate and a read back to the host, on CPU and then on ``tpu``,
and prints the time per shape (wall and process CPU seconds), the tpu/CPU ratio and the
compile counters (``compiles``, ``quick_compiles``, ``tier_ups``, compile seconds).
``--tiers`` switches the opt-in quick compile tier on (``torchtpu.eager.tiers``).

``--varlen`` (issue 29's training rows) trains a tiny Llama (hidden 128, 2 layers, AdamW,
batch 4) for two epochs of one step per sequence length (40..116, 8 lengths), in a fresh
process with an empty persistent cache, first on CPU and then on ``tpu`` (``--compiled``:
the step under ``torch.compile(backend="tpu", dynamic=True)``), and prints per epoch the
seconds, the ratio to CPU, XLA compiles and their seconds and the host syncs (shape
buckets' among them); the losses are compared with CPU's.

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


VARLEN_LENGTHS = (40, 51, 62, 73, 84, 95, 106, 116)


def _varlen_child(compiled: bool) -> dict:
    """Two epochs of a tiny Llama over ``VARLEN_LENGTHS`` on CPU, then on tpu."""
    import transformers as tf

    import torchtpu

    def model():
        torch.manual_seed(0)
        cfg = tf.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                             num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=256)
        return tf.LlamaForCausalLM(cfg)

    batches = [torch.randint(0, 256, (4, n), generator=torch.Generator().manual_seed(n))
               for n in VARLEN_LENGTHS]

    def epochs(device):
        m = model().to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

        def step(ids):
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        if compiled and device != "cpu":
            step = torch.compile(step, backend="tpu", dynamic=True)
        rows = []
        for epoch in range(2):
            if device != "cpu":
                torchtpu.reset_metrics()
            t0 = time.perf_counter()
            losses = [step(b.to(device)) for b in batches]
            losses = [float(x) for x in losses]
            dt = time.perf_counter() - t0
            row = {"epoch": epoch + 1, "seconds": dt, "losses": losses}
            if device != "cpu":
                mt = torchtpu.metrics()
                row.update(compiles=mt["compiles"], compile_seconds=mt["compile_seconds"],
                           host_syncs=mt["host_syncs_total"],
                           shape_syncs=sum(v for k, v in mt["host_syncs"].items()
                                           if k.startswith("shape_bucket")))
            rows.append(row)
        return rows

    return {"cpu": epochs("cpu"), "tpu": epochs("tpu")}


def varlen(compiled: bool) -> dict:
    """Run :func:`_varlen_child` in a fresh process with an empty persistent cache and
    print its table."""
    import os
    import subprocess
    import sys
    import tempfile

    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHTPU_CACHE_DIR=cache)
        env.pop("TORCHTPU_EAGER_MODE", None)
        p = subprocess.run([sys.executable, "-m", "torchtpu.bench.shapes", "--varlen-child"]
                           + (["--compiled"] if compiled else []),
                           capture_output=True, text=True, env=env, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"varlen child failed:\n{p.stderr[-3000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    load1 = os.getloadavg()
    print(f"variable-length training, lengths {list(VARLEN_LENGTHS)}, batch 4, "
          f"{'torch.compile(dynamic=True)' if compiled else 'strict eager'}; fresh process, "
          f"empty cache; load average {load0[0]:.2f} -> {load1[0]:.2f}")
    print(f"{'epoch':>5} {'cpu s':>7} {'tpu s':>7} {'/cpu':>7} {'compiles':>8} "
          f"{'compile s':>9} {'syncs':>5} {'shape syncs':>11} {'max loss rel diff':>17}")
    for c, t in zip(res["cpu"], res["tpu"]):
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(t["losses"], c["losses"]))
        t["max_loss_rel_diff"] = diff
        print(f"{t['epoch']:>5} {c['seconds']:>7.2f} {t['seconds']:>7.2f} "
              f"{t['seconds'] / c['seconds']:>6.1f}x {t['compiles']:>8} "
              f"{t['compile_seconds']:>9.2f} {t['host_syncs']:>5} {t['shape_syncs']:>11} "
              f"{diff:>17.2e}")
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=40, help="number of distinct shapes")
    p.add_argument("--start", type=int, default=1000, help="first size")
    p.add_argument("--tiers", action="store_true",
                   help="switch the opt-in quick compile tier on (TORCHTPU_COMPILE_TIERS=1)")
    p.add_argument("--json")
    p.add_argument("--varlen", action="store_true",
                   help="variable-length training epochs instead (see the module docstring)")
    p.add_argument("--compiled", action="store_true",
                   help="--varlen: the step under torch.compile(backend='tpu', dynamic=True)")
    p.add_argument("--varlen-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.varlen_child:
        print(json.dumps(_varlen_child(args.compiled)))
        return None
    if args.varlen:
        res = varlen(args.compiled)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=2)
        return res

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
