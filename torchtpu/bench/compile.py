"""``python -m torchtpu.bench compile``: torch.compile on tpu against eager, CPU and JAX.

    python -m torchtpu.bench compile [--rows mlp,small-mlp,cnn,llama,generate,coldwarm,coldwarm-model,coldwarm-precompile]
                                     [--columns jax,cpu,inductor,strict,defer_and_fuse,compiled]
                                     [--steps N] [--warmup N] [--new-tokens N] [--json PATH]
                                     [--cache-dir fresh|default|PATH] [--torch-threads 1]

One process (the ``coldwarm`` row starts two child processes).  Rows (issue 10, "Benchmark"):

* Training rows ``mlp`` (784-1024-1024-10, batch 64), ``small-mlp`` (128-256-256-10,
  batch 16: host overhead dominates), ``cnn`` and ``llama`` (the eager benchmark's models,
  ``torchtpu.bench.eager.*_workload``, same shapes and initial weights): one training step
  (forward, loss, backward, AdamW update, ``zero_grad``) timed in each column:

  - ``jax``: the same step hand-written in JAX and ``jax.jit``-ed (same shapes, initial
    weights and AdamW math: the XLA limit on this machine);
  - ``cpu``: plain PyTorch eager on CPU;
  - ``inductor``: ``torch.compile`` on CPU (Inductor, a peer), forward+loss and
    ``opt.step`` compiled; "n/a" with the reason when Inductor cannot run here (e.g. no
    C++ compiler);
  - ``strict`` / ``defer_and_fuse``: the eager modes on tpu;
  - ``compiled``: forward+loss compiled with ``backend="tpu"`` (AOTAutograd compiles its
    backward) plus a compiled ``opt.step``.

  Steady-state ms/step (after ``--warmup`` steps, the first call included in them; the
  timed steps end with one host sync), ratios to the JAX step, each column's first-call
  seconds and, for ``compiled``, the first call split as in ``torchtpu.metrics()["compile"]``
  (tracing / lowering / XLA seconds) with "our share" = (first call - XLA) / first call,
  and the Dynamo recompiles over the timed steps.  Each column's losses of the first and
  last step are recorded (all columns run the same number of steps from the same weights).

* ``generate``: the small Llama's greedy ``generate()`` of ``--new-tokens`` (64) tokens from a
  32-token prompt, batch 1: tokens/s of a warm call (after one untimed call) for ``cpu``
  (eager), ``strict`` and ``defer_and_fuse`` (default dynamic cache) and ``compiled``
  (``cache_implementation="static"``: transformers compiles the decoding forward with the
  ``"tpu"`` backend); per column the first call's seconds, XLA compiles (eager modes) or
  graphs/executables compiled and Dynamo recompiles (compiled) during the timed call, and
  whether the token ids equal CPU's.

* ``coldwarm``: the first call of the Llama's compiled training step in a fresh process
  with an empty persistent cache (``TORCHTPU_CACHE_DIR=<new tmpdir>``), then in a second
  fresh process with the cache the first one filled; both seconds, the ratio and the
  persistent-cache hits.  The step is the ``compiled`` column's: forward+loss and
  ``opt.step`` compiled.  ``coldwarm-model``: the same with only the model's forward+loss
  compiled (``torch.compile(model)``'s form: backward by AOTAutograd, AdamW eager).
  ``coldwarm-precompile``: ``coldwarm-model`` with PyTorch's experimental precompile
  (``TORCH_CACHING_PRECOMPILE=1`` in both processes, the first saving Dynamo's
  guards and bytecode with ``PrecompileContext.save_to_dynamo_cache()``), which skips
  Dynamo's trace in the second; torchtpu does not turn it on by itself (docs/compile.md).
  With transformers 5.x PyTorch's precompile refuses the Llama (its guards hold a class
  transformers defines inside a function); a row whose child fails prints the reason.

The benchmark process gets a new, empty persistent cache (``--cache-dir fresh``) so its
first calls compile cold, runs PyTorch's CPU kernels on one thread (``--torch-threads 1``:
on a shared, loaded machine spinning intra-op threads made CPU PyTorch 10-100x slower),
and loads torchtpu's C++ helper before timing anything (its once-per-machine build is not
a compile cost of any column).  Not a timed test: numbers depend on the machine and its
load (reported in the JSON).  Results: ``docs/bench/compile.md``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch

from torchtpu.bench import timing

from torchtpu.bench import eager as _eager

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 1e-2  # torch.optim.AdamW's defaults
COLUMNS = ("jax", "cpu", "inductor", "strict", "defer_and_fuse", "compiled", "compiled_step")
COLDWARM_ROWS = {"coldwarm": ("step", False), "coldwarm-model": ("model", False),
                 "coldwarm-precompile": ("model", True)}  # row -> (form, precompile)
ROWS = ("mlp", "small-mlp", "cnn", "llama", "generate", *COLDWARM_ROWS)
TRAIN_ROWS = {
    # name: (workload, default timed steps)
    "mlp": (_eager.mlp_workload, 30),
    "small-mlp": (lambda: _eager.mlp_workload((128, 256, 256, 10), 16), 50),
    "cnn": (_eager.cnn_workload, 20),
    "llama": (_eager.llama_workload, 10),
}
_SPLIT = ("tracing_seconds", "lowering_seconds", "xla_seconds")


# ------------------------------------------------------------------ hand-written JAX losses
def _jnp():
    import jax
    import jax.numpy as jnp

    return jax, jnp


def _xent(logits, y):
    """Mean cross-entropy of float32 ``logits (N, C)`` against int ``y (N,)``."""
    jax, jnp = _jnp()
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def _jax_mlp_loss(model):
    lin = [i for i, m in enumerate(model) if isinstance(m, torch.nn.Linear)]

    def loss(p, x, y):
        jax, _ = _jnp()
        h = x
        for j, i in enumerate(lin):
            h = h @ p[f"{i}.weight"].T + p[f"{i}.bias"]
            if j < len(lin) - 1:
                h = jax.nn.relu(h)
        return _xent(h, y)

    return loss


def _jax_cnn_loss(model):
    """Conv(3,16)-ReLU-MaxPool-Conv(16,32)-ReLU-MaxPool-Flatten-Linear, NCHW as PyTorch."""
    from jax import lax

    def loss(p, x, y):
        jax, jnp = _jnp()
        h = x
        for i in (0, 3):  # conv 3x3 padding 1, ReLU, max-pool 2x2
            h = lax.conv_general_dilated(h, p[f"{i}.weight"], (1, 1), ((1, 1), (1, 1)),
                                         dimension_numbers=("NCHW", "OIHW", "NCHW"))
            h = jax.nn.relu(h + p[f"{i}.bias"][None, :, None, None])
            h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        h = h.reshape(h.shape[0], -1) @ p["7.weight"].T + p["7.bias"]
        return _xent(h, y)

    return loss


def _jax_llama_loss(model):
    """Hugging Face ``LlamaForCausalLM``'s causal-LM loss (RMSNorm in float32, rotary
    embeddings with HF's ``rotate_half`` layout, causal softmax attention, SwiGLU MLP,
    untied or tied ``lm_head``; labels = inputs shifted by one, mean over tokens)."""
    cfg = model.config
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // nh
    eps = cfg.rms_norm_eps
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        raise NotImplementedError(f"JAX Llama: rope_type {rope['rope_type']!r}")

    def loss(p, ids):
        jax, jnp = _jnp()
        f32 = jnp.float32

        def rms(x, w):
            return w * (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps))

        def rot(x, cos, sin):
            x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
            return x * cos + jnp.concatenate([-x2, x1], -1) * sin

        b, t = ids.shape
        inv = 1.0 / (theta ** (jnp.arange(0, hd, 2, dtype=f32) / hd))
        fr = jnp.arange(t, dtype=f32)[:, None] * inv[None, :]
        emb = jnp.concatenate([fr, fr], -1)
        cos, sin = jnp.cos(emb).astype(f32), jnp.sin(emb).astype(f32)
        causal = jnp.tril(jnp.ones((t, t), bool))
        h = p["model.embed_tokens.weight"][ids]
        for i in range(cfg.num_hidden_layers):
            q = f"model.layers.{i}."
            a = rms(h, p[q + "input_layernorm.weight"])

            def proj(name, n, a=a, q=q):
                return (a @ p[q + f"self_attn.{name}.weight"].T).reshape(b, t, n, hd) \
                    .transpose(0, 2, 1, 3)

            qs, ks, vs = proj("q_proj", nh), proj("k_proj", nkv), proj("v_proj", nkv)
            qs, ks = rot(qs, cos, sin), rot(ks, cos, sin)
            ks, vs = jnp.repeat(ks, nh // nkv, axis=1), jnp.repeat(vs, nh // nkv, axis=1)
            s = jnp.where(causal, (qs @ ks.swapaxes(-1, -2)) * hd ** -0.5, -jnp.inf)
            o = (jax.nn.softmax(s, axis=-1) @ vs).transpose(0, 2, 1, 3).reshape(b, t, nh * hd)
            h = h + o @ p[q + "self_attn.o_proj.weight"].T
            a = rms(h, p[q + "post_attention_layernorm.weight"])
            m = jax.nn.silu(a @ p[q + "mlp.gate_proj.weight"].T) * (a @ p[q + "mlp.up_proj.weight"].T)
            h = h + m @ p[q + "mlp.down_proj.weight"].T
        h = rms(h, p["model.norm.weight"])
        logits = h @ p.get("lm_head.weight", p["model.embed_tokens.weight"]).T
        return _xent(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    return loss


JAX_LOSSES = {"mlp": _jax_mlp_loss, "small-mlp": _jax_mlp_loss, "cnn": _jax_cnn_loss,
              "llama": _jax_llama_loss}


def jax_step(model, batch, loss_of):
    """The training step (loss, gradients, AdamW with PyTorch's defaults) hand-written in
    JAX and ``jax.jit``-ed, from ``model``'s trainable parameters (float32, on JAX's
    default device) and ``batch`` (CPU tensors).  Returns ``step()`` -> the loss before the
    update (a JAX scalar, not waited for)."""
    jax, jnp = _jnp()
    params = {n: jnp.asarray(p.detach().numpy().copy()) for n, p in model.named_parameters()}
    zeros = jax.tree.map(jnp.zeros_like, params)
    state = (params, zeros, jax.tree.map(jnp.zeros_like, params),
             jnp.zeros((), jnp.float32))  # float32: b1 ** t stays float32 under x64
    xs = tuple(jnp.asarray(t.numpy()) for t in batch)

    # donated: the parameters and optimizer state are updated in place, as the compiled
    # torch graphs donate theirs (a JAX step without donation copies every buffer)
    @functools.partial(jax.jit, donate_argnums=(0,))
    def step(state, xs):
        ps, m, v, t = state
        loss, g = jax.value_and_grad(loss_of)(ps, *xs)
        t = t + 1
        b1, b2 = BETAS
        m = jax.tree.map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
        v = jax.tree.map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t

        def upd(p, m_, v_):
            p = p * (1 - LR * WD)
            return p - LR * (m_ / c1) / (jnp.sqrt(v_ / c2) + EPS)

        return (jax.tree.map(upd, ps, m, v), m, v, t), loss

    box = [state]

    def run():
        box[0], loss = step(box[0], xs)
        return loss

    run.state = box  # (params, m, v, t) after the last step: donated by the next one
    return run


# ------------------------------------------------------------------ PyTorch steps
def torch_step(model, batch, loss, backend=None):
    """One training step of ``model`` (forward + ``loss``, backward, AdamW with PyTorch's
    defaults, ``zero_grad``) on ``batch`` (tensors already on the model's device).
    ``backend``: ``None`` (eager) or a ``torch.compile`` backend ("tpu", "inductor") for
    the forward+loss (its backward compiled by AOTAutograd) and for ``opt.step``.
    Returns ``step()`` -> the loss tensor before the update."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)

    def loss_fn(*xs):
        return loss(model, *xs)

    def opt_step():
        opt.step()

    if backend is not None:
        loss_fn = torch.compile(loss_fn, backend=backend)
        opt_step = torch.compile(opt_step, backend=backend)

    def step():
        out = loss_fn(*batch)
        out.backward()
        opt_step()
        opt.zero_grad()
        return out

    return step


def torch_whole_step(model, batch, loss):
    """The same training step as :func:`torch_step`, compiled as one function
    (``torch.compile(train_step, backend="tpu")`` with ``loss.backward()``, ``opt.step()``
    and ``opt.zero_grad()`` inside), traced with ``torch._dynamo.config.trace_autograd_ops``
    so that Dynamo traces the backward into the forward's graph (one executable for
    forward + backward) instead of breaking the graph at ``backward()`` (the returned loss
    is detached before ``backward()`` for that).  ``Optimizer.step``
    breaks the graph itself (``torch.optim.optimizer._use_grad``, PyTorch issue 104053),
    so the update stays its own graph.  Returns ``step()`` -> the loss (detached) before
    the update; the caller sets ``trace_autograd_ops`` while it runs."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)

    def train_step(*xs):
        out = loss(model, *xs)
        # the value to return is taken before backward(): a compiled function that
        # returns a tensor whose grad_fn backward() consumes makes Dynamo break the graph
        # at backward() ("autograd.grad consumed returned tensor's grad_fn"), and the
        # backward then runs in the autograd engine, a graph of its own
        val = out.detach()
        out.backward()
        opt.step()
        opt.zero_grad()
        return val

    compiled = torch.compile(train_step, backend="tpu")

    def step():
        return compiled(*batch)

    return step


def _tsync(out):
    return float(out.detach().cpu())


def _jsync(out):
    return float(out.block_until_ready())


ROUNDS = 3  # timed rounds per column (median, min..max)


def _time(step, steps, warmup, sync):
    """The rule of :mod:`torchtpu.bench.timing`: warm-up of at least ``warmup`` steps
    (each synced) that goes on until nothing new is built, then ``ROUNDS`` rounds of
    ``steps`` steps.  ``{"first_call_s", "ms_per_step"`` (median per step), ``"ms_min"``,
    ``"ms_max"``, ``"warmup_steps"``, ``"warmup_settled"``, ``"built_while_timing"``,
    ``"loss_first"`` (step 1), ``"loss_last"`` (the loss of step ``loss_step``, reached by
    every column), ``"loss_step"``, ``"steps_run"}``."""
    w = timing.warm_up(step, sync, min_steps=warmup, steps=steps)
    r = timing.time_rounds(step, sync, rounds=ROUNDS, steps=steps)
    loss_step = timing.min_warmup_steps(warmup)
    values = w["values"]
    return {"first_call_s": w["first_call_s"], "ms_per_step": r["ms_median"],
            "ms_min": r["ms_min"], "ms_max": r["ms_max"], "warmup_steps": w["steps"],
            "warmup_settled": w["settled"], "built_while_timing": r["built_while_timing"],
            "loss_first": values[0], "loss_last": values[loss_step - 1],
            "loss_step": loss_step, "steps_run": w["steps"] + ROUNDS * steps}


def _launches(m) -> int:
    """XLA programs launched so far in STRICT, from ``torchtpu.metrics()`` ``m``: per-op
    executables (less the ops recorded into stitched segments), DeferAndFuse segments
    run (a stitched training step is one), and graphs launched on their own."""
    return (m["lowered_ops"] - m["stitched_ops"] + m["segments_run"]
            + m["compile"]["graph_launches"])


def _na(e):
    msg = str(e).strip().splitlines()
    return f"n/a: {type(e).__name__}: {msg[0][:200] if msg else ''}"


def train_row(name, steps=None, warmup=3, columns=COLUMNS):
    """Run one training row (``name`` in ``TRAIN_ROWS``) in ``columns``.  Each column gets
    a fresh copy of the same initial model and runs ``warmup + steps`` steps on the same
    batch.  Returns ``{"row", "steps", "warmup", "columns": {col: {...} or "n/a: why"},
    "ratio_to_jax": {col: x}}``; the ``compiled`` column adds ``compile_split_s``,
    ``our_share_of_first_call``, ``persistent_cache_hits_first_call``,
    ``recompiles_after_first_step``, ``executables_after_first_step``,
    ``graph_calls_per_step`` and ``programs_per_step`` (XLA programs launched per step
    after the first: one for a stitched step)."""
    import torchtpu

    if warmup < 1:
        raise ValueError("warmup must be >= 1 (the first call is one of the warm-up steps)")
    workload, default_steps = TRAIN_ROWS[name]
    steps = default_steps if steps is None else steps
    base, batch, loss = workload()
    res = {}
    for col in columns:
        if col == "jax":
            try:
                res[col] = _time(jax_step(base, batch, JAX_LOSSES[name](base)), steps, warmup,
                                 _jsync)
            except NotImplementedError as e:
                res[col] = _na(e)
        elif col == "cpu":
            res[col] = _time(torch_step(copy.deepcopy(base), batch, loss), steps, warmup, _tsync)
        elif col == "inductor":
            torch._dynamo.reset()
            try:
                res[col] = _time(torch_step(copy.deepcopy(base), batch, loss, "inductor"),
                                 steps, warmup, _tsync)
            except Exception as e:  # noqa: BLE001 - a peer that cannot run here is "n/a"
                res[col] = _na(getattr(e, "inner_exception", None) or e)
            torch._dynamo.reset()
        elif col in ("strict", "defer_and_fuse"):
            tb = tuple(t.to("tpu") for t in batch)
            with torch.tpu.set_eager_mode(col):
                res[col] = _time(torch_step(copy.deepcopy(base).to("tpu"), tb, loss),
                                 steps, warmup, _tsync)
        elif col in ("compiled", "compiled_step"):
            tb = tuple(t.to("tpu") for t in batch)
            torch._dynamo.reset()
            if col == "compiled":
                step = torch_step(copy.deepcopy(base).to("tpu"), tb, loss, "tpu")
            else:
                step = torch_whole_step(copy.deepcopy(base).to("tpu"), tb, loss)
            m0 = torchtpu.metrics()
            box = {}

            def counted(step=step, box=box):
                out = step()
                if "after_first" not in box:
                    _tsync(out)
                    box["after_first"] = torchtpu.metrics()
                return out

            prev = torch._dynamo.config.trace_autograd_ops
            torch._dynamo.config.trace_autograd_ops = col == "compiled_step" or prev
            try:
                r = _time(counted, steps, warmup, _tsync)
            finally:
                torch._dynamo.config.trace_autograd_ops = prev
            m1, m2 = box["after_first"], torchtpu.metrics()
            c0, c1, c2 = m0["compile"], m1["compile"], m2["compile"]
            split = {k: c1[k] - c0[k] for k in _SPLIT}
            r.update(
                compile_split_s=split,
                our_share_of_first_call=(r["first_call_s"] - split["xla_seconds"])
                / r["first_call_s"],
                persistent_cache_hits_first_call=(m1["persistent_cache"]["hits"]
                                                  - m0["persistent_cache"]["hits"]),
                graphs_compiled=c1["graphs_compiled"] - c0["graphs_compiled"],
                recompiles_after_first_step=c2["recompiles"] - c1["recompiles"],
                executables_after_first_step=c2["executables"] - c1["executables"],
                graph_calls_per_step=(c2["graph_calls"] - c1["graph_calls"])
                / (r["steps_run"] - 1),
                programs_per_step=(_launches(m2) - _launches(m1)) / (r["steps_run"] - 1),
                timed_steps_after_first=r["steps_run"] - 1)
            res[col] = r
            torch._dynamo.reset()
        else:
            raise ValueError(f"unknown column {col!r}; expected one of {COLUMNS}")
    jax_ms = res.get("jax", {}).get("ms_per_step") if isinstance(res.get("jax"), dict) else None
    ratios = {k: v["ms_per_step"] / jax_ms for k, v in res.items()
              if jax_ms and isinstance(v, dict)}
    return {"row": name, "steps": steps, "warmup": warmup, "columns": res,
            "ratio_to_jax": ratios}


# ------------------------------------------------------------------ generate()
GEN_COLUMNS = ("cpu", "strict", "defer_and_fuse", "compiled")


def generate_row(new_tokens=64, columns=GEN_COLUMNS, prompt_len=32):
    """Greedy ``generate()`` of ``new_tokens`` tokens (no early stop) by the small Llama
    from a ``prompt_len``-token prompt, batch 1.  Per column: ``first_call_s``,
    ``tokens_per_s`` of a second (warm) call, ``ids_match_cpu``; eager modes add
    ``xla_compiles_timed_call``; ``compiled`` adds ``graphs_compiled``, ``recompiles``
    (over both calls) and ``executables_timed_call``."""
    import torchtpu

    base, (ids,), _ = _eager.llama_workload()
    base.eval()
    base.generation_config.eos_token_id = None  # always new_tokens tokens
    base.generation_config.pad_token_id = 0
    prompt = ids[:1, :prompt_len]
    kw = dict(max_new_tokens=new_tokens, do_sample=False)
    res, ref = {}, None
    order = ["cpu"] + [c for c in columns if c != "cpu"]  # CPU ids first: the reference
    for col in order:
        model = copy.deepcopy(base)
        ckw = dict(kw)
        if col == "compiled":
            ckw["cache_implementation"] = "static"
        if col != "cpu":
            model = model.to("tpu")
        x = prompt.to("cpu" if col == "cpu" else "tpu")
        mode = col if col in ("strict", "defer_and_fuse") else "strict"
        torch._dynamo.reset()
        with torch.tpu.set_eager_mode(mode), torch.no_grad():
            m0 = torchtpu.metrics()
            t0 = time.perf_counter()
            out = model.generate(x, **ckw).cpu()
            first = time.perf_counter() - t0
            m1 = torchtpu.metrics()
            t0 = time.perf_counter()
            out2 = model.generate(x, **ckw).cpu()
            dt = time.perf_counter() - t0
            m2 = torchtpu.metrics()
        n = out2.shape[1] - prompt.shape[1]
        r = {"first_call_s": first, "tokens_per_s": n / dt, "new_tokens": n}
        if col == "cpu":
            ref = out2
        r["ids_match_cpu"] = ref is not None and out.tolist() == ref.tolist() \
            and out2.tolist() == ref.tolist()
        if col in ("strict", "defer_and_fuse"):
            r["xla_compiles_timed_call"] = m2["compiles"] - m1["compiles"]
        if col == "compiled":
            r.update(graphs_compiled=m2["compile"]["graphs_compiled"]
                     - m0["compile"]["graphs_compiled"],
                     recompiles=m2["compile"]["recompiles"] - m0["compile"]["recompiles"],
                     executables_timed_call=m2["compile"]["executables"]
                     - m1["compile"]["executables"],
                     graph_calls_timed_call=m2["compile"]["graph_calls"]
                     - m1["compile"]["graph_calls"])
        if col in columns:
            res[col] = r
        torch._dynamo.reset()
    strict = res.get("strict", {}).get("tokens_per_s")
    return {"row": "generate", "new_tokens": new_tokens, "prompt_len": prompt_len,
            "columns": res,
            "ratio_to_strict": {k: v["tokens_per_s"] / strict for k, v in res.items()
                                if strict}}


# ------------------------------------------------------------------ cold vs warm start
def _model_step(model, batch, loss):
    """:func:`torch_step` with only the forward+loss compiled (``backend="tpu"``, the
    backward by AOTAutograd) and AdamW run eagerly: ``torch.compile(model)``'s form."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    loss_fn = torch.compile(lambda *xs: loss(model, *xs), backend="tpu")

    def step():
        out = loss_fn(*batch)
        out.backward()
        opt.step()
        opt.zero_grad()
        return out

    return step


def _first_call_child(name, form="step"):
    """In a child process: the first call of ``name``'s compiled training step (model
    and batch already on tpu); ``form``: ``step`` (:func:`torch_step`) or ``model``
    (:func:`_model_step`).  With ``TORCH_CACHING_PRECOMPILE=1`` it then saves PyTorch's
    precompile entries.  Prints one JSON line."""
    t_import = time.perf_counter()
    import torchtpu

    workload, _ = TRAIN_ROWS[name]
    native_s = _load_native_helper()
    base, batch, loss = workload()
    model = base.to("tpu")
    tb = tuple(t.to("tpu") for t in batch)
    # (before torch.compile: PyTorch's precompile loads its entries, and our graphs in
    # them, when the compiled function is created)
    m0 = torchtpu.metrics()
    step = (torch_step(model, tb, loss, "tpu") if form == "step"
            else _model_step(model, tb, loss))
    t0 = time.perf_counter()
    first_loss = _tsync(step())
    first = time.perf_counter() - t0
    m1 = torchtpu.metrics()
    if torch._dynamo.config.caching_precompile:
        from torch._dynamo.precompile_context import PrecompileContext

        PrecompileContext.save_to_dynamo_cache()
    print(json.dumps({
        "form": form,
        "loss": float(first_loss),
        "first_call_s": first,
        "setup_s": t0 - t_import,
        "native_helper_s": native_s,
        "compile_split_s": {k: m1["compile"][k] - m0["compile"][k] for k in _SPLIT},
        "persistent_cache": {k: m1["persistent_cache"][k] - m0["persistent_cache"][k]
                             for k in m1["persistent_cache"]},
        # torchtpu.compile.graph_cache: traced graphs / executables loaded from disk
        "graph_cache": {k: m1["compile"].get(k, 0) - m0["compile"].get(k, 0)
                        for k in ("graphs_compiled", "graph_cache_hits", "executables",
                                  "executable_cache_hits")},
        "cache_dir": torchtpu.persistent_cache_directory(),
    }))


def _load_native_helper():
    """Build or load torchtpu's small C++ helper (``torchtpu._tensor.native``, loaded by
    the first ``backward()`` on tpu) before anything is timed: its build is a
    once-per-machine cost (~30 s, cached under ``TORCH_EXTENSIONS_DIR``) that would
    otherwise land in whichever first call comes first.  Returns the seconds it took."""
    from torchtpu._tensor import native

    t0 = time.perf_counter()
    try:
        native.module()
    except NotImplementedError:  # no compiler: the first backward will say so
        pass
    return time.perf_counter() - t0


def coldwarm_row(name="llama", timeout=900, form="step", precompile=False):
    """First call of ``name``'s compiled training step (``form``, see
    :func:`_first_call_child`) in two fresh processes sharing a new, empty
    ``TORCHTPU_CACHE_DIR`` (cold, then warm; PyTorch's own cache directory,
    ``TORCHINDUCTOR_CACHE_DIR``, inside it), with PyTorch's precompile on in both when
    ``precompile``.  Returns ``{"row", "workload", "form", "precompile", "cold", "warm",
    "warm_over_cold"}``; ``cold``/``warm`` also give each process's wall seconds and the
    first step's loss (equal in both).  A child that fails gives ``{..., "error": its
    last line}`` instead (its stderr is printed)."""
    cache = tempfile.mkdtemp(prefix="torchtpu-bench-cache-")
    env = dict(os.environ, TORCHTPU_CACHE_DIR=cache,
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "torch"),
               TORCH_CACHING_PRECOMPILE="1" if precompile else "0")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = {"row": "coldwarm", "workload": name, "form": form, "precompile": precompile}
    try:
        for which in ("cold", "warm"):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "torchtpu.bench", "compile",
                                "--first-call-child", name, "--first-call-form", form,
                                "--torch-threads", str(torch.get_num_threads())], env=env, capture_output=True,
                               text=True, timeout=timeout)
            wall = time.perf_counter() - t0
            if p.returncode != 0:
                # (PyTorch's experimental precompile refuses some models: a row that
                # fails says why in the table instead of ending the whole run)
                lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
                out["error"] = f"{which} child failed: {lines[-1] if lines else p.returncode}"
                print(f"[{out['error']}]\n{p.stderr[-3000:]}", file=sys.stderr)
                return out
            r = json.loads(p.stdout.strip().splitlines()[-1])
            r["process_wall_s"] = wall
            out[which] = r
    finally:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)
    out["warm_over_cold"] = out["warm"]["first_call_s"] / out["cold"]["first_call_s"]
    return out


# ------------------------------------------------------------------ tables
def _f(v, fmt="{:.2f}"):
    return fmt.format(v) if isinstance(v, (int, float)) else str(v)


def print_tables(out, file=None):
    """Markdown tables of ``out`` (the JSON this command writes)."""
    p = lambda *a: print(*a, file=file)  # noqa: E731
    rows = out["rows"]
    mach = out.get("machine", {})
    la, lb = mach.get("loadavg"), mach.get("loadavg_end")
    cores = mach.get("cpus")
    thr = mach.get("torch_threads")
    if la:
        p(f"load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} (start)"
          + (f" / {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f} (end)" if lb else "")
          + f"; {cores} cores; torch CPU threads {thr}"
          + ("" if thr == mach.get("usable_cores") else
             f" (XLA columns use all {mach.get('usable_cores')} usable cores: NOT the same "
             "budget)")
          + "; JAX step jitted with donated buffers; ms: median of "
          f"{ROUNDS} rounds\n")
    train = [r for k, r in rows.items() if k in TRAIN_ROWS]
    if train:
        cols = [c for c in COLUMNS if any(c in r["columns"] for r in train)]
        p("| row | " + " | ".join(f"{c} ms (x JAX)" for c in cols)
          + " | compiled first call s (tracing/lowering/XLA) | our share | recompiles "
          "| persistent-cache hits in first call |")
        p("|---" * (len(cols) + 5) + "|")
        for r in train:
            cells = []
            for c in cols:
                v = r["columns"].get(c, "-")
                if isinstance(v, dict):
                    x = r["ratio_to_jax"].get(c)
                    cells.append(f"{v['ms_per_step']:.2f} [{v['ms_min']:.2f}..{v['ms_max']:.2f}]"
                                 + (f" ({x:.2f}x)" if x else "")
                                 + ("" if v.get("built_while_timing", 0) == 0 else
                                    f" {v['built_while_timing']} built while timed!"))
                else:
                    cells.append(v if v == "-" else "n/a")
            c = r["columns"].get("compiled")
            if isinstance(c, dict):
                sp = c["compile_split_s"]
                tail = (f"{c['first_call_s']:.1f} ({sp['tracing_seconds']:.1f}/"
                        f"{sp['lowering_seconds']:.1f}/{sp['xla_seconds']:.1f}) | "
                        f"{c['our_share_of_first_call']:.0%} | "
                        f"{c['recompiles_after_first_step']} in {c['timed_steps_after_first']}"
                        f" | {c['persistent_cache_hits_first_call']}")
            else:
                tail = "- | - | - | -"
            p(f"| {r['row']} | " + " | ".join(cells) + f" | {tail} |")
        na = {(r["row"], c): v for r in train for c, v in r["columns"].items()
              if isinstance(v, str)}
        for (row, c), v in na.items():
            p(f"\n{row} / {c}: {v}")
        calls = [f"{r['row']}: " + ", ".join(
            f"{c} {v['graph_calls_per_step']:.0f}" for c, v in r["columns"].items()
            if isinstance(v, dict) and "graph_calls_per_step" in v) for r in train]
        p("\nCompiled-graph calls per step: " + "; ".join(calls))
        progs = [f"{r['row']}: " + ", ".join(
            f"{c} {v['programs_per_step']:.1f}" for c, v in r["columns"].items()
            if isinstance(v, dict) and "programs_per_step" in v) for r in train]
        p("\nXLA programs launched per step (stitched graphs, eager ops): " + "; ".join(progs))
        p("\nFirst-call seconds per column: " + "; ".join(
            f"{r['row']}: " + ", ".join(f"{c} {v['first_call_s']:.1f}"
                                        for c, v in r["columns"].items() if isinstance(v, dict))
            for r in train))
    if "generate" in rows:
        g = rows["generate"]
        p(f"\n| generate ({g['new_tokens']} new tokens, prompt {g['prompt_len']}, batch 1) "
          "| first call s | tokens/s (warm) | x STRICT | compiles in timed call "
          "| recompiles | ids = CPU |")
        p("|---|---|---|---|---|---|---|")
        for c, v in g["columns"].items():
            comp = v.get("xla_compiles_timed_call", v.get("executables_timed_call", "-"))
            p(f"| {c} | {v['first_call_s']:.1f} | {v['tokens_per_s']:.1f} | "
              f"{_f(g['ratio_to_strict'].get(c, '-'))} | {comp} | {v.get('recompiles', '-')} | "
              f"{v['ids_match_cpu']} |")
    for row in [r for r in COLDWARM_ROWS if r in rows]:
        c = rows[row]
        what = {"step": "compiled step: forward+loss and opt.step",
                "model": "compiled forward+loss, eager AdamW"}[c.get("form", "step")]
        if c.get("precompile"):
            what += ", PyTorch's precompile"
        if "error" in c:
            p(f"\n{row} ({c['workload']} {what}): {c['error']}")
            continue
        p(f"\n| {row}: cold vs warm ({c['workload']} {what}; fresh process) | first call s "
          "| tracing/lowering/XLA s | persistent hits/misses | process wall s "
          "| C++ helper load s (before the first call) | graphs / executables loaded "
          "from the graph cache |")
        p("|---|---|---|---|---|---|---|")
        for k in ("cold", "warm"):
            v = c[k]
            sp, pc = v["compile_split_s"], v["persistent_cache"]
            gc = v.get("graph_cache", {})
            p(f"| {k} | {v['first_call_s']:.1f} | {sp['tracing_seconds']:.1f}/"
              f"{sp['lowering_seconds']:.1f}/{sp['xla_seconds']:.1f} | {pc['hits']}/"
              f"{pc['misses']} | {v['process_wall_s']:.1f} | {v['native_helper_s']:.1f} | "
              f"{gc.get('graph_cache_hits', '-')} of {gc.get('graphs_compiled', '-')} / "
              f"{gc.get('executable_cache_hits', '-')} of {gc.get('executables', '-')} |")
        p(f"\nwarm / cold = {c['warm_over_cold']:.0%}")


def _machine():
    import jax

    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)),
            "loadavg": list(os.getloadavg()), "torch": torch.__version__,
            "jax": jax.__version__}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torchtpu.bench compile")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    ap.add_argument("--columns", default=",".join(COLUMNS),
                    help=f"training columns, comma list of {', '.join(COLUMNS)}")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps per training row (default: mlp 30, small-mlp 50, "
                         "cnn 20, llama 10)")
    ap.add_argument("--warmup", type=int, default=3,
                    help="minimum warm-up steps incl. the first call; the warm-up goes on "
                         "until no executable is built for 3 steps (torchtpu.bench.timing)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    ap.add_argument("--cache-dir", default="fresh",
                    help="persistent XLA cache of this process: 'fresh' (default: a new empty "
                         "temporary directory, so first calls compile cold), 'default' (keep "
                         "TORCHTPU_CACHE_DIR / the default directory), or a path")
    ap.add_argument("--torch-threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="torch.set_num_threads for the whole run (default: every core this "
                         "process may use, the budget XLA's columns get; the table says "
                         "when it differs; 0 keeps PyTorch's default)")
    ap.add_argument("--first-call-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--first-call-form", default="step", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if args.first_call_child:
        _first_call_child(args.first_call_child, args.first_call_form)
        return 0
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    cols = [c.strip() for c in args.columns.split(",") if c.strip()]
    for r in rows:
        if r not in ROWS:
            ap.error(f"unknown row {r!r}; expected {', '.join(ROWS)}")
    fresh = _set_cache_dir(args.cache_dir)
    import torchtpu

    out = {"machine": _machine(), "rows": {}}
    out["machine"]["native_helper_s"] = _load_native_helper()
    out["machine"].update(torch_threads=torch.get_num_threads(),
                          persistent_cache_dir=torchtpu.persistent_cache_directory(),
                          cache_dir_option=args.cache_dir)
    try:
        _run_rows(out, rows, cols, args)
    finally:
        if fresh:
            import shutil

            shutil.rmtree(fresh, ignore_errors=True)
    out["machine"]["loadavg_end"] = list(os.getloadavg())
    print_tables(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def _set_cache_dir(option):
    """Point this process's persistent cache at ``option`` (see ``--cache-dir``) before
    torchtpu configures JAX; returns the temporary directory to delete, if any."""
    from torchtpu._device import runtime

    if option == "default":
        return None
    if runtime.jax.cache_info().currsize:
        raise RuntimeError("--cache-dir: JAX is already configured in this process")
    path = tempfile.mkdtemp(prefix="torchtpu-bench-cache-") if option == "fresh" else option
    os.environ["TORCHTPU_CACHE_DIR"] = path
    return path if option == "fresh" else None


def _run_rows(out, rows, cols, args):
    for r in rows:
        t0 = time.perf_counter()
        if r in TRAIN_ROWS:
            out["rows"][r] = train_row(r, args.steps, args.warmup, cols)
        elif r == "generate":
            gen_cols = [c for c in GEN_COLUMNS if c in cols or c == "cpu"]
            out["rows"][r] = generate_row(args.new_tokens, gen_cols)
        else:
            form, precompile = COLDWARM_ROWS[r]
            out["rows"][r] = coldwarm_row(form=form, precompile=precompile)
            out["rows"][r]["row"] = r
        out["rows"][r]["wall_s"] = time.perf_counter() - t0
        print(f"[{r}: {out['rows'][r]['wall_s']:.0f} s]", file=sys.stderr, flush=True)
