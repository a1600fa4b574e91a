"""Quantize a (tiny, random) Llama with torchao on tpu and on CPU, the same config on
both; the quantized weights, the logits and the greedy ids compared.

    python examples/quantize_llama.py [--config int8wo|int8dyn|int4wo|all] [--tokens 16]

Configs: ``int8wo`` (``Int8WeightOnlyConfig``), ``int4wo`` (``IntxWeightOnlyConfig``, int4
in groups of 32), ``int8dyn`` (``Int8DynamicActivationInt8WeightConfig``: int8 activations
times int8 weights, an integer dot on tpu).  Dynamic activation quantization rounds
``x / s`` per token, so a float32 rounding difference upstream can move an activation by
one int8 step: CPU does that to itself (its embeddings one ulp up), so for ``int8dyn`` the
logits are held to within twice CPU's own change (the project's noise rule), and greedy
ids of a random model (whose top logits are nearly tied) are shown, not required to match.
"""

import argparse
import copy
import sys
import warnings

import torch
import transformers

warnings.filterwarnings("ignore")
from torchao.quantization import (Int8DynamicActivationInt8WeightConfig,  # noqa: E402
                                  Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_)
from torchao.quantization.granularity import PerGroup  # noqa: E402

import torchtpu  # noqa: E402

CONFIGS = {
    "int8wo": lambda: Int8WeightOnlyConfig(),
    "int4wo": lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
    "int8dyn": lambda: Int8DynamicActivationInt8WeightConfig(),
}


def tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def same_weights(cpu, dev) -> bool:
    for a, b in zip(cpu.parameters(), dev.parameters()):
        if hasattr(a, "__tensor_flatten__"):
            names, _ = a.__tensor_flatten__()
            if not all(torch.equal(getattr(a, n), getattr(b, n).cpu()) for n in names):
                return False
    return True


def run(name: str, tokens: int) -> bool:
    cpu = tiny_llama()
    dev = copy.deepcopy(cpu).to("tpu")
    for m in (cpu, dev):
        quantize_(m, CONFIGS[name]())
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        emb = cpu.model.embed_tokens(ids)
        want = cpu(inputs_embeds=emb).logits
        noise = cpu(inputs_embeds=torch.nextafter(emb, torch.full_like(emb, 1e9))).logits
        got = dev(ids.to("tpu")).logits.cpu()
        kw = dict(max_new_tokens=tokens, do_sample=False, pad_token_id=0)
        ids_cpu = cpu.generate(ids, **kw)
        ids_tpu = dev.generate(ids.to("tpu"), **kw).cpu()
    diff = float((got - want).abs().max())
    own = float((noise - want).abs().max())
    weights = same_weights(cpu, dev)
    same_ids = torch.equal(ids_cpu, ids_tpu)
    if name == "int8dyn":
        ok = weights and diff <= 2 * own + 1e-6
    else:
        ok = weights and diff <= 1e-5 and same_ids
    print(f"{name}: quantized weights {'equal' if weights else 'DIFFER'}; "
          f"max |logits tpu - cpu| {diff:.2e} (CPU vs itself 1 ulp up: {own:.2e}); "
          f"greedy ids {'equal' if same_ids else 'differ'} "
          f"({ids_tpu[0, 9:].tolist()})  {'ok' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=[*CONFIGS, "all"], default="all")
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    torch.tpu.enable_cpu_fallback = False
    names = list(CONFIGS) if args.config == "all" else [args.config]
    ok = all([run(n, args.tokens) for n in names])
    ok &= not torchtpu.metrics()["fallbacks"]
    print("matches CPU" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
