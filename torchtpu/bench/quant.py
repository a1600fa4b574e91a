"""``python -m torchtpu.bench quant``: torchao's quantized matmuls and a quantized Llama
decode step on tpu, against float32 and bfloat16, and against CPU PyTorch running the
same quantized model in the same process (a table, not a timed test).

Rows: float32, bfloat16, int8 weight-only, int4 weight-only (groups of 32), int8 dynamic
activation + int8 weight (torchao 0.18 configs).  Columns, for ``--what linear`` (one
``nn.Linear(dim, dim)`` on a batch of ``--batch`` rows) and ``--what llama`` (one decode
step of a Llama with ``--layers`` layers, hidden ``--hidden``, a KV cache of ``--prompt``
tokens):

* ``tpu ms`` / ``cpu ms``: median per step over rounds, after warming up until no
  executable is built (``torchtpu.bench.timing``); min..max over rounds in brackets;
* ``weight MiB``: bytes of the quantized weights (every inner tensor of torchao's tensor
  subclasses: int8 data, scales, zero points) of the quantized layers;
* ``max |tpu-cpu|``: the largest output difference from CPU's same quantization;
* ``matmuls``: the ATen matrix products one step dispatches, with their operands' dtypes
  (``mm(int8,int8)`` is an integer dot with int32 accumulation; torchao's weight-only
  configs dequantize to the activation dtype and multiply in float).

Both columns run with the same torch threads; the load average is printed beside the
table.  ``--json PATH`` writes the rows.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import sys
import warnings

import torch

from torchtpu.bench import timing


def _configs():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.quantization import (Int8DynamicActivationInt8WeightConfig,
                                          Int8WeightOnlyConfig, IntxWeightOnlyConfig)
        from torchao.quantization.granularity import PerGroup
    return {
        "float32": None,
        "bfloat16": "bf16",
        "int8 weight-only": Int8WeightOnlyConfig(),
        "int4 weight-only g32": IntxWeightOnlyConfig(weight_dtype=torch.int4,
                                                     granularity=PerGroup(32)),
        "int8 dyn act + int8 w": Int8DynamicActivationInt8WeightConfig(),
    }


def _weight_bytes(model) -> int:
    n = 0
    for p in model.parameters():
        if hasattr(p, "__tensor_flatten__"):
            names, _ = p.__tensor_flatten__()
            n += sum(getattr(p, k).nbytes for k in names)
        elif p.dim() == 2:
            n += p.nbytes
    return n


def _matmul_census(fn) -> str:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = collections.Counter()

    class Census(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in ("mm", "addmm", "bmm", "_int_mm", "_weight_int8pack_mm",
                        "_scaled_mm", "linear", "matmul"):
                dts = ",".join(str(a.dtype).replace("torch.", "") for a in args
                               if isinstance(a, torch.Tensor))
                seen[f"{name}({dts})"] += 1
            return func(*args, **(kwargs or {}))

    with Census():
        fn()
    return " ".join(f"{k}x{v}" for k, v in sorted(seen.items()))


def _prepare(model, cfg):
    from torchao.quantization import quantize_

    if cfg == "bf16":
        return model.to(torch.bfloat16)
    if cfg is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_(model, cfg)
    return model


def _linear_case(args, cfg):
    torch.manual_seed(0)
    base = torch.nn.Linear(args.dim, args.dim)
    x = torch.randn(args.batch, args.dim)
    cpu = _prepare(copy.deepcopy(base), cfg)
    dev = _prepare(copy.deepcopy(base).to("tpu"), cfg)
    if cfg == "bf16":
        x = x.to(torch.bfloat16)
    xd = x.to("tpu")
    return cpu, dev, (lambda: cpu(x)), (lambda: dev(xd))


def _llama_case(args, cfg):
    import transformers

    c = transformers.LlamaConfig(vocab_size=512, hidden_size=args.hidden,
                                 intermediate_size=4 * args.hidden,
                                 num_hidden_layers=args.layers, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(c).eval()
    ids = torch.randint(0, 512, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    nxt = torch.randint(0, 512, (1, 1), generator=torch.Generator().manual_seed(2))

    def setup(model, device):
        with torch.no_grad():
            out = model(ids.to(device), use_cache=True)
        cache = out.past_key_values
        pos = torch.tensor([[args.prompt]], device=device)
        tok = nxt.to(device)

        def step():
            # the same step each time: a copy of the prompt's cache, one token appended
            with torch.no_grad():
                return model(tok, past_key_values=copy.deepcopy(cache), position_ids=pos,
                             use_cache=True).logits
        return step

    cpu = _prepare(copy.deepcopy(base), cfg)
    dev = _prepare(copy.deepcopy(base).to("tpu"), cfg)
    return cpu, dev, setup(cpu, "cpu"), setup(dev, "tpu")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torchtpu.bench quant",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--what", choices=["linear", "llama", "both"], default="both")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    try:
        configs = _configs()
    except ImportError as e:
        print(f"torchao is needed: pip install torchao==0.18.0 ({e})")
        return 2
    __import__("torchtpu")  # (the tpu device)

    whats = ["linear", "llama"] if args.what == "both" else [args.what]
    rows = []
    for what in whats:
        case = _linear_case if what == "linear" else _llama_case
        title = (f"nn.Linear({args.dim}, {args.dim}), batch {args.batch}" if what == "linear"
                 else f"Llama decode step: {args.layers} layers, hidden {args.hidden}, "
                      f"cache of {args.prompt} tokens")
        print(f"\n{title}  ({timing.load_line()}, {torch.get_num_threads()} torch threads)")
        print("| config | tpu ms | cpu ms | weight MiB | max abs tpu-cpu | matmuls (tpu) |")
        print("|---|---|---|---|---|---|")
        for name, cfg in configs.items():
            cpu, dev, cpu_step, dev_step = case(args, cfg)
            d = timing.measure(dev_step, lambda o: o.cpu(), rounds=args.rounds,
                               steps=args.steps)
            c = timing.measure(cpu_step, lambda o: o, rounds=args.rounds, steps=args.steps)
            diff = float((d["last"].detach().float() - c["last"].detach().float()).abs().max())
            row = {"what": what, "config": name, "tpu_ms": d["ms_median"],
                   "tpu_ms_range": [d["ms_min"], d["ms_max"]], "cpu_ms": c["ms_median"],
                   "cpu_ms_range": [c["ms_min"], c["ms_max"]],
                   "weight_bytes": _weight_bytes(dev), "max_abs_diff": diff,
                   "built_while_timing": d["built_while_timing"],
                   "matmuls": _matmul_census(dev_step)}
            rows.append(row)
            print(f"| {name} | {timing.fmt_ms(d)} | {timing.fmt_ms(c)} | "
                  f"{row['weight_bytes'] / 2**20:.2f} | {diff:.2e} | {row['matmuls']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
