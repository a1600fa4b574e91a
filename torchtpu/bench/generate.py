"""Greedy ``generate()`` of tiny MoE (and dense) models, per eager mode, fresh processes.

    python -m torchtpu.bench generate [--models mixtral,qwen_moe,llama,llama128]
                                      [--tokens 16] [--modes strict,defer_and_fuse,compiled]
                                      [--calls 3 | --prompts 12,17,17] [--json PATH]

Each (model, mode) runs in a child process of its own with an empty persistent cache
(``TORCHTPU_CACHE_DIR`` in a new temporary folder), as a new user's first run would: the
model is built from a config (random weights, ``torch.manual_seed(0)``), its CPU
``generate`` gives the reference ids (and the CPU time of each call), then ``generate``
runs ``--calls`` times on ``tpu`` with the same prompt, or once per length in
``--prompts`` (``--models llama128 --modes strict --tokens 64 --prompts 12,17,17``:
issue 29's rows, first call, a new prompt length, the same call again).  Reported per
call: wall seconds, CPU seconds and the ratio, XLA compiles and their seconds,
fused segments compiled / run from cache / replayed op by op (DEFER_AND_FUSE,
``metrics()["defer_adaptive"]``), cat appends into spare capacity
(``metrics()["growth"]``), host syncs, and whether the ids equal CPU's; then each mode's
first-call and steady-call ratios to STRICT.  The load average is printed beside the
table.  Mode ``compiled``: STRICT eager with ``model.forward`` under
``torch.compile(backend="tpu")`` (``graph exes``: the graph executables built, one per
capacity bucket of the KV cache with ``torchtpu.compile.seq_buckets``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

MODELS = ("mixtral", "qwen_moe", "llama", "llama128")


def build(kind: str):
    """A tiny causal LM on CPU, random weights (``torch.manual_seed(0)``): ``kind`` is
    ``"mixtral"`` (4 experts, top-2), ``"qwen_moe"`` (4 experts, top-2, shared expert)
    or ``"llama"``; 2 layers, hidden 64, vocab 256."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256)
    if kind == "mixtral":
        m = tf.MixtralForCausalLM(tf.MixtralConfig(intermediate_size=128, num_local_experts=4,
                                                   num_experts_per_tok=2, **common))
    elif kind == "qwen_moe":
        m = tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(
            intermediate_size=128, moe_intermediate_size=64,
            shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
            **common))
    elif kind == "llama":
        m = tf.LlamaForCausalLM(tf.LlamaConfig(intermediate_size=128, **common))
    elif kind == "llama128":  # issue 29's tiny Llama: hidden 128, 2 layers
        common.update(hidden_size=128, max_position_embeddings=512)
        m = tf.LlamaForCausalLM(tf.LlamaConfig(intermediate_size=256, **common))
    else:
        raise ValueError(f"unknown model {kind!r}: expected one of {', '.join(MODELS)}")
    return m.eval()


def child(kind: str, mode: str, tokens: int, prompts: list) -> list:
    """Run in a fresh process: the per-call rows of one (model, mode), one call per
    prompt length in ``prompts``; each call's CPU time is the same call on CPU PyTorch
    (after one CPU warm-up call), measured in this process."""
    import time

    import torch

    import torchtpu

    model = build(kind)

    def prompt(n):
        return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(n))

    def gen(ids):
        with torch.no_grad():  # min_new_tokens: every call makes ``tokens`` tokens
            return model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens,
                                  do_sample=False)

    gen(prompt(prompts[0]))  # CPU warm-up
    refs, cpu_s = {}, {}
    for n in dict.fromkeys(prompts):
        t0 = time.perf_counter()
        refs[n] = gen(prompt(n))
        cpu_s[n] = time.perf_counter() - t0
    model.to("tpu")
    torch.tpu.set_eager_mode("strict" if mode == "compiled" else mode)
    if mode == "compiled":
        model.forward = torch.compile(model.forward, backend="tpu")
    rows = []
    for call, n in enumerate(prompts):
        torchtpu.reset_metrics()
        t0 = time.perf_counter()
        out = gen(prompt(n).to("tpu")).cpu()
        dt = time.perf_counter() - t0
        m = torchtpu.metrics()
        ref = refs[n]
        rows.append({
            "model": kind, "mode": mode, "call": call + 1, "prompt": n, "seconds": dt,
            "cpu_seconds": cpu_s[n], "growth_appends": m["growth"]["appends"],
            "host_syncs": m["host_syncs_total"],
            "compiles": m["compiles"], "compile_seconds": m["compile_seconds"],
            "graph_executables": m["compile"]["executables"],
            "segments_compiled": m["segment_cache_misses"]
            - m["defer_adaptive"]["segments_replayed"],
            "segment_hits": m["segment_cache_hits"],
            "segments_replayed": m["defer_adaptive"]["segments_replayed"],
            "same_ids_as_cpu": bool(torch.equal(out, ref)),
        })
    return rows


def _run_child(kind, mode, tokens, prompts):
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHTPU_CACHE_DIR=cache)
        env.pop("TORCHTPU_EAGER_MODE", None)
        p = subprocess.run(
            [sys.executable, "-m", "torchtpu.bench.generate", "--child", kind, mode,
             str(tokens), ",".join(map(str, prompts))],
            capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"generate bench child {kind}/{mode} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mixtral,qwen_moe")
    p.add_argument("--modes", default="strict,defer_and_fuse")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--calls", type=int, default=3,
                   help="calls with the same 12-token prompt (unless --prompts)")
    p.add_argument("--prompts", help="prompt length of each call, e.g. 12,17,17 (issue 29's "
                   "rows: first call, a new prompt length, the same again)")
    p.add_argument("--json")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, mode, tokens, prompts = args.child
        print(json.dumps(child(kind, mode, int(tokens), [int(x) for x in prompts.split(",")])))
        return 0
    prompts = ([int(x) for x in args.prompts.split(",")] if args.prompts
               else [12] * args.calls)
    load0 = os.getloadavg()
    rows = []
    for kind in args.models.split(","):
        for mode in args.modes.split(","):
            rows += _run_child(kind, mode, args.tokens, prompts)
    load1 = os.getloadavg()
    print(f"generate(max_new_tokens={args.tokens}), greedy; fresh process and empty "
          f"cache per (model, mode); load average {load0[0]:.2f} -> {load1[0]:.2f}; "
          f"cpu s: the same call on CPU PyTorch in the same process")
    hdr = (f"{'model':<9} {'mode':<15} {'call':>4} {'prompt':>6} {'s':>7} {'cpu s':>6} "
           f"{'/cpu':>7} {'/strict':>7} {'compiles':>8} "
           f"{'compile s':>9} {'graph exes':>10} {'seg comp':>8} {'seg hit':>7} "
           f"{'replayed':>8} {'grown':>5} "
           f"{'syncs':>5} {'= cpu':>5}")
    print(hdr)
    base = {(r["model"], r["call"]): r["seconds"] for r in rows if r["mode"] == "strict"}
    for r in rows:
        b = base.get((r["model"], r["call"]))
        ratio = f"{r['seconds'] / b:.2f}x" if b else "-"
        r["ratio_to_strict"] = r["seconds"] / b if b else None
        print(f"{r['model']:<9} {r['mode']:<15} {r['call']:>4} {r['prompt']:>6} "
              f"{r['seconds']:>7.2f} {r['cpu_seconds']:>6.2f} "
              f"{r['seconds'] / r['cpu_seconds']:>6.1f}x "
              f"{ratio:>7} {r['compiles']:>8} {r['compile_seconds']:>9.2f} "
              f"{r['graph_executables']:>10} "
              f"{r['segments_compiled']:>8} {r['segment_hits']:>7} "
              f"{r['segments_replayed']:>8} {r['growth_appends']:>5} {r['host_syncs']:>5} "
              f"{str(r['same_ids_as_cpu']):>5}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "loadavg": [load0, load1], "tokens": args.tokens}, f,
                      indent=1)
    return 0 if all(r["same_ids_as_cpu"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
