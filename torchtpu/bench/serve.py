"""Serving throughput with vLLM on tpu against Hugging Face ``generate`` one request at a time.

    .venv-vllm/bin/python -m torchtpu.bench serve [--model llama|mixtral] [--requests 16]
                                                  [--tokens 64] [--no-hf-tpu] [--json PATH]

Needs vLLM (the serving venv: ``make test-vllm`` makes ``.venv-vllm``).  The model is a
tiny Llama or Mixtral (4 experts, top-2) built from a config (2 layers, hidden 64, random
weights, seed 0; no tokenizer: prompts are token ids), measured in a child process whose persistent compile
cache is a new empty folder (``TORCHTPU_CACHE_DIR``), as a new user's first run.  Rows, in
that one process:

* ``start-up``: ``LLM(...)`` until it serves, with the plugin's compile of every token
  bucket (seconds, XLA compiles and their seconds);
* ``batch 1`` / ``batch 2`` / ``batch 3``: ``--requests`` greedy requests of ``--tokens``
  new tokens each (prompt lengths 4-23 drawn with seed 0; batch 2 repeats batch 1's
  prompts, batch 3 has new ones: a new batch composition), submitted together (vLLM's
  continuous batching);
* ``HF CPU 1x1`` / ``HF tpu 1x1``: Hugging Face ``generate`` of the same requests one by
  one on the CPU and (STRICT eager) on tpu, after one warm-up call;
* ``round k``: ``--rounds`` more pairs, each a vLLM batch of new prompts then HF
  ``generate`` on the CPU of the same prompts one by one, right after it: the ratio of
  each pair, and their median, which a slow moment of a noisy host moves less than a
  single batch row.

Each row: wall seconds, generated tokens per second, XLA compiles in the row, and the
ratio of its tokens/s to HF on the CPU.  vLLM sets torch's threads to 1 for serving;
the HF rows run after it in the same process, with the same threads.  The load average
is printed beside the table.
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


MODELS = ("llama", "mixtral")


def _tiny_model(kind: str, out_dir: str) -> str:
    """A 2-layer ``kind`` model (``"llama"``, or ``"mixtral"``: 4 experts, top-2; hidden
    64, vocab 256, random weights, seed 0) in ``out_dir``."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=None)  # (no EOS: every request makes
    # exactly --tokens tokens on both sides; with an EOS id HF's min_new_tokens bans it
    # while vLLM's ignore_eos may emit it: false "same ids" mismatches)
    if kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**common))
    elif kind == "mixtral":
        model = tf.MixtralForCausalLM(tf.MixtralConfig(num_local_experts=4,
                                                       num_experts_per_tok=2, **common))
    else:
        raise ValueError(f"unknown model {kind!r}: expected one of {', '.join(MODELS)}")
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def run(requests: int, tokens: int, hf_tpu: bool = True, kind: str = "llama",
        rounds: int = 5) -> list:
    """The rows of the module docstring, as dicts (``row``, ``seconds``, ``tokens``,
    ``tok_s``, ``compiles``, ``compile_seconds``; a round's also ``hf_cpu_seconds`` and
    ``vs_hf_cpu``, its own pair's ratio)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in-process
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import torchtpu

    g = torch.Generator().manual_seed(0)

    def prompts():
        lens = torch.randint(4, 24, (requests,), generator=g)
        return [[1] + torch.randint(3, 250, (int(n),), generator=g).tolist() for n in lens]

    first, new = prompts(), prompts()
    rows = []

    def row(name, seconds, n, m0=None):
        m = torchtpu.metrics()
        rows.append({"row": name, "seconds": seconds, "tokens": n, "tok_s": n / seconds,
                     "compiles": None if m0 is None else m["compiles"] - m0["compiles"],
                     "compile_seconds": None if m0 is None
                     else m["compile_seconds"] - m0["compile_seconds"]})

    with tempfile.TemporaryDirectory() as d:
        model = _tiny_model(kind, os.path.join(d, "model"))
        m0 = torchtpu.metrics()
        t0 = time.perf_counter()
        llm = LLM(model=model, dtype="float32", max_model_len=256, max_num_seqs=requests,
                  kv_cache_memory_bytes=32 << 20, seed=0, skip_tokenizer_init=True)
        row("start-up", time.perf_counter() - t0, 0, m0)
        sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True,
                            detokenize=False)
        outs = {}
        for name, ps in (("batch 1", first), ("batch 2 (same)", first),
                         ("batch 3 (new prompts)", new)):
            m0 = torchtpu.metrics()
            t0 = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], sp,
                               use_tqdm=False)
            row(name, time.perf_counter() - t0, sum(len(o.outputs[0].token_ids)
                                                     for o in out), m0)
            outs[name] = [list(o.outputs[0].token_ids) for o in out]
        import transformers as tf

        hf = tf.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        devices = ["cpu"] + (["tpu"] if hf_tpu else [])
        for dev in devices:
            hf.to(dev)
            m0 = torchtpu.metrics()
            same = 0
            with torch.no_grad():
                def gen(p):
                    return hf.generate(torch.tensor([p], device=dev), max_new_tokens=tokens,
                                       do_sample=False)
                gen(new[0])  # (warm-up)
                t0 = time.perf_counter()
                for p, ids in zip(new, outs["batch 3 (new prompts)"]):
                    got = gen(p)[0, len(p):].cpu().tolist()
                    same += got == ids
                dt = time.perf_counter() - t0
            row(f"HF {dev} 1x1", dt, requests * tokens, m0 if dev == "tpu" else None)
            rows[-1]["same_ids_as_vllm"] = f"{same}/{requests}"
        hf.to("cpu")
        base = next(r["tok_s"] for r in rows if r["row"] == "HF cpu 1x1")
        for r in rows:
            r["vs_hf_cpu"] = r["tok_s"] / base if r["tokens"] else None
        for k in range(1, rounds + 1):
            ps = prompts()
            m0 = torchtpu.metrics()
            t0 = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], sp,
                               use_tqdm=False)
            row(f"round {k}", time.perf_counter() - t0,
                sum(len(o.outputs[0].token_ids) for o in out), m0)
            same = 0
            with torch.no_grad():
                t0 = time.perf_counter()
                for p, o in zip(ps, out):
                    got = hf.generate(torch.tensor([p]), max_new_tokens=tokens,
                                      do_sample=False)[0, len(p):].tolist()
                    same += got == list(o.outputs[0].token_ids)
                dt = time.perf_counter() - t0
            r = rows[-1]
            r["hf_cpu_seconds"] = dt
            r["vs_hf_cpu"] = r["tok_s"] / (requests * tokens / dt)
            r["same_ids_as_vllm"] = f"{same}/{requests}"
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama", choices=MODELS)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--no-hf-tpu", action="store_true", help="skip HF generate on tpu")
    p.add_argument("--rounds", type=int, default=5,
                   help="paired rounds (a vLLM batch, then HF on the CPU) after the rows")
    p.add_argument("--json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("torchtpu.bench serve needs vLLM: run it in the serving venv "
              "(make test-vllm makes .venv-vllm), e.g. "
              ".venv-vllm/bin/python -m torchtpu.bench serve")
        return 2
    if a.child:  # (the measuring process: an empty compile cache set by its parent)
        print(json.dumps(run(a.requests, a.tokens, hf_tpu=not a.no_hf_tpu, kind=a.model,
                             rounds=a.rounds)))
        return 0
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHTPU_CACHE_DIR=cache)
        cmd = [sys.executable, "-m", "torchtpu.bench.serve", "--child", "--model", a.model,
               "--requests", str(a.requests), "--tokens", str(a.tokens),
               "--rounds", str(a.rounds)]
        p = subprocess.run(cmd + (["--no-hf-tpu"] if a.no_hf_tpu else []), env=env,
                           capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        print(p.stdout[-3000:] + p.stderr[-5000:])
        return p.returncode
    rows = json.loads(p.stdout.strip().splitlines()[-1])
    load1 = os.getloadavg()
    print(f"\nvLLM on tpu, {a.requests} requests x {a.tokens} new tokens, greedy, tiny "
          f"{a.model} (2 layers, hidden 64); load average {load0[0]:.2f} -> {load1[0]:.2f}")
    print(f"{'row':24} {'s':>7} {'tokens':>7} {'tok/s':>8} {'/HF cpu':>8} {'compiles':>9} "
          f"{'compile s':>9}  same ids")
    for r in rows:
        ratio = f"{r['vs_hf_cpu']:.2f}x" if r["vs_hf_cpu"] else "-"
        comp = "-" if r["compiles"] is None else str(r["compiles"])
        cs = "-" if r["compile_seconds"] is None else f"{r['compile_seconds']:.2f}"
        print(f"{r['row']:24} {r['seconds']:7.2f} {r['tokens']:7d} "
              f"{r['tok_s'] if r['tokens'] else 0:8.0f} {ratio:>8} {comp:>9} {cs:>9}  "
              f"{r.get('same_ids_as_vllm', '')}")
    paired = sorted(r["vs_hf_cpu"] for r in rows if r["row"].startswith("round "))
    if paired:
        print(f"rounds (each vLLM batch / HF cpu on its prompts right after): median "
              f"{statistics.median(paired):.2f}x, range {paired[0]:.2f}-{paired[-1]:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "loadavg": [load0, load1]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
