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

``--table [--runs 3]`` runs all of issue 29's rows (those generate calls in STRICT and
compiled, the variable-length epochs in STRICT and compiled, ``make demo`` from an empty
cache against the filled one), each run in fresh processes, and prints one markdown
table with every run's seconds, ratio, compiles, the load average and which targets
every run met.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
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


def _varlen_run(compiled: bool) -> dict:
    """:func:`_varlen_child`'s result, from a fresh process with an empty persistent
    cache; each tpu epoch row gets ``max_loss_rel_diff`` against CPU's losses."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHTPU_CACHE_DIR=cache)
        env.pop("TORCHTPU_EAGER_MODE", None)
        p = subprocess.run([sys.executable, "-m", "torchtpu.bench.shapes", "--varlen-child"]
                           + (["--compiled"] if compiled else []),
                           capture_output=True, text=True, env=env, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"varlen child failed:\n{p.stderr[-3000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    for c, t in zip(res["cpu"], res["tpu"]):
        t["max_loss_rel_diff"] = max(abs(a - b) / max(abs(b), 1e-12)
                                     for a, b in zip(t["losses"], c["losses"]))
    return res


def varlen(compiled: bool) -> dict:
    """Run :func:`_varlen_child` in a fresh process with an empty persistent cache and
    print its table."""
    load0 = os.getloadavg()
    res = _varlen_run(compiled)
    load1 = os.getloadavg()
    print(f"variable-length training, lengths {list(VARLEN_LENGTHS)}, batch 4, "
          f"{'torch.compile(dynamic=True)' if compiled else 'strict eager'}; fresh process, "
          f"empty cache; load average {load0[0]:.2f} -> {load1[0]:.2f}")
    print(f"{'epoch':>5} {'cpu s':>7} {'tpu s':>7} {'/cpu':>7} {'compiles':>8} "
          f"{'compile s':>9} {'syncs':>5} {'shape syncs':>11} {'max loss rel diff':>17}")
    for c, t in zip(res["cpu"], res["tpu"]):
        diff = t["max_loss_rel_diff"]
        print(f"{t['epoch']:>5} {c['seconds']:>7.2f} {t['seconds']:>7.2f} "
              f"{t['seconds'] / c['seconds']:>6.1f}x {t['compiles']:>8} "
              f"{t['compile_seconds']:>9.2f} {t['host_syncs']:>5} {t['shape_syncs']:>11} "
              f"{diff:>17.2e}")
    return res


def _demo_run() -> dict:
    """``python -m torchtpu.demo`` twice in fresh processes sharing a new, empty
    persistent cache (cold, then warm): each process's wall seconds and XLA compiles."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHTPU_CACHE_DIR=cache)
        env.pop("TORCHTPU_EAGER_MODE", None)
        for which in ("cold", "warm"):
            path = os.path.join(cache, f"demo-{which}.json")
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "torchtpu.demo", "--json", path],
                               capture_output=True, text=True, env=env, timeout=3600)
            wall = time.perf_counter() - t0
            if p.returncode != 0:
                raise RuntimeError(f"demo ({which}) failed:\n{p.stdout[-2000:]}"
                                   f"{p.stderr[-2000:]}")
            with open(path) as f:
                m = json.load(f)["metrics"]
            out[which] = {"seconds": wall, "compiles": m["compiles"],
                          "compile_seconds": m["compile_seconds"],
                          "host_syncs": m["host_syncs"]}
    return out


# issue 29's targets: row -> (what is compared, the bound)
_TARGETS = {
    "generate(64), first call": ("s", 10.0),
    "new prompt length": ("/cpu", 2.0),
    "var-len epoch 1": ("/cpu", 3.0),
    "compiled var-len epoch 1": ("s", 10.0),
    "make demo cold vs warm": ("/warm", 2.0),
}


def table(runs: int = 3) -> dict:
    """Issue 29's rows, ``runs`` times each, every row in fresh processes with an empty
    persistent cache: ``generate(max_new_tokens=64)`` of a tiny Llama (first call, a new
    prompt length, the same call again; STRICT and ``torch.compile(model.forward)``),
    variable-length training epochs (STRICT and ``torch.compile(dynamic=True)``) and
    ``make demo`` from an empty cache against the filled one.  Prints one markdown table
    (seconds, ratio, XLA compiles and their seconds per run, the load average at each
    run's start) and returns its rows."""
    from torchtpu.bench import generate as _gen

    rows: dict = {}

    def add(name, run, seconds, ratio, compiles, compile_s, extra=""):
        rows.setdefault(name, {})[run] = {"seconds": seconds, "ratio": ratio,
                                          "compiles": compiles,
                                          "compile_seconds": compile_s, "extra": extra}

    loads = []
    for run in range(runs):
        loads.append(os.getloadavg()[0])
        for mode in ("strict", "compiled"):
            g = _gen._run_child("llama128", mode, 64, [12, 17, 17])
            for r, what in zip(g, ("generate(64), first call", "new prompt length",
                                   "same call again")):
                add(f"{what} ({mode})", run, r["seconds"], r["seconds"] / r["cpu_seconds"],
                    r["compiles"], r["compile_seconds"], f"{r['host_syncs']} syncs")
        for compiled in (False, True):
            v = _varlen_run(compiled)
            for c, t in zip(v["cpu"], v["tpu"]):
                name = f"{'compiled ' if compiled else ''}var-len epoch {t['epoch']}"
                add(name, run, t["seconds"], t["seconds"] / c["seconds"], t["compiles"],
                    t["compile_seconds"], f"{t['shape_syncs']} shape syncs")
        d = _demo_run()
        add("make demo cold vs warm", run, d["cold"]["seconds"],
            d["cold"]["seconds"] / d["warm"]["seconds"], d["cold"]["compiles"],
            d["cold"]["compile_seconds"],
            f"warm {d['warm']['seconds']:.1f} s, "
            f"{sum(v for k, v in d['cold']['host_syncs'].items() if k.startswith('shape'))}"
            " shape syncs")
    print(f"issue 29's rows, {runs} run(s); load average (1 min) at each run's start: "
          + ", ".join(f"{x:.2f}" for x in loads) + f"; {os.cpu_count()} cores")
    print("| row | " + " | ".join(f"run {i + 1}: s (ratio), compiles (s)" for i in range(runs))
          + " | target |")
    print("|---" * (runs + 2) + "|")
    for name, per in rows.items():
        cells = []
        for i in range(runs):
            r = per[i]
            cells.append(f"{r['seconds']:.2f} ({r['ratio']:.1f}x), {r['compiles']} "
                         f"({r['compile_seconds']:.1f}); {r['extra']}")
        key = name.split(" (")[0]
        tgt = _TARGETS.get(key)
        if tgt is None:
            mark = "-"
        else:
            what, bound = tgt
            vals = [per[i]["seconds"] if what == "s" else per[i]["ratio"] for i in range(runs)]
            met = all(v <= bound for v in vals)
            mark = f"{'met' if met else 'NOT met'} (<= {bound:g}{' s' if what == 's' else 'x'})"
        print(f"| {name} | " + " | ".join(cells) + f" | {mark} |")
    return {"loads": loads, "rows": rows}


def _dump(path, res) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=2)


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
    p.add_argument("--table", action="store_true",
                   help="issue 29's rows in one table (generate, var-len epochs, make demo "
                   "cold vs warm; several minutes per run)")
    p.add_argument("--runs", type=int, default=3, help="--table: runs of every row")
    args = p.parse_args(argv)
    if args.table:
        res = table(args.runs)
        _dump(args.json, res)
        return res
    if args.varlen_child:
        print(json.dumps(_varlen_child(args.compiled)))
        return None
    if args.varlen:
        res = varlen(args.compiled)
        _dump(args.json, res)
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
    _dump(args.json, res)
    return res


if __name__ == "__main__":
    main()
