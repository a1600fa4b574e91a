"""Hugging Face architecture sweep: every ``transformers`` auto-model class on ``tpu`` vs. CPU.

Usage (CLI)::

    python -m torchtpu.conformance models --mode strict         # everything (hours per mode)
    python -m torchtpu.conformance models --subset ci           # 8 small architectures, all modes
    python -m torchtpu.conformance models --filter '^Llama' --jobs 2 --limit 20 --rerun

``--mode strict|debug|defer_and_fuse|all`` (or a comma list): the eager modes
(``torch.tpu.EagerMode``) the tpu side runs in, one after the other in the same worker.
Default: ``all`` with ``--subset``/``--filter``/``--limit``; a full sweep (none of those)
has no default and must name its modes.

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
   CPU forward fails: ``skipped-cpu``.  The CPU side is computed once per architecture:
   the reference forward, then a probe (:func:`probe_cpu`): two more CPU forwards with
   seeds 1 and 2 (and seed 1 again if they differ): outputs that change with the seed
   while the seed reproduces them come from random numbers drawn inside forward (ViTMAE's
   masking, Vilt's patch sampling, Vits' stochastic durations); tpu's random stream is not
   CPU's, so those outputs are compared by dtype and shape only (rank where CPU's own
   shape changes with the seed) and the class is ``pass-shape-only``; every other output
   is still compared by value.  The first probe run also watches ``topk``: exactly equal
   values competing for the k places (a zero-initialized MoE router gate ties every
   expert) make CPU's choice an implementation detail; where such an architecture's
   stage (forward, generate, train) then differs, the stage runs again, on CPU and tpu
   alike, with each ``topk`` replaced by the first k of a stable sort (:func:`topk_mode`)
   and is compared by value (``topk`` in the mode's record names those stages).
5. For each mode: ``copy.deepcopy(model).to("tpu")``, forward, and every output tensor
   (recursively through ``ModelOutput``/tuples) is compared with rtol=atol=1e-4
   (:data:`FWD_TOL`).  An output beyond that is judged against a float64 CPU run
   (:func:`_f64_verdict`): within the float32 rounding noise of the network (CPU float32's
   own distance from float64, and that of two CPU float32 runs with every weight and input
   perturbed by one ulp; :data:`F64_FACTOR` times that) it is ``pass-f64``, else
   ``mismatch``.
6. Causal LMs also run 8 tokens of greedy ``generate()`` on both; the ids must be equal.
7. A fixed training sample (:func:`train_sample`: the first :data:`TRAIN_SAMPLE_SIZE`
   classes, alphabetically, of the causal-LM and masked-LM mappings) also runs one
   training step (``labels=input_ids``, eval mode so no dropout): the loss and every
   parameter gradient are compared with rtol=atol=1e-3.

Classes (worst first): ``mismatch`` (values differ; max abs error and which output),
``error`` (tpu raised; type, first line, and the missing ATen op for torchtpu's
"the ATen op 'aten.xxx' is not implemented"), ``timeout``, ``crash``,
``pass-shape-only``, ``pass-f64``, ``pass``, ``skipped-cpu`` (building or the CPU run
failed: nothing to compare).  Each mode has its own class (``modes`` in the record); the
record's top-level ``status`` is its worst mode's (``worst_mode``).

Each class runs in its own worker process (``multiprocessing`` forkserver with torch and
transformers preloaded; one process per architecture, all its modes in it), killed when
one stage (the CPU side, or one mode) takes more than ``--timeout`` seconds; the modes
finished by then are kept.  Results are appended to ``conformance/models.json`` as they
finish (``results[name]["modes"][mode]``; resumable: a class is skipped when every
requested mode is recorded, else only the missing modes run, unless ``--rerun``; records
from before per-mode results count as strict), and ``conformance/models.md`` summarizes
them with a pass rate per mode.
Workers share a JAX persistent compilation cache (``conformance/.jax_cache``) so that op
signatures common to many tiny models compile once.
"""

from __future__ import annotations

import argparse
import contextlib
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

# Modes the tpu side runs in, in this order: the eager modes (``torch.tpu.EagerMode``
# values; ``--mode all``) and ``compile`` (named explicitly): the model wrapped in
# ``torch.compile(backend="tpu")``, graph breaks running in STRICT.
EAGER_MODES = ("strict", "debug", "defer_and_fuse")
MODES = EAGER_MODES + ("compile",)
# pass-f64: tpu may be this many times CPU float32's own error (vs. float64) away from float64.
F64_FACTOR = 2.0

STATUSES = ("mismatch", "error", "timeout", "crash", "pass-shape-only", "pass-f64", "pass", "skipped-cpu")
PASSING = ("pass", "pass-f64", "pass-shape-only")
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


def _compare_tensor(x, y, rtol: float, atol: float) -> dict:
    """One CPU tensor ``x`` against one (CPU copy of a) tpu tensor ``y``:
    ``{ok, err, detail}``."""
    import torch

    if x.shape != y.shape or x.dtype != y.dtype:
        return {"ok": False, "err": 0.0,
                "detail": f"cpu {tuple(x.shape)} {x.dtype} vs tpu {tuple(y.shape)} {y.dtype}"}
    if x.numel() == 0:
        return {"ok": True, "err": 0.0, "detail": None}
    if x.is_floating_point() or x.is_complex():
        xf, yf = (x.to(torch.complex128), y.to(torch.complex128)) if x.is_complex() else \
            (x.to(torch.float64), y.to(torch.float64))
        nan_x, nan_y = torch.isnan(xf), torch.isnan(yf)
        if not torch.equal(nan_x, nan_y):
            return {"ok": False, "err": float("nan"), "detail": "NaN positions differ"}
        fin = ~nan_x
        diff = (xf - yf).abs()[fin]
        diff = diff[~torch.isnan(diff)]  # inf - inf
        err = float(diff.max()) if diff.numel() else 0.0
        if not torch.isclose(xf, yf, rtol=rtol, atol=atol, equal_nan=True).all():
            return {"ok": False, "err": err,
                    "detail": f"max abs err {err:.3g} (|cpu| max {float(xf[fin].abs().max()):.3g})"}
        return {"ok": True, "err": err, "detail": None}
    if not torch.equal(x, y):
        n = int((x != y).sum())
        return {"ok": False, "err": float((x.double() - y.double()).abs().max()),
                "detail": f"{n} of {x.numel()} integer elements differ"}
    return {"ok": True, "err": 0.0, "detail": None}


def compare(cpu_out, dev_out, rtol: float, atol: float) -> dict:
    """``{ok, max_abs_err, where, detail, n}`` over every tensor of the two outputs (stops at
    the first tensor that differs)."""
    a = dict(flatten(cpu_out))
    b = dict(flatten(dev_out))
    worst = {"ok": True, "max_abs_err": 0.0, "where": None, "detail": None, "n": len(a)}
    if set(a) != set(b):
        return {**worst, "ok": False, "where": sorted(set(a) ^ set(b))[:3],
                "detail": "different output structure"}
    for k in a:
        c = _compare_tensor(a[k].detach(), b[k].detach().cpu(), rtol, atol)
        if not c["ok"]:
            return {**worst, "ok": False, "where": k, "detail": c["detail"],
                    "max_abs_err": c["err"] if c["err"] else worst["max_abs_err"]}
        if c["err"] > worst["max_abs_err"]:
            worst.update(max_abs_err=c["err"], where=k)
    return worst


def _same(x, y) -> bool:
    """Bitwise-equal values (NaN equal to NaN), same shape and dtype."""
    import torch

    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x.is_complex():
        x, y = torch.view_as_real(x), torch.view_as_real(y)
    if x.is_floating_point():
        return bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all())
    return torch.equal(x, y)


def seed_diff(a: dict, b: dict) -> dict:
    """Which flattened outputs of two CPU runs differ: ``{key: 'structure'|'shape'|'values'}``."""
    out = {}
    for k in set(a) | set(b):
        if k not in a or k not in b:
            out[k] = "structure"
        elif a[k].shape != b[k].shape:
            out[k] = "shape"
        elif not _same(a[k].detach(), b[k].detach()):
            out[k] = "values"
    return out


def judge(cpu_out, dev_out, random: Optional[dict] = None, ref64=None, noise=None,
          rtol: float = FWD_TOL["rtol"], atol: float = FWD_TOL["atol"]) -> dict:
    """The forward verdict for one architecture and mode.

    ``random``: :func:`seed_diff` of two CPU runs with different seeds (outputs that depend
    on random numbers drawn inside forward): those outputs are compared by dtype and shape
    (``'values'``) or dtype and rank (``'shape'``: CPU's own shape changes with the seed)
    only; every other output is compared by value.  ``ref64``: a callable returning the
    flattened output of a float64 CPU run; asked only when an output differs from CPU
    float32 beyond tolerance (:func:`_f64_verdict`); ``noise``: a callable returning the
    flattened outputs of CPU float32 runs with weights and inputs perturbed by one ulp.

    Returns ``{status, max_abs_err, where, detail, n, shape_only, f64}``; status is
    ``pass``, ``pass-f64``, ``pass-shape-only`` or ``mismatch``."""
    random = random or {}
    a = dict(flatten(cpu_out))
    b = dict(flatten(dev_out))
    res = {"status": "pass", "max_abs_err": 0.0, "where": None, "detail": None, "n": len(a),
           "shape_only": [], "f64": {}}

    def fail(where, detail, err=None):
        res.update(status="mismatch", where=where, detail=detail)
        if err is not None:
            res["max_abs_err"] = err
        return res

    loose = any(v == "structure" for v in random.values())
    missing = sorted(k for k in a if k not in b and random.get(k) != "structure")
    extra = sorted(k for k in b if k not in a)
    if missing or (extra and not loose):
        return fail((missing + extra)[:3], "different output structure")
    failing = []
    for k in a:
        if k not in b:
            continue
        x, y = a[k].detach(), b[k].detach().cpu()
        kind = random.get(k)
        if kind in ("shape", "structure"):
            if x.dtype != y.dtype or x.dim() != y.dim():
                return fail(k, f"cpu {x.dtype} rank {x.dim()} vs tpu {y.dtype} rank {y.dim()} "
                               "(output depends on the seed: dtype and rank compared)")
            res["shape_only"].append(k)
            continue
        if kind == "values":
            if x.dtype != y.dtype or x.shape != y.shape:
                return fail(k, f"cpu {tuple(x.shape)} {x.dtype} vs tpu {tuple(y.shape)} {y.dtype} "
                               "(output depends on the seed: dtype and shape compared)")
            res["shape_only"].append(k)
            continue
        c = _compare_tensor(x, y, rtol, atol)
        if c["err"] == c["err"] and c["err"] > res["max_abs_err"]:
            res["max_abs_err"], res["where"] = c["err"], k
        if not c["ok"]:
            failing.append((k, x, y, c))
    if failing:
        r64, others, note = None, [], ""
        if ref64 is not None:
            try:
                r64 = ref64()
                others = noise() if noise is not None else []
            except Exception as e:  # noqa: BLE001
                note = f"; float64 CPU run failed: {_first_line(e)}"
        for k, x, y, c in failing:
            if r64 is None:
                return fail(k, c["detail"] + note, c["err"])
            ok, info = _f64_verdict(x, y, r64.get(k), rtol, atol, [o.get(k) for o in others])
            if not ok:
                return fail(k, f"{c['detail']}; vs float64 CPU: {info.get('detail')}", c["err"])
            res["f64"][k] = info
        res["where"], res["detail"] = failing[0][0], failing[0][3]["detail"]
    if res["shape_only"]:
        res["status"] = "pass-shape-only"
    elif res["f64"]:
        res["status"] = "pass-f64"
    return res


def _f64_verdict(x, y, r, rtol: float, atol: float, others=()) -> tuple[bool, dict]:
    """Is tpu's ``y`` as close to the float64 CPU result ``r`` as CPU float32's ``x`` is?

    Element-wise ``|y - r| <= atol + rtol * |r| + F64_FACTOR * E`` with ``E`` the float32
    rounding noise of this output: the largest ``max|o - r|`` over ``x`` and ``others``
    (CPU float32 runs with every floating weight, buffer and input perturbed by one ulp,
    :meth:`_CpuCache.noise`: how far rounding-level differences carry through this network);
    NaN positions of ``y`` equal to those of ``x`` or ``r``.  When CPU float32's
    own shape differs from float64's (a discrete decision taken on rounding-level
    differences, e.g. thresholding nearly equal scores), ``y`` must have the dtype of ``x``
    and the shape of ``x`` or of ``r``; values are then not compared."""
    import torch

    if r is None:
        return False, {"detail": "output missing"}
    r = r.detach()
    if x.dtype != y.dtype:
        return False, {"detail": f"dtype cpu {x.dtype} tpu {y.dtype}"}
    if x.shape != r.shape:
        if y.shape in (x.shape, r.shape):
            return True, {"shape": f"cpu f32 {tuple(x.shape)}, cpu f64 {tuple(r.shape)}, tpu {tuple(y.shape)}"}
        return False, {"detail": f"shape cpu f32 {tuple(x.shape)}, f64 {tuple(r.shape)}, tpu {tuple(y.shape)}"}
    if y.shape != r.shape:
        return False, {"detail": f"shape tpu {tuple(y.shape)} vs {tuple(r.shape)}"}
    if x.numel() == 0:
        return True, {"tpu_err": 0.0, "cpu_err": 0.0}
    ct = torch.complex128 if (x.is_complex() or r.is_complex()) else torch.float64
    xf, yf, rf = x.to(ct), y.to(ct), r.to(ct)
    ny = torch.isnan(yf)
    if not (torch.equal(ny, torch.isnan(xf)) or torch.equal(ny, torch.isnan(rf))):
        return False, {"detail": "NaN positions differ"}
    fin = torch.isfinite(xf) & torch.isfinite(rf)
    cpu_err = noise_err = float((xf - rf).abs()[fin].max()) if fin.any() else 0.0
    for o in others:
        if o is not None and o.shape == r.shape:
            of = o.detach().to(ct)
            ok = fin & torch.isfinite(of)
            if ok.any():
                noise_err = max(noise_err, float((of - rf).abs()[ok].max()))
    dy = (yf - rf).abs()
    bound = atol + rtol * rf.abs() + F64_FACTOR * noise_err
    ok_fin = (dy <= bound) | ~fin | ny
    # non-finite CPU values (inf): tpu equal to CPU float32 or float64 there
    ok_inf = fin | ny | (yf == xf) | (yf == rf)
    tpu_err = float(dy[fin & ~ny].max()) if (fin & ~ny).any() else 0.0
    info = {"tpu_err": tpu_err, "cpu_err": cpu_err, "noise_err": noise_err}
    if not bool((ok_fin & ok_inf).all()):
        info["detail"] = (f"tpu err {tpu_err:.3g} vs CPU float32's own {cpu_err:.3g} "
                          f"(1-ulp perturbed: {noise_err:.3g})")
        return False, info
    return True, info


def topk_mode(stable: bool = False):
    """A ``TorchFunctionMode`` around ``torch.topk`` / ``Tensor.topk``.

    ``stable=False``: records (``ties``) whether any call had equal values among the k+1
    largest (smallest) of a row: which of the tied elements CPU returns, and in which order,
    is an implementation choice (libstdc++'s nth_element / partial_sort), not a defined
    result.  ``stable=True``: every topk returns the first k of a stable sort instead (ties
    broken by position); the sweep runs both CPU and tpu that way for an architecture
    whose CPU forward had ties (a zero-initialized MoE router gate ties every expert) and
    whose result then differed."""

    import torch
    from torch.overrides import TorchFunctionMode

    funcs = (torch.topk, torch.Tensor.topk)

    class _TopkMode(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.stable, self.ties = stable, 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in funcs and "out" not in kwargs:
                x, k, dim, largest = _topk_args(args, kwargs)
                if isinstance(x, torch.Tensor) and x.dim() > 0:
                    if self.stable:
                        v, i = torch.sort(x, dim=dim, descending=largest, stable=True)
                        return torch.return_types.topk((v.narrow(dim, 0, k), i.narrow(dim, 0, k)))
                    if _has_ties(x, k, dim, largest):
                        self.ties += 1
            return func(*args, **kwargs)

    return _TopkMode()


def _topk_args(args, kwargs):
    names = ("input", "k", "dim", "largest", "sorted")
    vals = dict(zip(names, args))
    vals.update({n: kwargs[n] for n in names if n in kwargs})
    return vals.get("input"), int(vals.get("k")), vals.get("dim", -1), vals.get("largest", True)


def _has_ties(x, k: int, dim: int, largest: bool) -> bool:
    import torch

    with torch.no_grad():
        n = x.size(dim)
        m = min(k + 1, n)
        if m < 2:
            return False
        v = torch.sort(x.detach(), dim=dim, descending=largest).values.narrow(dim, 0, m)
        a, b = v.narrow(dim, 0, m - 1), v.narrow(dim, 1, m - 1)
        eq = a == b
        if a.is_floating_point():
            eq = eq | (torch.isnan(a) & torch.isnan(b))
        return bool(eq.any())


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


def probe_cpu(model, inputs) -> dict:
    """Two more CPU forwards, seeds 1 and 2 (the first under a :func:`topk_mode` tie
    probe); if they differ, a third with seed 1: outputs that differ between seeds 1 and 2
    while seed 1 reproduces itself depend on random numbers drawn inside forward
    (``random``: :func:`seed_diff`).  Outputs that do not reproduce with the same seed
    (``stateful``) are compared by value as before."""
    import torch

    tie_probe = topk_mode(stable=False)

    def run(seed, mode=None):
        torch.manual_seed(seed)
        with torch.no_grad(), (mode if mode is not None else contextlib.nullcontext()):
            return dict(flatten(model(**inputs)))

    try:
        r1 = run(1, tie_probe)
        r2 = run(2)
        info: dict = {"topk_ties": tie_probe.ties > 0, "random": seed_diff(r1, r2)}
        if info["random"] and seed_diff(r1, run(1)):
            info["random"], info["stateful"] = {}, True
    except Exception as e:  # noqa: BLE001
        return {"topk_ties": False, "random": {}, "probe_error": _first_line(e)}
    return info


def _ctx(stable: bool):
    return topk_mode(stable=True) if stable else contextlib.nullcontext()


class _CpuCache:
    """CPU-side results computed once per architecture and shared by every mode; each
    keyed by ``stable`` (computed with :func:`topk_mode` ``(stable=True)`` or without)."""

    def __init__(self, model, pristine, inputs, cpu_out):
        self.model, self.pristine, self.inputs = model, pristine, inputs
        self._memo: dict = {("forward", False): ("ok", cpu_out)}

    def _get(self, what: str, stable: bool, compute):
        key = (what, stable)
        if key not in self._memo:
            try:
                self._memo[key] = ("ok", compute())
            except Exception as e:  # noqa: BLE001
                self._memo[key] = ("raised", e)
        kind, val = self._memo[key]
        if kind == "raised":
            raise val
        return val

    def forward(self, stable: bool = False):
        """CPU reference output."""
        import torch

        def run():
            with torch.no_grad(), _ctx(stable):
                return self.model(**self.inputs)
        return self._get("forward", stable, run)

    def ref64(self, stable: bool = False) -> dict:
        """Flattened output of a float64 CPU run."""
        import torch

        def run():
            m = copy.deepcopy(self.pristine).double()
            kw = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                  for k, v in self.inputs.items()}
            torch.manual_seed(1)
            with torch.no_grad(), _ctx(stable):
                return dict(flatten(m(**kw)))
        return self._get("ref64", stable, run)

    def noise(self, stable: bool = False, runs: int = 2) -> list:
        """CPU float32 runs with every floating parameter, buffer and input multiplied by
        ``1 +- 2**-24`` (random signs, seeded): the spread of these around the float64 run is
        how far rounding-level differences carry through this network."""
        import torch

        def run():
            g = torch.Generator().manual_seed(0)

            def bump(t):
                s = torch.randint(0, 2, t.shape, generator=g).to(t.dtype) * 2 - 1
                return t * (1 + s * 2.0 ** -24)

            outs = []
            for _ in range(runs):
                m = copy.deepcopy(self.pristine)
                with torch.no_grad():
                    for t in list(m.parameters()) + list(m.buffers()):
                        if t.is_floating_point():
                            t.copy_(bump(t))
                    kw = {k: (bump(v) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                          for k, v in self.inputs.items()}
                    torch.manual_seed(1)
                    with _ctx(stable):
                        outs.append(dict(flatten(m(**kw))))
            return outs
        return self._get("noise", stable, run)

    def generate(self, kw: dict, stable: bool = False):
        """CPU greedy ``generate()`` ids (raises as CPU did)."""
        import torch

        ids = self.inputs["input_ids"]

        def run():
            with torch.no_grad(), _ctx(stable):
                return self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
        return self._get("generate", stable, run)

    def train(self, kw: dict, stable: bool = False):
        """CPU training step: ``(loss, {name: grad})`` (raises as CPU did)."""
        def run():
            cmodel = copy.deepcopy(self.pristine)
            with _ctx(stable):
                closs = cmodel(**kw).loss
                closs.backward()
            return closs.detach(), {n: p.grad for n, p in cmodel.named_parameters()}
        return self._get("train", stable, run)


def run_architecture(arch: dict, do_generate: Optional[bool] = None, do_train: bool = False,
                     modes=("strict",), on_progress=None) -> dict:
    """Check one model class in each eager mode of ``modes``; returns the result record.

    The CPU side (build, reference forward, seed/tie probe, generate and training-step
    references, the float64 runs when needed) is computed once; each mode gets its own
    ``deepcopy`` of the pristine model on tpu.  ``on_progress(res)`` is called after the CPU
    side and after each mode but the last (the worker sends those partial records to the
    driver)."""
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
    probe = probe_cpu(model, inputs)
    res["cpu"] = {"random": probe["random"], "topk_ties": probe["topk_ties"]}
    for k in ("stateful", "probe_error"):
        if k in probe:
            res["cpu"][k] = probe[k]
    cache = _CpuCache(model, pristine, inputs, cpu_out)
    if do_generate is None:
        do_generate = is_causal_lm(arch)
    res["modes"] = {}
    res["status"] = "pass"
    if on_progress:
        on_progress(res)
    for mode in modes:
        res["modes"][mode] = _run_mode(mode, pristine, inputs, probe, cache, do_generate, do_train)
        finalize(res)
        if on_progress and mode != modes[-1]:
            on_progress(res)
    res["seconds"] = round(time.time() - t0, 2)
    return res


def _compiled(model, mode: str):
    """``model`` itself, or in ``compile`` mode the module wrapped by
    ``torch.compile(backend="tpu")`` (Dynamo's state reset first: each stage compiles
    afresh, as a new process would)."""
    if mode != "compile":
        return model
    import torch

    torch._dynamo.reset()
    return torch.compile(model, backend="tpu")


def _forward(pristine, inputs, probe, cache, stable: bool, mode: str = "strict"):
    """tpu forward of a fresh copy of the model; ``(verdict, dmodel)``."""
    import torch

    dmodel = copy.deepcopy(pristine).to(DEVICE)
    dinputs = {k: _to(v, DEVICE) for k, v in inputs.items()}
    with torch.no_grad(), _ctx(stable):
        dout = _compiled(dmodel, mode)(**dinputs)
    v = judge(cache.forward(stable), dout, probe["random"], lambda: cache.ref64(stable),
              lambda: cache.noise(stable), **FWD_TOL)
    return v, dmodel


def _run_mode(mode: str, pristine, inputs, probe, cache, do_generate: bool, do_train: bool) -> dict:
    """One eager mode.  Where CPU's forward had ties in a topk and a stage differs, that
    stage is run again, on CPU and tpu, with a stable topk (``topk: [stages]``)."""
    import torch

    t0 = time.time()
    out: dict = {}
    ties = probe["topk_ties"]
    compiling = mode == "compile"
    if compiling:
        # compile mode checks the compiled forward and a compiled training step of every
        # architecture that takes input_ids (not only the fixed sample); compiled decoding
        # (transformers' static-cache path) has its own tests
        do_generate = False
        do_train = True
        graphs0 = _compile_counts()
    with torch.tpu.set_eager_mode("strict" if compiling else mode):
        try:
            v, dmodel = _forward(pristine, inputs, probe, cache, stable=False, mode=mode)
            if v["status"] == "mismatch" and ties:
                v, dmodel = _forward(pristine, inputs, probe, cache, stable=True, mode=mode)
                out["topk"] = ["forward"]
        except Exception as e:  # noqa: BLE001
            out.update(_error(e, "forward"), seconds=round(time.time() - t0, 2))
            return out
        out["forward"] = {"max_abs_err": v["max_abs_err"], "where": v["where"], "outputs": v["n"]}
        out["status"] = v["status"]
        if v["shape_only"]:
            out["forward"]["shape_only"] = v["shape_only"]
            out["reason"] = (f"forward draws random numbers (CPU output changes with the seed): "
                             f"{', '.join(v['shape_only'][:4])} compared by dtype/shape only")
        if v["f64"]:
            out["forward"]["f64"] = v["f64"]
            if v["status"] == "pass-f64":
                k, i = next(iter(v["f64"].items()))
                out["reason"] = (f"forward {k}: {v['detail']} from CPU float32; within float32 rounding "
                                 f"noise of a float64 CPU run ("
                                 + (i["shape"] if "shape" in i else
                                    f"tpu err {i['tpu_err']:.3g}, CPU float32 err {i['cpu_err']:.3g}, "
                                    f"1-ulp perturbed CPU float32 err {i['noise_err']:.3g}") + ")")
        if v["status"] == "mismatch":
            out.update(reason=f"forward {v['where']}: {v['detail']}", max_abs_err=v["max_abs_err"])
            out["seconds"] = round(time.time() - t0, 2)
            return out
        if do_generate and "input_ids" in inputs:
            if probe["random"]:
                out["generate"] = {"status": "skipped", "reason": "forward draws random numbers"}
            else:
                g = _check_generate(cache, dmodel, inputs, stable=False)
                if g.get("status") == "mismatch" and ties:
                    g = _check_generate(cache, dmodel, inputs, stable=True)
                    out.setdefault("topk", []).append("generate")
                out["generate"] = g
                _merge(out, g, "generate")
        if do_train and out["status"] in PASSING and "input_ids" in inputs:
            t = _check_train(cache, pristine, inputs, stable=False, mode=mode)
            if t.get("status") == "mismatch" and ties:
                t = _check_train(cache, pristine, inputs, stable=True, mode=mode)
                out.setdefault("topk", []).append("train")
            out["train"] = t
            _merge(out, t, "train")
    if compiling:
        out["graphs"] = {k: v - graphs0[k] for k, v in _compile_counts().items()}
    out["seconds"] = round(time.time() - t0, 2)
    return out


def _compile_counts() -> dict:
    """Compiled graphs and Dynamo graph breaks so far in this process."""
    import torch._dynamo.utils

    import torchtpu

    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    return {"compiled": torchtpu.metrics()["compile"]["graphs_compiled"], "graph_breaks": breaks}


def finalize(res: dict) -> None:
    """Top-level ``status`` (and reason, stage, ...) of a record: its worst mode's; the
    mode is ``worst_mode``."""
    ms = res.get("modes")
    if not ms:
        return
    order = [m for m in MODES if m in ms] + [m for m in ms if m not in MODES]
    worst = min(order, key=lambda m: _SEVERITY.get(ms[m].get("status"), 0))
    w = ms[worst]
    for k in ("reason", "stage", "missing_op", "where", "max_abs_err"):
        res.pop(k, None)
        if w.get(k) is not None:
            res[k] = w[k]
    res["status"] = w.get("status", "crash")
    res["worst_mode"] = worst


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


def _check_generate(cache, dmodel, inputs, stable: bool = False) -> dict:
    import torch

    ids = inputs["input_ids"]
    kw = dict(max_new_tokens=GEN_TOKENS, min_new_tokens=GEN_TOKENS, do_sample=False, num_beams=1)
    gc = getattr(cache.model, "generation_config", None)
    if gc is not None and gc.pad_token_id is None:
        eos = gc.eos_token_id
        kw["pad_token_id"] = (eos[0] if isinstance(eos, list) and eos else eos) if eos is not None else 0
    try:
        ref = cache.generate(kw, stable)
    except Exception as e:  # noqa: BLE001
        return {"status": "skipped-cpu", "reason": _first_line(e)}
    try:
        with torch.no_grad(), _ctx(stable):
            got = dmodel.generate(input_ids=ids.to(DEVICE), attention_mask=torch.ones_like(ids).to(DEVICE), **kw)
    except Exception as e:  # noqa: BLE001
        return _error(e, "generate")
    got = got.cpu()
    if got.shape != ref.shape or not torch.equal(got, ref):
        n = int((got != ref).sum()) if got.shape == ref.shape else -1
        return {"status": "mismatch", "reason": f"generated ids differ ({n} tokens; cpu {ref[:, ids.shape[1]:].tolist()} "
                                                  f"tpu {got[:, ids.shape[1]:].tolist()})"}
    return {"status": "pass"}


def _check_train(cache, pristine, inputs, stable: bool = False, mode: str = "strict") -> dict:
    import torch

    kw = {k: v for k, v in inputs.items() if k != "use_cache"}
    kw["labels"] = inputs["input_ids"]
    try:
        cl, cgrads = cache.train(kw, stable)
    except Exception as e:  # noqa: BLE001
        return {"status": "skipped-cpu", "reason": _first_line(e)}
    try:
        dmodel = copy.deepcopy(pristine).to(DEVICE)
        with _ctx(stable):
            dloss = _compiled(dmodel, mode)(**{k: _to(v, DEVICE) for k, v in kw.items()}).loss
            dloss.backward()
    except Exception as e:  # noqa: BLE001
        return _error(e, "train")
    worst = {"status": "pass", "max_abs_err": 0.0, "where": None}
    dl = dloss.detach().cpu()
    if not torch.allclose(cl, dl, **TRAIN_TOL):
        return {"status": "mismatch", "reason": f"loss cpu {float(cl):.6g} tpu {float(dl):.6g}",
                "max_abs_err": float((cl - dl).abs())}
    dparams = dict(dmodel.named_parameters())
    for n, cg in cgrads.items():
        q = dparams[n]
        if (cg is None) != (q.grad is None):
            if mode == "compile" and cg is None and not bool(q.grad.cpu().any()):
                # a parameter only outputs outside the loss read: PyTorch's own
                # AOTAutograd (torch.compile(backend="aot_eager") on CPU) also gives it a
                # zero gradient where eager leaves None (tangents of unused outputs are
                # materialized as zeros)
                worst.setdefault("zero_grad_where_cpu_none", []).append(n)
                continue
            return {"status": "mismatch", "reason": f"grad of {n}: cpu {'None' if cg is None else 'set'}, "
                                                    f"tpu {'None' if q.grad is None else 'set'}"}
        if cg is None:
            continue
        g = q.grad.cpu()
        err = float((cg.double() - g.double()).abs().max()) if cg.numel() else 0.0
        if not torch.allclose(cg, g, equal_nan=True, **TRAIN_TOL):
            return {"status": "mismatch", "reason": f"grad of {n}: max abs err {err:.3g}", "max_abs_err": err}
        if err > worst["max_abs_err"]:
            worst.update(max_abs_err=err, where=n)
    return worst


def _worker(arch: dict, do_train: bool, threads: int, modes, conn) -> None:
    """Runs in the worker process: sends ``("partial", record)`` after the CPU side and
    after each mode but the last, then ``("final", record)`` (or ``("crash", reason)``)."""
    try:
        _setup_worker(threads)
        res = run_architecture(arch, do_train=do_train, modes=tuple(modes),
                               on_progress=lambda r: conn.send(("partial", r)))
        msg = ("final", res)
    except BaseException as e:  # noqa: BLE001
        msg = ("crash", f"worker: {_first_line(e)}")
    try:
        conn.send(msg)
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------
# Sweep driver


def migrate(rec: dict) -> dict:
    """A record from before per-mode results (no ``modes``) was a strict-mode run."""
    if "modes" in rec or rec.get("status") == "skipped-cpu":
        return rec
    m = {k: rec[k] for k in ("status", "reason", "stage", "missing_op", "where", "max_abs_err",
                              "forward", "generate", "train", "seconds") if k in rec}
    rec = dict(rec)
    for k in ("forward", "generate", "train"):
        rec.pop(k, None)
    rec["modes"] = {"strict": m}
    finalize(rec)
    return rec


def merge_record(old: Optional[dict], new: dict) -> dict:
    """``new`` (the modes just run) over ``old`` (modes recorded before, kept when not rerun)."""
    if (old is None or "modes" not in new or "modes" not in old
            or new.get("status") == "skipped-cpu"):
        return new
    merged = dict(new)
    ms = {**old["modes"], **new["modes"]}
    merged["modes"] = {m: ms[m] for m in [m for m in MODES if m in ms] + [m for m in ms if m not in MODES]}
    finalize(merged)
    return merged


def modes_to_run(rec: Optional[dict], modes, rerun: bool) -> list[str]:
    if rerun or rec is None:
        return list(modes)
    if rec.get("status") == "skipped-cpu":
        return []
    have = rec.get("modes") or {}
    return [m for m in modes if m not in have]


def _load(path: str) -> dict:
    from torchtpu.conformance._common import load_json

    data = load_json(path)
    data["results"] = {k: migrate(v) for k, v in data.get("results", {}).items()}
    return data


def _save(path: str, data: dict) -> None:
    from torchtpu.conformance._common import save_json

    save_json(path, data)


def _incomplete(arch: dict, partial: Optional[dict], modes, status: str, reason: str) -> dict:
    """The record of a worker that died or timed out: the mode it was in (every requested
    mode when the CPU side had not finished) gets ``status``."""
    if partial is None or "modes" not in partial:
        rec = {"name": arch["name"], "model_types": arch["model_types"], "tasks": arch["tasks"],
               "modes": {m: {"status": status, "reason": reason} for m in modes}}
        if partial is not None:
            rec = {**partial, **rec}
    else:
        rec = copy.deepcopy(partial)
        todo = [m for m in modes if m not in rec["modes"]]
        if todo:
            rec["modes"][todo[0]] = {"status": status, "reason": reason}
    finalize(rec)
    return rec


def sweep(archs: list, train: set[str], jobs: int = 1, timeout: float = DEFAULT_TIMEOUT,
          on_result=None, progress: bool = True, modes=("strict",)) -> list[dict]:
    """Run each architecture in its own worker process (forkserver, torch and transformers
    preloaded); at most ``jobs`` at a time.  ``archs``: arch dicts (each run in ``modes``) or
    ``(arch, modes)`` pairs.  A worker is killed when one stage (the CPU side, or one mode)
    takes more than ``timeout`` seconds."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "transformers", "transformers.modeling_utils",
                                "transformers.models.auto.modeling_auto",
                                "torchtpu.conformance.models"])
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))
    pending = [a if isinstance(a, tuple) else (a, list(modes)) for a in archs]
    n_total = len(pending)
    running: list = []  # [arch, modes, proc, conn, start, last message time, partial]
    results = []
    from torchtpu.conformance._common import progress_bar

    bar = progress_bar(len(pending), "arch") if progress else None

    def finish(arch, res):
        results.append(res)
        if on_result:
            on_result(res)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{arch['name'][:30]}: {res['status']}")
        else:
            ms = res.get("modes") or {}
            per = " ".join(f"{m}={ms[m].get('status')}" for m in ms) if len(ms) > 1 else ""
            print(f"[{len(results)}/{n_total}] {arch['name']}: "
                  f"{res['status']} {per} {res.get('reason', '') or ''}"[:240], flush=True)

    try:
        while pending or running:
            while pending and len(running) < jobs:
                arch, ms = pending.pop(0)
                r, w = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_worker, args=(arch, arch["name"] in train, threads, ms, w), daemon=True)
                p.start()
                w.close()
                now = time.time()
                running.append([arch, ms, p, r, now, now, None])
            time.sleep(0.05)
            still = []
            for entry in running:
                arch, ms, p, r, t0, last, partial = entry
                res = None
                try:
                    while res is None and r.poll():
                        kind, payload = r.recv()
                        entry[5] = last = time.time()
                        if kind == "partial":
                            entry[6] = partial = payload
                        elif kind == "final":
                            res = payload
                        else:
                            res = _incomplete(arch, partial, ms, "crash", payload)
                except (EOFError, OSError):
                    p.join(5)
                    res = _incomplete(arch, partial, ms, "crash", f"worker died (exit code {p.exitcode})")
                if res is None and not p.is_alive() and not r.poll():
                    res = _incomplete(arch, partial, ms, "crash", f"worker died (exit code {p.exitcode})")
                elif res is None and time.time() - last > timeout:
                    p.kill()
                    p.join(5)
                    res = _incomplete(arch, partial, ms, "timeout", f"no result after {timeout:.0f} s")
                if res is None:
                    still.append(entry)
                    continue
                p.join(10)
                if p.is_alive():
                    p.kill()
                r.close()
                res.setdefault("seconds", round(time.time() - t0, 2))
                finish(arch, res)
            running = still
    finally:
        for entry in running:
            entry[2].kill()
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


def _modes_of(rs) -> list[str]:
    seen = {m for r in rs for m in (r.get("modes") or {})}
    return [m for m in MODES if m in seen] + sorted(seen - set(MODES))


def _ordered(ms: dict) -> list:
    """A record's ``modes`` items in :data:`MODES` order."""
    return sorted(ms.items(), key=lambda kv: (MODES.index(kv[0]) if kv[0] in MODES else len(MODES), kv[0]))


def _why_not_pass(r: dict) -> Optional[str]:
    """Why an architecture does not plainly pass (worst mode), or None."""
    st = r["status"]
    if st == "pass":
        return None
    if st == "skipped-cpu":
        return f"skipped-cpu: {root_cause(r)}"
    if st == "pass-shape-only":
        return "pass-shape-only: forward draws random numbers (tpu's random stream is not CPU's)"
    if st == "pass-f64":
        return "pass-f64: float32 rounding beyond rtol=atol=1e-4 (ill-conditioned tiny model)"
    if st == "mismatch":
        return f"mismatch ({r.get('stage', 'forward')})"
    return f"{st}: {root_cause(r)}"


def _cell(s) -> str:
    return str(s).replace("|", "/").replace("\n", " ")


def summarize(results: dict, n_enumerated: int) -> str:
    rs = [migrate(r) for r in results.values()]
    modes = _modes_of(rs)
    ran_cpu = [r for r in rs if r["status"] != "skipped-cpu"]
    lines = ["# Hugging Face architecture sweep (tpu vs. CPU)", ""]
    lines.append(f"Architectures enumerated: **{n_enumerated}**; recorded: **{len(rs)}**; "
                 f"ran on CPU: **{len(ran_cpu)}**; modes: {', '.join(modes) or '-'}.")
    lines.append("")
    for m in modes:
        rec = [r for r in ran_cpu if m in r.get("modes", {})]
        c = Counter(r["modes"][m]["status"] for r in rec)
        ok = sum(c.get(s, 0) for s in PASSING)
        bad = ", ".join(f"{s} {c.get(s, 0)}" for s in STATUSES if s not in PASSING and s != "skipped-cpu")
        lines.append(f"* **{m}**: run in this mode: {len(rec)} of the {len(ran_cpu)} that ran on CPU; "
                     f"passed **{c.get('pass', 0)}** (**{100.0 * c.get('pass', 0) / max(1, len(rec)):.1f}%**); "
                     f"pass-f64 {c.get('pass-f64', 0)}, pass-shape-only {c.get('pass-shape-only', 0)}; "
                     f"all three **{ok}** (**{100.0 * ok / max(1, len(rec)):.1f}%**); {bad}.")
    if "compile" in modes:
        # issue-10 measure: of the architectures passing STRICT, how many pass compiled
        both = [r for r in ran_cpu if "compile" in r.get("modes", {})
                and r["modes"].get("strict", {}).get("status") in PASSING]
        ok = sum(1 for r in both if r["modes"]["compile"]["status"] in PASSING)
        trained = sum(1 for r in both
                      if r["modes"]["compile"].get("train", {}).get("status") in PASSING)
        lines.append(f"* **compile vs strict**: of the {len(both)} architectures that pass STRICT and "
                     f"ran compiled, **{ok}** (**{100.0 * ok / max(1, len(both)):.1f}%**) pass compiled "
                     f"(forward through `torch.compile(model, backend=\"tpu\")`; a compiled training "
                     f"step, loss and every gradient, wherever CPU's runs with `labels=input_ids`: "
                     f"{trained} of them; graph breaks run in STRICT).")
    lines.append("")
    lines.append("Forward: every output tensor rtol=atol=1e-4 (**pass**); greedy generate (8 tokens) ids "
                 "equal for causal LMs; training step (loss and all grads, rtol=atol=1e-3) for the fixed "
                 "sample.  **pass-f64**: an output differs from CPU float32 beyond the tolerance but is as "
                 f"close to a float64 CPU run as float32 rounding allows (|tpu - f64| <= atol + rtol*|f64| + "
                 f"{F64_FACTOR:g} * E element-wise, E = the largest max|cpu32 - f64| of CPU float32 and of two "
                 "CPU float32 runs with every floating weight, buffer and input perturbed by one ulp), or CPU "
                 "float32's own output shape differs from float64's.  **pass-shape-only**: forward draws random numbers (two CPU "
                 "runs with different seeds differ, the same seed reproduces): those outputs are "
                 "compared by dtype and shape (rank where CPU's shape changes with the seed), every "
                 "other output by value.")
    lines.append("")
    lines.append("| class | " + " | ".join(modes) + " |")
    lines.append("|---|" + "---|" * len(modes))
    for s in STATUSES:
        if s == "skipped-cpu":
            cells = [str(len(rs) - len(ran_cpu))] * len(modes)
        else:
            cells = [str(sum(1 for r in ran_cpu if r.get("modes", {}).get(m, {}).get("status") == s))
                     for m in modes]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines.append("")

    def rows(status):
        """(name, modes, per-mode record) grouped by identical reason."""
        out = []
        for r in sorted(ran_cpu, key=lambda r: r["name"]):
            groups: dict = {}
            for m, x in _ordered(r.get("modes") or {}):
                if x.get("status") == status:
                    groups.setdefault(x.get("reason") or "", []).append((m, x))
            for reason, mx in groups.items():
                out.append((r, [m for m, _ in mx], mx[0][1]))
        return out

    mism = rows("mismatch")
    lines.append(f"## Mismatches ({len({r['name'] for r, _, _ in mism})} architectures)")
    lines.append("")
    if mism:
        lines.append("| architecture | modes | stage | max abs err | detail |")
        lines.append("|---|---|---|---|---|")
        for r, ms, x in mism:
            err = x.get("max_abs_err")
            lines.append(f"| {r['name']} | {', '.join(ms)} | {x.get('stage', 'forward')} | "
                         f"{'' if err is None else f'{err:.3g}'} | {_cell(x.get('reason') or '')[:220]} |")
        lines.append("")
    groups: dict = defaultdict(lambda: defaultdict(set))
    for r in ran_cpu:
        for m, x in (r.get("modes") or {}).items():
            if x.get("status") in ("error", "timeout", "crash"):
                groups[root_cause({**x, "name": r["name"]})][r["name"]].add(m)
    lines.append("## Failures by root cause (sorted by number of architectures blocked)")
    lines.append("")
    lines.append("| root cause | architectures | modes | examples |")
    lines.append("|---|---|---|---|")
    for cause, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ms = sorted(set().union(*names.values()), key=lambda m: MODES.index(m) if m in MODES else 9)
        ex = ", ".join(sorted(names)[:5]) + (" …" if len(names) > 5 else "")
        lines.append(f"| {_cell(cause)} | {len(names)} | {', '.join(ms)} | {ex} |")
    lines.append("")
    f64 = rows("pass-f64")
    lines.append(f"## pass-f64 ({len({r['name'] for r, _, _ in f64})} architectures)")
    lines.append("")
    if f64:
        lines.append("| architecture | modes | output: tpu / CPU float32 / 1-ulp perturbed CPU float32 max abs err vs float64 |")
        lines.append("|---|---|---|")
        for r, ms, x in f64:
            det = "; ".join(f"{k}: " + (i["shape"] if "shape" in i else
                                                 f"{i['tpu_err']:.3g} / {i['cpu_err']:.3g} / {i.get('noise_err', 0):.3g}")
                            for k, i in list(x.get("forward", {}).get("f64", {}).items())[:3])
            lines.append(f"| {r['name']} | {', '.join(ms)} | {_cell(det)} |")
        lines.append("")
    so = rows("pass-shape-only")
    lines.append(f"## pass-shape-only ({len({r['name'] for r, _, _ in so})} architectures)")
    lines.append("")
    if so:
        lines.append("| architecture | modes | outputs compared by dtype/shape (CPU seed-dependent) | "
                     "compared by value |")
        lines.append("|---|---|---|---|")
        for r, ms, x in so:
            rnd = (r.get("cpu") or {}).get("random") or {}
            fwd = x.get("forward", {})
            by_val = fwd.get("outputs", 0) - len(fwd.get("shape_only", []))
            lines.append(f"| {r['name']} | {', '.join(ms)} | "
                         f"{_cell(', '.join(f'{k} ({v})' for k, v in sorted(rnd.items())))[:220]} | {by_val} |")
        lines.append("")
    ties = sorted(r["name"] for r in ran_cpu if (r.get("cpu") or {}).get("topk_ties"))
    if ties:
        stab = []
        for n in ties:
            used = {m: x["topk"] for m, x in _ordered(results[n].get("modes") or {}) if x.get("topk")}
            if used:
                stab.append(f"{n} ({'; '.join(f'{m}: ' + ', '.join(st) for m, st in used.items())})")
        lines.append(f"## topk ties ({len(ties)} architectures)")
        lines.append("")
        lines.append("CPU forward had exactly equal values competing in a `topk` (which of them CPU returns "
                     "is an implementation detail of its selection algorithm, not a defined result): "
                     + ", ".join(ties) + ".  Where a stage then differed, it ran again on CPU and tpu alike "
                     "with every topk replaced by the first k of a stable sort and was compared by value: "
                     + ("; ".join(stab) if stab else "none") + ".")
        lines.append("")
    trained = [r for r in ran_cpu if any("train" in x for x in (r.get("modes") or {}).values())]
    if trained:
        lines.append(f"## Training-step sample ({len(trained)})")
        lines.append("")
        lines.append("| architecture | " + " | ".join(f"train ({m})" for m in modes) + " | max grad abs err |")
        lines.append("|---|" + "---|" * len(modes) + "---|")
        for r in sorted(trained, key=lambda r: r["name"]):
            cells, err = [], None
            for m in modes:
                t = (r.get("modes", {}).get(m) or {}).get("train")
                if t is None:
                    cells.append("")
                    continue
                cells.append(f"{t['status']} {(t.get('reason') or '')[:100]}".strip())
                if t.get("max_abs_err") is not None:
                    err = max(err or 0.0, t["max_abs_err"])
            lines.append(f"| {r['name']} | " + " | ".join(_cell(c) for c in cells) +
                         f" | {'' if err is None else f'{err:.3g}'} |")
        lines.append("")
    why = Counter(w for w in (_why_not_pass(r) for r in ran_cpu) if w)
    skipped = Counter(root_cause(r) for r in rs if r["status"] == "skipped-cpu")
    lines.append("## Top-10 root causes")
    lines.append("")
    lines.append(f"Ran on CPU, not plainly passing in every mode run ({sum(why.values())} architectures):")
    lines.append("")
    lines.append("| root cause (worst mode) | architectures |")
    lines.append("|---|---|")
    for cause, n in why.most_common(10):
        lines.append(f"| {_cell(cause)} | {n} |")
    lines.append("")
    lines.append(f"Not run: building the tiny model or its CPU forward failed (skipped-cpu, "
                 f"{sum(skipped.values())} architectures):")
    lines.append("")
    lines.append("| root cause | architectures |")
    lines.append("|---|---|")
    for cause, n in skipped.most_common(10):
        lines.append(f"| {_cell(cause)} | {n} |")
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


def parse_modes(mode: Optional[str], full_sweep: bool) -> list[str]:
    """``--mode``: ``all``, one mode, or a comma list.  Without it: every mode, except for a
    full sweep (no --subset/--filter/--limit), which must name its modes (hours per mode)."""
    if mode is None:
        if full_sweep:
            raise SystemExit("a full sweep (no --subset, --filter or --limit) needs an explicit --mode "
                             "(strict, debug, defer_and_fuse, compile, a comma list, or all): each "
                             "mode takes hours")
        mode = "all"
    if mode == "all":
        return list(EAGER_MODES)
    ms = [m.strip().lower() for m in mode.split(",") if m.strip()]
    bad = [m for m in ms if m not in MODES]
    if bad or not ms:
        raise SystemExit(f"unknown mode(s) {bad or mode!r}: expected {', '.join(MODES)} or all "
                         f"(the eager modes)")
    return [m for m in MODES if m in ms]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torchtpu.conformance models",
                                 description="Hugging Face architecture sweep: tpu vs. CPU.")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes at a time (default 1)")
    ap.add_argument("--filter", default=None, help="regex on the model class name")
    ap.add_argument("--limit", type=int, default=None, help="at most N architectures (after filtering)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                    help="seconds per stage of an architecture (the CPU side; each mode)")
    ap.add_argument("--subset", default=None, help="'ci': a fixed list of small architectures")
    ap.add_argument("--mode", default=None,
                    help="mode(s) on tpu: strict, debug, defer_and_fuse, compile (torch.compile with "
                         "backend='tpu'), a comma list, or all (the three eager modes; default with "
                         "--subset/--filter/--limit; a full sweep must name its modes)")
    ap.add_argument("--rerun", action="store_true", help="rerun architectures already recorded (in these modes)")
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
    modes = parse_modes(args.mode, full_sweep=not (args.subset or args.filter or args.limit is not None))
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("TORCHTPU_MODELS_JAX_CACHE", os.path.abspath(os.path.join(args.out, ".jax_cache")))
    jpath = os.path.join(args.out, "models.json")
    data = _load(jpath)
    done = data["results"]
    todo = [(a, ms) for a in archs if (ms := modes_to_run(done.get(a["name"]), modes, args.rerun))]
    print(f"{len(archs_all)} architectures enumerated; {len(archs)} selected; "
          f"{len(archs) - len(todo)} already recorded in {','.join(modes)}; running {len(todo)} "
          f"(modes={','.join(modes)}, jobs={args.jobs}, timeout={args.timeout:.0f}s per stage)", flush=True)
    data["meta"] = {"enumerated": len(archs_all), "train_sample": sorted(train),
                    "fwd_tol": FWD_TOL, "train_tol": TRAIN_TOL, "f64_factor": F64_FACTOR,
                    "modes": list(MODES)}

    def on_result(res):
        done[res["name"]] = merge_record(done.get(res["name"]), res)
        _save(jpath, data)

    t0 = time.time()
    sweep(todo, train, jobs=args.jobs, timeout=args.timeout, on_result=on_result,
          progress=not args.no_progress)
    _save(jpath, data)
    md = summarize(done, len(archs_all))
    with open(os.path.join(args.out, "models.md"), "w") as f:
        f.write(md)
    sel = [done[a["name"]] for a in archs if a["name"] in done]
    print(f"done in {time.time() - t0:.0f}s; selected ({len(sel)}):")
    for m in modes:
        c = Counter("skipped-cpu" if r["status"] == "skipped-cpu" else (r.get("modes", {}).get(m) or {}).get("status", "not run")
                    for r in sel)
        print(f"  {m}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    for r in sel:
        for m, x in (r.get("modes") or {}).items():
            if m in modes and x.get("status") not in ("pass", "skipped-cpu"):
                print(f"  {r['name']} [{m}]: {x.get('status')}: {x.get('reason', '')}"[:300])
    print(f"wrote {jpath} and {os.path.join(args.out, 'models.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
