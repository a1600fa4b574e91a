"""Hugging Face architecture sweep: every ``transformers`` auto-model class on ``tpu`` vs. CPU.

Usage (CLI)::

    python -m torchtpu.conformance models                     # everything (long)
    python -m torchtpu.conformance models --subset ci         # ~8 small architectures
    python -m torchtpu.conformance models --filter '^Llama' --jobs 2 --limit 20 --rerun

What it does, per model class:

1. **Enumerate**: every class named in the ``*_MAPPING_NAMES`` dicts of
   ``transformers.models.auto.modeling_auto`` (base models, causal/masked/seq2seq LM,
   sequence/token classification, QA, image classification, ...), deduplicated by class.
   Order: by task (:data:`TASK_ORDER`: base models first, so a partial run covers the
   widest set of architectures), then by class name.
2. **Tiny config** (:func:`tiny_config`): the default config of the model type
   (``AutoConfig.for_model``) rebuilt with hidden sizes 32, 2 layers, 2 heads / 1 KV head,
   intermediate sizes 48, vocab 1000 (special token ids remapped into range), max positions
   128, images 64x64 with patches <= 8, num_labels 3, recursively through sub-configs.
   If that config cannot build or run on CPU, milder tiers are tried
   (:data:`TIERS`); a model over :data:`MAX_PARAMS` parameters is not built.
3. **Inputs** from ``forward``'s signature (:func:`build_inputs`): ``input_ids``,
   ``attention_mask`` (second row right-padded by 2), ``token_type_ids``,
   ``decoder_input_ids``, ``pixel_values``, ``input_features``, ``input_values``, ``bbox``;
   batch 2, sequence 8.  Multimodal models whose image inputs fail are retried text-only.
4. ``torch.manual_seed(0)``, random weights, ``eval()``, CPU forward.  If building or the
   CPU forward fails: ``skipped-cpu``.  Otherwise ``copy.deepcopy(model).to("tpu")``,
   forward, and every output tensor (recursively through ``ModelOutput``/tuples) is
   compared with rtol=atol=1e-4 (:data:`FWD_TOL`).
5. Causal LMs also run 8 tokens of greedy ``generate()`` on both; the ids must be equal.
6. A fixed training sample (:func:`train_sample`: the first :data:`TRAIN_SAMPLE_SIZE`
   classes, alphabetically, of the causal-LM and masked-LM mappings) also runs one
   training step (``labels=input_ids``, eval mode so no dropout): the loss and every
   parameter gradient are compared with rtol=atol=1e-3.

Classes (worst first): ``mismatch`` (values differ; max abs error and which output),
``error`` (tpu raised; type, first line, and the missing ATen op for torchtpu's
"the ATen op 'aten.xxx' is not implemented"), ``timeout``, ``crash``, ``pass``,
``skipped-cpu`` (building or the CPU run failed: nothing to compare).

Each class runs in its own worker process (``multiprocessing`` forkserver with torch and
transformers preloaded; one process per architecture) under ``--timeout`` seconds.
Results are appended to ``conformance/models.json`` as they finish (resumable: recorded
classes are skipped unless ``--rerun``), and ``conformance/models.md`` summarizes them.
Workers share a JAX persistent compilation cache (``conformance/.jax_cache``) so that op
signatures common to many tiny models compile once.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import math
import multiprocessing as mp
import os
import re
import sys
import time
import traceback
from collections import Counter, defaultdict
from typing import Any, Optional

DEVICE = "tpu"
FWD_TOL = dict(rtol=1e-4, atol=1e-4)
TRAIN_TOL = dict(rtol=1e-3, atol=1e-3)
GEN_TOKENS = 8
BATCH, SEQ, DEC_SEQ = 2, 8, 4
MAX_PARAMS = 60_000_000
TRAIN_SAMPLE_SIZE = 20
DEFAULT_TIMEOUT = 300.0
OUT_DIR = "conformance"

# Small, representative architectures that run in a few minutes (``--subset ci``).
CI_SUBSET = (
    "BertModel",
    "DistilBertForMaskedLM",
    "RobertaForSequenceClassification",
    "GPT2LMHeadModel",
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "T5ForConditionalGeneration",
    "ViTForImageClassification",
)

# Enumeration order: tasks first in this order, then the remaining mappings alphabetically.
TASK_ORDER = (
    "MODEL_MAPPING_NAMES",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
)
_SKIP_MAPPINGS = {"CONFIG_MAPPING_NAMES"}

STATUSES = ("mismatch", "error", "timeout", "crash", "pass", "skipped-cpu")
_SEVERITY = {s: i for i, s in enumerate(STATUSES)}

_MISSING_OP_RE = re.compile(r"the ATen op '(aten\.[^']+)' is not implemented")

# ---------------------------------------------------------------------------------------
# Enumeration


def enumerate_architectures() -> list[dict]:
    """Every model class in the auto-model mappings: ``[{name, model_types, tasks}]``."""
    from transformers.models.auto import modeling_auto

    names = sorted(n for n in dir(modeling_auto)
                   if n.endswith("_MAPPING_NAMES") and n not in _SKIP_MAPPINGS
                   and isinstance(getattr(modeling_auto, n), dict))
    ordered = [n for n in TASK_ORDER if n in names] + [n for n in names if n not in TASK_ORDER]
    archs: dict[str, dict] = {}
    for mapping in ordered:
        task = mapping[: -len("_MAPPING_NAMES")]
        group = []
        for model_type, cls in getattr(modeling_auto, mapping).items():
            for c in (cls if isinstance(cls, (list, tuple)) else [cls]):
                if not isinstance(c, str):
                    continue
                if c not in archs:
                    archs[c] = {"name": c, "model_types": [], "tasks": []}
                    group.append(c)
                a = archs[c]
                if model_type not in a["model_types"]:
                    a["model_types"].append(model_type)
                if task not in a["tasks"]:
                    a["tasks"].append(task)
        # within a task: alphabetical
        group.sort()
        for c in group:
            archs[c]["_order"] = len([1 for a in archs.values() if "_order" in a])
    out = sorted(archs.values(), key=lambda a: a["_order"])
    for a in out:
        del a["_order"]
    return out


def is_causal_lm(arch: dict) -> bool:
    return "MODEL_FOR_CAUSAL_LM" in arch["tasks"]


def train_sample(archs: list[dict]) -> set[str]:
    """The fixed training-step sample: the first TRAIN_SAMPLE_SIZE causal/masked-LM class
    names in alphabetical order."""
    lm = sorted(a["name"] for a in archs
                if "MODEL_FOR_CAUSAL_LM" in a["tasks"] or "MODEL_FOR_MASKED_LM" in a["tasks"])
    return set(lm[:TRAIN_SAMPLE_SIZE])


# ---------------------------------------------------------------------------------------
# Tiny configs

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, VOCAB, MAXPOS = 32, 2, 1, 48, 2, 1000, 128
IMAGE, PATCH = 64, 8

_HIDDEN_KEYS = {"hidden_size", "d_model", "n_embd", "embed_dim", "dim", "hidden_dim",
                "word_embed_proj_dim", "projection_dim", "embedding_size", "d_embed",
                "emb_dim", "text_embed_dim", "vision_embed_dim", "proj_dim", "n_embed",
                "encoder_hidden_size", "decoder_hidden_size", "projection_size",
                "codevector_dim", "proj_codevector_dim", "classifier_proj_size",
                "hidden_size_per_head_ratio_dummy"}
_FFN_KEYS = {"intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner",
             "d_ff", "moe_intermediate_size", "shared_expert_intermediate_size",
             "ffn_hidden_size", "mlp_dim", "inner_dim", "encoder_intermediate_size",
             "decoder_intermediate_size", "dense_intermediate_size", "expert_intermediate_size"}
_LAYER_KEYS = {"num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
               "decoder_layers", "num_encoder_layers", "num_decoder_layers", "depth",
               "encoder_depth", "decoder_depth", "num_text_layers", "num_vision_layers",
               "num_decoder_hidden_layers", "decoder_num_hidden_layers", "n_head_layers"}
_HEAD_KEYS = {"num_attention_heads", "n_head", "n_heads", "encoder_attention_heads",
              "decoder_attention_heads", "num_heads", "decoder_num_attention_heads",
              "num_decoder_attention_heads", "encoder_num_attention_heads", "mamba_n_heads"}
_KV_KEYS = {"num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num",
            "encoder_num_key_value_heads", "decoder_num_key_value_heads"}
_HEAD_DIM_KEYS = {"head_dim", "d_kv", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                  "attention_head_dim", "kv_channels", "attention_head_size"}
_RANK_KEYS = {"kv_lora_rank", "q_lora_rank"}
_EXPERT_KEYS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}
_MAXPOS_KEYS = {"max_position_embeddings", "n_positions", "n_ctx", "max_target_positions",
                "max_seq_len", "max_sequence_length"}
_LIST_SIZE_KEYS = {"hidden_sizes", "embed_dims", "dims", "neck_hidden_sizes", "conv_dim",
                   "channels", "hidden_dims", "embedding_sizes", "widths", "out_channels"}
_LIST_DEPTH_KEYS = {"depths", "num_layers_per_stage", "layers", "num_blocks"}
_LIST_HEAD_KEYS = {"num_heads", "num_attention_heads", "heads"}
_NO_TOUCH = {"id2label", "label2id", "architectures", "transformers_version", "dtype",
             "torch_dtype", "_name_or_path", "rope_parameters", "rope_scaling",
             "quantization_config"}


def _special_ids(d: dict, acc: set) -> set:
    for k, v in d.items():
        if not isinstance(k, str) or k in _NO_TOUCH:
            continue
        if isinstance(v, dict):
            _special_ids(v, acc)
        elif _is_token_key(k):
            for x in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(x, int) and not isinstance(x, bool):
                    acc.add(x)
    return acc


def _is_token_key(k: str) -> bool:
    return (k.endswith("_token_id") or k.endswith("_token_ids") or k.endswith("_token_index")
            or k in ("image_token_index", "video_token_index", "audio_token_index",
                     "decoder_start_token_id", "suppress_tokens", "begin_suppress_tokens"))


def _shrink(d: dict, tier: int, remap: dict) -> dict:
    """Overrides (changed keys only; sub-configs recursively) for one config dict."""
    out: dict = {}
    aggressive = tier == 0
    n_layers = next((v for k, v in d.items() if k in _LAYER_KEYS and isinstance(v, int)), None)
    for k, v in d.items():
        if k == "rope_parameters" and isinstance(v, dict) and tier <= 1:
            rp = _shrink_rope(v)
            if rp != v:
                out[k] = rp
            continue
        if k in _NO_TOUCH or v is None or isinstance(v, bool):
            continue
        if (isinstance(v, list) and n_layers and n_layers > LAYERS and len(v) == n_layers
                and k not in _LIST_DEPTH_KEYS | _LIST_SIZE_KEYS | _LIST_HEAD_KEYS):
            out[k] = v[:LAYERS]  # per-layer lists (layer_types, attention_layers, ...)
            continue
        if isinstance(v, dict) and ("model_type" in v or k.endswith("_config")):
            sub = _shrink(v, tier, remap)
            if "model_type" in v:
                sub["model_type"] = v["model_type"]
            out[k] = sub
            continue
        new = v
        if isinstance(v, int):
            if k in _LAYER_KEYS and v > LAYERS:
                new = LAYERS
            elif k == "vocab_size" and v > VOCAB:
                new = VOCAB
            elif k == "num_labels":
                new = 3
            elif tier <= 1:
                if k in _HIDDEN_KEYS and v > HIDDEN:
                    new = HIDDEN
                elif k in _FFN_KEYS and v > FFN:
                    new = FFN
                elif k in _HEAD_KEYS and v > HEADS:
                    new = HEADS
                elif k in _KV_KEYS and v > KV_HEADS:
                    new = KV_HEADS if aggressive else HEADS
                elif k in _HEAD_DIM_KEYS and v > HIDDEN // HEADS:
                    new = HIDDEN // HEADS
                elif k in _RANK_KEYS and v > 16:
                    new = 16
                elif k in _EXPERT_KEYS and v > 4:
                    new = 4
                elif k in ("num_experts_per_tok", "moe_topk", "top_k") and v > 2:
                    new = 2
                elif k in ("n_group", "topk_group") and v > 1:
                    new = 1
                elif k in _MAXPOS_KEYS and v > MAXPOS:
                    new = MAXPOS
                elif k == "max_source_positions" and v > 32:
                    new = 32
                elif k == "num_conv_pos_embeddings" and v > 16:
                    new = 16
                elif k == "num_conv_pos_embedding_groups" and v > 4:
                    new = 4
                elif aggressive and k == "image_size" and v > IMAGE:
                    new = IMAGE
                elif aggressive and k == "patch_size" and v > PATCH:
                    new = PATCH
                elif aggressive and k == "window_size" and v > 4:
                    new = 4
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            if aggressive and k in _LIST_DEPTH_KEYS:
                new = [1] * len(v)
            elif aggressive and k in _LIST_SIZE_KEYS:
                m = max(v)
                new = [max(8, int(round(x * 64 / m / 8)) * 8) if m > 64 else x for x in v]
            elif aggressive and k in _LIST_HEAD_KEYS:
                new = [1] * len(v)
            elif aggressive and k == "image_size" and max(v) > IMAGE:
                new = [IMAGE] * len(v)
            elif aggressive and k == "patch_size" and max(v) > PATCH:
                new = [PATCH] * len(v)
            if isinstance(v, tuple):
                new = tuple(new)
        if _is_token_key(k):
            def fix(x):
                if isinstance(x, int) and not isinstance(x, bool) and x >= VOCAB:
                    if x not in remap:
                        remap[x] = VOCAB - 1 - len(remap)
                    return remap[x]
                return x
            new = [fix(x) for x in v] if isinstance(v, (list, tuple)) else fix(v)
        if new != v:
            out[k] = new
    return out


TIERS = (0, 1, 2)  # 0: everything small (1 KV head); 1: KV heads = heads, images/lists/windows
#                   left alone; 2: only layers/vocab/labels (guarded by MAX_PARAMS)


def _shrink_rope(rp: dict) -> dict:
    rp = dict(rp)
    sec = rp.get("mrope_section")
    if isinstance(sec, list) and sec and sum(sec) > HIDDEN // HEADS // 2:
        half = HIDDEN // HEADS // 2  # head_dim 16 -> 8 rotary frequencies
        new = [max(1, x * half // sum(sec)) for x in sec]
        new[0] += half - sum(new)
        rp["mrope_section"] = new
    om = rp.get("original_max_position_embeddings")
    if isinstance(om, int) and om >= MAXPOS:
        rp["original_max_position_embeddings"] = MAXPOS // 2
    return rp


def tiny_config(model_type: str, tier: int = 0):
    from transformers import AutoConfig

    base = AutoConfig.for_model(model_type)
    d = base.to_dict()
    remap: dict = {}
    over = _shrink(d, tier, remap)
    over = _accepted(over, type(base))
    over["num_labels"] = 3
    return AutoConfig.for_model(model_type, **over)


def _accepted(over: dict, cfg_cls) -> dict:
    """Drop overrides that the config class does not take as an argument (derived fields
    such as Swin's ``hidden_size``: setting them would contradict the derivation)."""
    from transformers import CONFIG_MAPPING

    try:
        params = inspect.signature(cfg_cls.__init__).parameters
    except (TypeError, ValueError):
        return over
    named = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    out = {}
    for k, v in over.items():
        if isinstance(v, dict) and "model_type" in v:
            try:
                sub_cls = CONFIG_MAPPING[v["model_type"]]
                v = {**_accepted({a: b for a, b in v.items() if a != "model_type"}, sub_cls),
                     "model_type": v["model_type"]}
            except Exception:
                pass
        if len(named) <= 1 or k in named or k == "model_type":
            out[k] = v
    return out


# ---------------------------------------------------------------------------------------
# Inputs


def _get(cfg, *names, default=None):
    for n in names:
        for c in (cfg, getattr(cfg, "text_config", None), getattr(cfg, "vision_config", None),
                  getattr(cfg, "audio_config", None), getattr(cfg, "encoder", None)):
            if c is not None and getattr(c, n, None) is not None:
                return getattr(c, n)
    return default


def _text_vocab(cfg) -> int:
    v = _get(cfg, "vocab_size", default=VOCAB)
    return int(v) if isinstance(v, int) else VOCAB


def build_inputs(model, cfg, variant: str = "full") -> dict:
    """Inputs for ``model.forward`` from its signature (seeded).  ``variant='text'`` drops
    image/audio inputs when text inputs are present."""
    import torch

    g = torch.Generator().manual_seed(1)
    sig = inspect.signature(model.forward)
    params = sig.parameters
    vocab = _text_vocab(cfg)
    special = _special_ids(cfg.to_dict(), set())
    allowed = torch.tensor([i for i in range(min(vocab, VOCAB)) if i not in special and i >= 3]
                           or list(range(vocab)))

    def ids(shape):
        return allowed[torch.randint(0, len(allowed), shape, generator=g)]

    inputs: dict = {}
    if "input_ids" in params:
        inputs["input_ids"] = ids((BATCH, SEQ))
        if "attention_mask" in params:
            m = torch.ones(BATCH, SEQ, dtype=torch.long)
            m[1, -2:] = 0
            inputs["attention_mask"] = m
        if "token_type_ids" in params:
            inputs["token_type_ids"] = torch.zeros(BATCH, SEQ, dtype=torch.long)
        if "bbox" in params:
            xy = torch.randint(0, 500, (BATCH, SEQ, 2), generator=g)
            wh = torch.randint(0, 500, (BATCH, SEQ, 2), generator=g)
            inputs["bbox"] = torch.cat([xy, xy + wh], -1)
    if "decoder_input_ids" in params and (getattr(cfg, "is_encoder_decoder", False) or
                                           params["decoder_input_ids"].default is inspect.Parameter.empty):
        inputs["decoder_input_ids"] = ids((BATCH, DEC_SEQ))
    text = bool(inputs)
    if "pixel_values" in params and not (variant == "text" and text):
        ch = _get(cfg, "num_channels", default=3)
        size = _get(cfg, "image_size", default=IMAGE)
        if isinstance(size, dict):
            size = size.get("height", IMAGE)
        h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]
        inputs["pixel_values"] = torch.randn(BATCH, ch, h, w, generator=g)
    if "input_values" in params and not (variant == "text" and text):
        inputs["input_values"] = torch.randn(BATCH, 3200, generator=g)
    if "input_features" in params and not (variant == "text" and text):
        if _get(cfg, "num_mel_bins") is not None:
            msp = _get(cfg, "max_source_positions")
            frames = 2 * msp if isinstance(msp, int) else 64
            inputs["input_features"] = torch.randn(BATCH, _get(cfg, "num_mel_bins"), frames, generator=g)
        else:
            feat = _get(cfg, "input_feat_per_channel", "feature_size", "num_mel_bins", default=80)
            chans = _get(cfg, "input_channels", default=1)
            inputs["input_features"] = torch.randn(BATCH, 64, feat * chans, generator=g)
    missing = [n for n, p in params.items()
               if p.default is inspect.Parameter.empty and n not in inputs
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise ValueError(f"cannot build required input(s) {missing}")
    if not inputs:
        raise ValueError("no known input in forward signature "
                         f"({', '.join(list(params)[:8])})")
    if "use_cache" in params:
        inputs["use_cache"] = False
    if "return_dict" in params:
        inputs["return_dict"] = True
    return inputs


# ---------------------------------------------------------------------------------------
# Comparison


def flatten(obj, prefix: str = "out") -> list[tuple[str, Any]]:
    import torch

    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    if isinstance(obj, dict) or hasattr(obj, "keys") and hasattr(obj, "items") and not isinstance(obj, type):
        try:
            items = list(obj.items())
        except Exception:
            return []
        res = []
        for k, v in items:
            res += flatten(v, f"{prefix}.{k}")
        return res
    if isinstance(obj, (list, tuple)):
        res = []
        for i, v in enumerate(obj):
            res += flatten(v, f"{prefix}[{i}]")
        return res
    return []  # caches and other objects: compared through the tensors that depend on them


def compare(cpu_out, dev_out, rtol: float, atol: float) -> dict:
    """``{ok, max_abs_err, where, detail, n}`` over every tensor of the two outputs."""
    import torch

    a = dict(flatten(cpu_out))
    b = dict(flatten(dev_out))
    worst = {"ok": True, "max_abs_err": 0.0, "where": None, "detail": None, "n": len(a)}
    if set(a) != set(b):
        return {**worst, "ok": False, "where": sorted(set(a) ^ set(b))[:3],
                "detail": "different output structure"}
    for k in a:
        x, y = a[k], b[k].detach().cpu()
        x = x.detach()
        if x.shape != y.shape or x.dtype != y.dtype:
            return {**worst, "ok": False, "where": k,
                    "detail": f"cpu {tuple(x.shape)} {x.dtype} vs tpu {tuple(y.shape)} {y.dtype}"}
        if x.numel() == 0:
            continue
        if x.is_floating_point() or x.is_complex():
            xf, yf = x.to(torch.float64), y.to(torch.float64)
            nan_x, nan_y = torch.isnan(xf), torch.isnan(yf)
            if not torch.equal(nan_x, nan_y):
                return {**worst, "ok": False, "where": k, "max_abs_err": float("nan"),
                        "detail": "NaN positions differ"}
            fin = ~nan_x
            diff = (xf - yf).abs()[fin]
            diff = diff[~torch.isnan(diff)]  # inf - inf
            err = float(diff.max()) if diff.numel() else 0.0
            close = torch.isclose(xf, yf, rtol=rtol, atol=atol, equal_nan=True).all()
            if err > worst["max_abs_err"] or (not close and worst["ok"]):
                worst.update(max_abs_err=err, where=k)
            if not close:
                worst["ok"] = False
                worst["where"] = k
                worst["detail"] = f"max abs err {err:.3g} (|cpu| max {float(xf[fin].abs().max()):.3g})"
                return worst
        else:
            if not torch.equal(x, y):
                n = int((x != y).sum())
                return {**worst, "ok": False, "where": k, "max_abs_err": float((x.double() - y.double()).abs().max()),
                        "detail": f"{n} of {x.numel()} integer elements differ"}
    return worst


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:300] if s else ''}"


def _error(e: BaseException, stage: str) -> dict:
    msg = str(e)
    m = _MISSING_OP_RE.search(msg)
    tb = traceback.extract_tb(e.__traceback__)
    where = next((f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(tb)
                  if "transformers" in f.filename), None)
    return {"status": "error", "stage": stage, "reason": _first_line(e),
            "missing_op": m.group(1) if m else None, "where": where}


# ---------------------------------------------------------------------------------------
# One architecture (runs in a worker process)


def _setup_worker(threads: int = 1) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(max(1, threads))
    try:
        import jax

        cache = os.environ.get("TORCHTPU_MODELS_JAX_CACHE")
        if cache:
            jax.config.update("jax_compilation_cache_dir", cache)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    except Exception:
        pass
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except Exception:
        pass


def _build_cpu(arch: dict):
    """Try tiers x model types x input variants until the CPU forward works.
    Returns (model, cfg, inputs, cpu_out, info) or raises the first error."""
    import torch
    import transformers

    cls = getattr(transformers, arch["name"])
    first_err = None
    own = getattr(getattr(cls, "config_class", None), "model_type", None)
    types = ([own] if own else []) + [t for t in arch["model_types"] if t != own]
    for tier in TIERS:
        for mt in types:
            try:
                cfg = tiny_config(mt, tier)
                with torch.device("meta"):
                    n = sum(p.numel() for p in cls(cfg).parameters())
                if n > MAX_PARAMS:
                    raise ValueError(f"tiny config still has {n/1e6:.0f}M parameters")
                torch.manual_seed(0)
                model = cls(cfg).eval()
            except Exception as e:  # noqa: BLE001
                first_err = first_err or ("build", e)
                continue
            for variant in ("full", "text"):
                try:
                    inputs = build_inputs(model, cfg, variant)
                    with torch.no_grad():
                        out = model(**inputs)
                    return model, cfg, inputs, out, {"tier": tier, "model_type": mt, "inputs": variant,
                                                     "params": sum(p.numel() for p in model.parameters())}
                except Exception as e:  # noqa: BLE001
                    first_err = first_err or ("cpu forward", e)
                    if variant == "full" and not any(k in ("pixel_values", "input_values", "input_features")
                                                     for k in build_inputs_safe(model, cfg)):
                        break
    stage, e = first_err
    raise _CpuFailure(stage, e)


def build_inputs_safe(model, cfg):
    try:
        return build_inputs(model, cfg)
    except Exception:
        return {}


class _CpuFailure(Exception):
    def __init__(self, stage, err):
        super().__init__(f"{stage}: {_first_line(err)}")
        self.stage, self.err = stage, err


def _to(x, device):
    import torch

    if isinstance(x, torch.Tensor):
        return x.to(device)
    return x


def run_architecture(arch: dict, do_generate: Optional[bool] = None, do_train: bool = False) -> dict:
    """Check one model class; returns the result record."""
    import torch

    t0 = time.time()
    res: dict = {"name": arch["name"], "model_types": arch["model_types"], "tasks": arch["tasks"]}
    try:
        model, cfg, inputs, cpu_out, info = _build_cpu(arch)
    except _CpuFailure as f:
        res.update(status="skipped-cpu", reason=str(f), seconds=round(time.time() - t0, 2))
        return res
    except Exception as e:  # noqa: BLE001
        res.update(status="skipped-cpu", reason=f"build: {_first_line(e)}", seconds=round(time.time() - t0, 2))
        return res
    res.update(info)
    pristine = copy.deepcopy(model)

    # forward on tpu
    try:
        dmodel = copy.deepcopy(pristine).to(DEVICE)
        dinputs = {k: _to(v, DEVICE) for k, v in inputs.items()}
        with torch.no_grad():
            dout = dmodel(**dinputs)
        cmp = compare(cpu_out, dout, **FWD_TOL)
    except Exception as e:  # noqa: BLE001
        res.update(_error(e, "forward"), seconds=round(time.time() - t0, 2))
        return res
    res["forward"] = {"max_abs_err": cmp["max_abs_err"], "where": cmp["where"], "outputs": cmp["n"]}
    status = "pass"
    if not cmp["ok"]:
        status = "mismatch"
        res.update(reason=f"forward {cmp['where']}: {cmp['detail']}", max_abs_err=cmp["max_abs_err"])
    res["status"] = status

    # greedy generate
    if do_generate is None:
        do_generate = is_causal_lm(arch)
    if do_generate and status == "pass" and "input_ids" in inputs:
        res["generate"] = _check_generate(model, dmodel, inputs)
        _merge(res, res["generate"], "generate")
    # one training step
    if do_train and res["status"] == "pass" and "input_ids" in inputs:
        res["train"] = _check_train(pristine, inputs)
        _merge(res, res["train"], "train")
    res["seconds"] = round(time.time() - t0, 2)
    return res


def _merge(res: dict, sub: dict, stage: str) -> None:
    st = sub.get("status")
    if st in ("mismatch", "error") and _SEVERITY[st] < _SEVERITY[res["status"]]:
        res["status"] = st
        res["stage"] = stage
        res["reason"] = f"{stage}: {sub.get('reason')}"
        if sub.get("missing_op"):
            res["missing_op"] = sub["missing_op"]
        if "max_abs_err" in sub:
            res["max_abs_err"] = sub["max_abs_err"]


def _check_generate(model, dmodel, inputs) -> dict:
    import torch

    ids = inputs["input_ids"]
    kw = dict(max_new_tokens=GEN_TOKENS, min_new_tokens=GEN_TOKENS, do_sample=False, num_beams=1)
    gc = getattr(model, "generation_config", None)
    if gc is not None and gc.pad_token_id is None:
        eos = gc.eos_token_id
        kw["pad_token_id"] = (eos[0] if isinstance(eos, list) and eos else eos) if eos is not None else 0
    mask = torch.ones_like(ids)
    try:
        with torch.no_grad():
            ref = model.generate(input_ids=ids, attention_mask=mask, **kw)
    except Exception as e:  # noqa: BLE001
        return {"status": "skipped-cpu", "reason": _first_line(e)}
    try:
        with torch.no_grad():
            got = dmodel.generate(input_ids=ids.to(DEVICE), attention_mask=mask.to(DEVICE), **kw)
    except Exception as e:  # noqa: BLE001
        return _error(e, "generate")
    got = got.cpu()
    if got.shape != ref.shape or not torch.equal(got, ref):
        n = int((got != ref).sum()) if got.shape == ref.shape else -1
        return {"status": "mismatch", "reason": f"generated ids differ ({n} tokens; cpu {ref[:, ids.shape[1]:].tolist()} "
                                                  f"tpu {got[:, ids.shape[1]:].tolist()})"}
    return {"status": "pass"}


def _check_train(pristine, inputs) -> dict:
    import torch

    kw = {k: v for k, v in inputs.items() if k != "use_cache"}
    kw["labels"] = inputs["input_ids"]
    cmodel = copy.deepcopy(pristine)
    try:
        closs = cmodel(**kw).loss
        closs.backward()
    except Exception as e:  # noqa: BLE001
        return {"status": "skipped-cpu", "reason": _first_line(e)}
    try:
        dmodel = copy.deepcopy(pristine).to(DEVICE)
        dloss = dmodel(**{k: _to(v, DEVICE) for k, v in kw.items()}).loss
        dloss.backward()
    except Exception as e:  # noqa: BLE001
        return _error(e, "train")
    worst = {"status": "pass", "max_abs_err": 0.0, "where": None}
    cl, dl = closs.detach(), dloss.detach().cpu()
    if not torch.allclose(cl, dl, **TRAIN_TOL):
        return {"status": "mismatch", "reason": f"loss cpu {float(cl):.6g} tpu {float(dl):.6g}",
                "max_abs_err": float((cl - dl).abs())}
    dparams = dict(dmodel.named_parameters())
    for n, p in cmodel.named_parameters():
        q = dparams[n]
        if (p.grad is None) != (q.grad is None):
            return {"status": "mismatch", "reason": f"grad of {n}: cpu {'None' if p.grad is None else 'set'}, "
                                                    f"tpu {'None' if q.grad is None else 'set'}"}
        if p.grad is None:
            continue
        g = q.grad.cpu()
        err = float((p.grad.double() - g.double()).abs().max()) if p.grad.numel() else 0.0
        if not torch.allclose(p.grad, g, equal_nan=True, **TRAIN_TOL):
            return {"status": "mismatch", "reason": f"grad of {n}: max abs err {err:.3g}", "max_abs_err": err}
        if err > worst["max_abs_err"]:
            worst.update(max_abs_err=err, where=n)
    return worst


def _worker(arch: dict, do_train: bool, threads: int, conn) -> None:
    try:
        _setup_worker(threads)
        res = run_architecture(arch, do_train=do_train)
    except BaseException as e:  # noqa: BLE001
        res = {"name": arch["name"], "model_types": arch["model_types"], "tasks": arch["tasks"],
               "status": "crash", "reason": f"worker: {_first_line(e)}"}
    try:
        conn.send(res)
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------
# Sweep driver


def _load(path: str) -> dict:
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"meta": {}, "results": {}}


def _save(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def sweep(archs: list[dict], train: set[str], jobs: int = 1, timeout: float = DEFAULT_TIMEOUT,
          on_result=None, progress: bool = True) -> list[dict]:
    """Run each architecture in its own worker process (forkserver, torch and transformers
    preloaded); at most ``jobs`` at a time; kill after ``timeout`` seconds."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "transformers", "transformers.modeling_utils",
                                "transformers.models.auto.modeling_auto",
                                "torchtpu.conformance.models"])
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))
    pending = list(archs)
    running: list = []  # (arch, proc, conn, start)
    results = []
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(archs), unit="arch", dynamic_ncols=True)
        except ImportError:
            bar = None

    def finish(arch, res):
        results.append(res)
        if on_result:
            on_result(res)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{arch['name'][:30]}: {res['status']}")
        else:
            print(f"[{len(results)}/{len(archs)}] {arch['name']}: {res['status']} "
                  f"{res.get('reason', '') or ''}"[:200], flush=True)

    try:
        while pending or running:
            while pending and len(running) < jobs:
                arch = pending.pop(0)
                r, w = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_worker, args=(arch, arch["name"] in train, threads, w), daemon=True)
                p.start()
                w.close()
                running.append((arch, p, r, time.time()))
            time.sleep(0.05)
            still = []
            for arch, p, r, t0 in running:
                base = {"name": arch["name"], "model_types": arch["model_types"], "tasks": arch["tasks"]}
                res = None
                if r.poll():
                    try:
                        res = r.recv()
                    except (EOFError, OSError):
                        res = None
                    if res is None:
                        p.join(5)
                        res = {**base, "status": "crash",
                               "reason": f"worker died (exit code {p.exitcode})"}
                    p.join(10)
                    if p.is_alive():
                        p.kill()
                elif not p.is_alive():
                    res = {**base, "status": "crash", "reason": f"worker died (exit code {p.exitcode})",
                           "seconds": round(time.time() - t0, 2)}
                elif time.time() - t0 > timeout:
                    p.kill()
                    p.join(5)
                    res = {**base, "status": "timeout", "reason": f"no result after {timeout:.0f} s",
                           "seconds": round(time.time() - t0, 2)}
                if res is None:
                    still.append((arch, p, r, t0))
                else:
                    r.close()
                    finish(arch, res)
            running = still
    finally:
        for _, p, _, _ in running:
            p.kill()
        if bar is not None:
            bar.close()
    return results


# ---------------------------------------------------------------------------------------
# Summary


def root_cause(res: dict) -> str:
    if res.get("missing_op"):
        return f"missing op {res['missing_op']}"
    reason = res.get("reason") or ""
    if res["status"] == "mismatch":
        return "mismatch"
    if res["status"] in ("timeout", "crash"):
        return res["status"]
    r = re.sub(r"0x[0-9a-f]+", "0x…", reason)
    r = re.sub(r"\d+", "N", r)
    return r[:160]


def summarize(results: dict, n_enumerated: int) -> str:
    rs = list(results.values())
    counts = Counter(r["status"] for r in rs)
    ran_cpu = [r for r in rs if r["status"] != "skipped-cpu"]
    passed = counts.get("pass", 0)
    lines = ["# Hugging Face architecture sweep (tpu vs. CPU)", ""]
    lines.append(f"Architectures enumerated: **{n_enumerated}**; recorded: **{len(rs)}**; "
                 f"ran on CPU: **{len(ran_cpu)}**; passed on tpu: **{passed}** "
                 f"(**{100.0 * passed / max(1, len(ran_cpu)):.1f}%** of those that ran on CPU).")
    lines.append("")
    lines.append("Forward rtol=atol=1e-4; greedy generate (8 tokens) ids equal for causal LMs; "
                 "training step (loss and all grads, rtol=atol=1e-3) for the fixed sample.")
    lines.append("")
    lines.append("| class | count |")
    lines.append("|---|---|")
    for s in STATUSES:
        lines.append(f"| {s} | {counts.get(s, 0)} |")
    lines.append("")
    mism = sorted((r for r in rs if r["status"] == "mismatch"), key=lambda r: r["name"])
    lines.append(f"## Mismatches ({len(mism)})")
    lines.append("")
    if mism:
        lines.append("| architecture | stage / output | max abs err | detail |")
        lines.append("|---|---|---|---|")
        for r in mism:
            err = r.get("max_abs_err")
            lines.append(f"| {r['name']} | {r.get('stage', 'forward')} | "
                         f"{'' if err is None else f'{err:.3g}'} | {(r.get('reason') or '').replace('|', '/')[:200]} |")
    lines.append("")
    groups: dict = defaultdict(list)
    for r in rs:
        if r["status"] in ("error", "timeout", "crash"):
            groups[root_cause(r)].append(r["name"])
    lines.append("## Failures by root cause (sorted by number of architectures blocked)")
    lines.append("")
    lines.append("| root cause | architectures | examples |")
    lines.append("|---|---|---|")
    for cause, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ex = ", ".join(sorted(names)[:5]) + (" …" if len(names) > 5 else "")
        lines.append(f"| {cause.replace('|', '/')} | {len(names)} | {ex} |")
    lines.append("")
    trained = [r for r in rs if "train" in r]
    if trained:
        lines.append(f"## Training-step sample ({len(trained)})")
        lines.append("")
        lines.append("| architecture | train | max grad abs err |")
        lines.append("|---|---|---|")
        for r in sorted(trained, key=lambda r: r["name"]):
            t = r["train"]
            err = t.get("max_abs_err")
            lines.append(f"| {r['name']} | {t['status']} {(t.get('reason') or '')[:120]} | "
                         f"{'' if err is None else f'{err:.3g}'} |")
        lines.append("")
    skipped = Counter(root_cause(r) for r in rs if r["status"] == "skipped-cpu")
    lines.append("## skipped-cpu reasons (top 15)")
    lines.append("")
    for cause, n in skipped.most_common(15):
        lines.append(f"* {n} x {cause}")
    lines.append("")
    return "\n".join(lines)


def select(archs: list[dict], subset: Optional[str], pattern: Optional[str], limit: Optional[int]) -> list[dict]:
    if subset == "ci":
        by = {a["name"]: a for a in archs}
        archs = [by[n] for n in CI_SUBSET if n in by]
    elif subset:
        raise SystemExit(f"unknown subset {subset!r} (known: ci)")
    if pattern:
        rx = re.compile(pattern)
        archs = [a for a in archs if rx.search(a["name"])]
    if limit is not None:
        archs = archs[:limit]
    return archs


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torchtpu.conformance models",
                                 description="Hugging Face architecture sweep: tpu vs. CPU.")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes at a time (default 1)")
    ap.add_argument("--filter", default=None, help="regex on the model class name")
    ap.add_argument("--limit", type=int, default=None, help="at most N architectures (after filtering)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per architecture")
    ap.add_argument("--subset", default=None, help="'ci': a fixed list of small architectures")
    ap.add_argument("--rerun", action="store_true", help="rerun architectures already recorded")
    ap.add_argument("--out", default=OUT_DIR, help="output folder (models.json, models.md)")
    ap.add_argument("--no-progress", action="store_true", help="one line per architecture instead of a bar")
    ap.add_argument("--list", action="store_true", help="print the selected architectures and exit")
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    archs_all = enumerate_architectures()
    archs = select(archs_all, args.subset, args.filter, args.limit)
    train = train_sample(archs_all)
    if args.list:
        for a in archs:
            print(a["name"], ",".join(a["model_types"]), "train" if a["name"] in train else "")
        return 0
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("TORCHTPU_MODELS_JAX_CACHE", os.path.abspath(os.path.join(args.out, ".jax_cache")))
    jpath = os.path.join(args.out, "models.json")
    data = _load(jpath)
    done = data["results"]
    todo = [a for a in archs if args.rerun or a["name"] not in done]
    print(f"{len(archs_all)} architectures enumerated; {len(archs)} selected; "
          f"{len(archs) - len(todo)} already recorded; running {len(todo)} "
          f"(jobs={args.jobs}, timeout={args.timeout:.0f}s)", flush=True)
    data["meta"] = {"enumerated": len(archs_all), "train_sample": sorted(train),
                    "fwd_tol": FWD_TOL, "train_tol": TRAIN_TOL}

    def on_result(res):
        done[res["name"]] = res
        _save(jpath, data)

    t0 = time.time()
    sweep(todo, train, jobs=args.jobs, timeout=args.timeout, on_result=on_result,
          progress=not args.no_progress)
    _save(jpath, data)
    md = summarize(done, len(archs_all))
    with open(os.path.join(args.out, "models.md"), "w") as f:
        f.write(md)
    sel = [done[a["name"]] for a in archs if a["name"] in done]
    c = Counter(r["status"] for r in sel)
    print(f"done in {time.time() - t0:.0f}s; selected: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    for r in sel:
        if r["status"] not in ("pass", "skipped-cpu"):
            print(f"  {r['name']}: {r['status']}: {r.get('reason', '')}"[:300])
    print(f"wrote {jpath} and {os.path.join(args.out, 'models.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
