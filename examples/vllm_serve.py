"""vLLM serving on tpu: a tiny Llama (built from a config, its tokenizer trained with the
``tokenizers`` library: no download) served by vLLM's offline ``LLM`` and by its
OpenAI-compatible server, greedy outputs checked against Hugging Face on the CPU.

Needs the serving venv (``make test-vllm`` makes it: vLLM 0.33 pins torch 2.14.0):

    .venv-vllm/bin/python examples/vllm_serve.py            # offline LLM(...)
    .venv-vllm/bin/python examples/vllm_serve.py --server   # + vllm serve, one request

vLLM picks the tpu platform by itself (torchtpu's ``vllm.platform_plugins`` entry point):
nothing in this file names a device.  Each generated token is checked teacher-forced:
it must be CPU's argmax (up to near ties) with a log-probability within 2e-3.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

PROMPTS = ["the quick brown fox", "hello world, this is", "serving language models on",
           "a b c d"]


def make_tiny_llama(out_dir: str) -> str:
    """Write a 2-layer Llama (hidden 64, random weights, seed 0) and a byte-level BPE
    tokenizer of 259 tokens to ``out_dir``; returns it."""
    import torch
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = ["the quick brown fox jumps over the lazy dog", "hello world, this is a tiny model",
              "serving language models on tpu with vllm", "a b c d e f g h i j k l m n o p"] * 10
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=256, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                      unk_token="<unk>")
    fast.save_pretrained(out_dir)
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, bos_token_id=fast.bos_token_id,
                         eos_token_id=fast.eos_token_id, tie_word_embeddings=False)
    tf.LlamaForCausalLM(cfg).save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def check_against_cpu(model_dir: str, prompt_ids, outputs, tol: float = 2e-3) -> int:
    """Teacher-forced check of greedy ``outputs`` (lists of (token id, logprob)) against
    Hugging Face on the CPU: the number of tokens that are neither CPU's argmax (within
    1e-4 of it) nor within ``tol`` of CPU's log-probability."""
    import torch
    import transformers as tf

    hf = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    bad = 0
    for p, out in zip(prompt_ids, outputs):
        ids = [t for t, _ in out]
        with torch.no_grad():
            logits = hf(torch.tensor([list(p) + ids])).logits[0, len(p) - 1:-1]
        lp = torch.log_softmax(logits.double(), -1)
        for i, (t, got) in enumerate(out):
            best = lp[i].max()
            if best - lp[i, t] > 1e-4 or (got is not None and abs(got - float(lp[i, t])) > tol):
                bad += 1
                print(f"  token {i} of {list(p)}: {t} (logprob {got}); CPU argmax "
                      f"{int(lp[i].argmax())}, CPU logprob of {t} {float(lp[i, t]):.5f}")
    return bad


def offline(model_dir: str, tokens: int) -> int:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, dtype="float32", max_model_len=128, max_num_seqs=8,
              kv_cache_memory_bytes=16 << 20, seed=0)
    sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, logprobs=1)
    t0 = time.perf_counter()
    res = llm.generate(PROMPTS, sp)
    dt = time.perf_counter() - t0
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt_ids = [tok(p)["input_ids"] for p in PROMPTS]
    outs = [[(t, r.outputs[0].logprobs[i][t].logprob)
             for i, t in enumerate(r.outputs[0].token_ids)] for r in res]
    for p, r in zip(PROMPTS, res):
        print(f"  {p!r} -> {r.outputs[0].text!r}")
    print(f"LLM.generate: {len(PROMPTS)} prompts x {tokens} tokens in {dt:.1f} s "
          f"(platform {type(llm.llm_engine.vllm_config.device_config.device).__name__}: "
          f"{llm.llm_engine.vllm_config.device_config.device})")
    bad = check_against_cpu(model_dir, prompt_ids, outs)
    print(f"offline greedy outputs {'match CPU' if not bad else f'differ from CPU in {bad} tokens'}")
    return bad


def server(model_dir: str, tokens: int) -> int:
    """``vllm serve`` in a subprocess, one ``/v1/completions`` request, checked on CPU."""
    from transformers import AutoTokenizer

    port = 8321
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "vllm"), "serve",
                             model_dir, "--port", str(port), "--dtype", "float32",
                             "--max-model-len", "128", "--kv-cache-memory-bytes", str(16 << 20)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    print("vllm serve exited with", proc.returncode)
                    return 1
                time.sleep(1)
        body = {"model": model_dir, "prompt": PROMPTS[0], "max_tokens": tokens,
                "temperature": 0, "logprobs": 1, "ignore_eos": True,
                "return_tokens_as_token_ids": True}
        req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        choice = json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    tok = AutoTokenizer.from_pretrained(model_dir)
    lp = choice["logprobs"]
    ids = [int(t.split(":", 1)[1]) for t in lp["tokens"]]  # ("token_id:N")
    print(f"vllm serve: {PROMPTS[0]!r} -> {choice['text']!r}")
    bad = check_against_cpu(model_dir, [tok(PROMPTS[0])["input_ids"]],
                            [list(zip(ids, lp["token_logprobs"]))])
    print(f"server greedy completion {'matches CPU' if not bad else 'differs from CPU'}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", action="store_true", help="also run `vllm serve` once")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--model", help="a model directory (default: build the tiny Llama)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model_dir = a.model or make_tiny_llama(d)
        bad = offline(model_dir, a.tokens)
        if a.server:
            bad += server(model_dir, a.tokens)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
