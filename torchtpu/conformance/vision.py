"""torchvision classification sweep: every ``torchvision.models`` classifier on ``tpu`` vs. CPU.

Usage (CLI; needs torchvision, e.g. the ``.venv-vision`` that ``make conformance-vision``
creates)::

    python -m torchtpu.conformance vision                  # all classification models
    python -m torchtpu.conformance vision --filter '^resnet' --jobs 2 --rerun

Per model (``torchvision.models.list_models(module=torchvision.models)``):

1. Parameters are counted on the meta device; a model over ``--max-params``
   (:data:`MAX_PARAMS`) is ``skipped-size``.
2. ``torch.manual_seed(0)``, ``weights=None`` (random init), ``eval()``; input batch 2,
   3 channels, the first of :data:`SIZES` whose CPU forward works (64x64 for most; ViT and
   MaxViT fix 224; Inception v3 needs 75+).  Building or the CPU forward failing at every
   size: ``skipped-cpu``.  A parameter of 2+ dimensions that random init leaves all
   zero (ViT's class token and classification head) is drawn from N(0, 0.02) instead,
   else every output and every gradient upstream of the head would be 0.
3. ``copy.deepcopy(model).to("tpu")``, forward, and the outputs compared with
   rtol=1e-4 and atol=1e-4 x max |CPU output| (:data:`FWD_TOL`): random-init networks
   without batch statistics reach logits from 1e-2 (GoogLeNet) to 1e9 (Inception v3),
   where an absolute tolerance is either blind or below float32 rounding.
4. The fixed training sample (:data:`TRAIN_SAMPLE`; ``--train all`` for every model) also
   runs one training step in train mode (batch-norm batch statistics; dropout and
   stochastic depth set to p=0): cross entropy over every output (GoogLeNet's auxiliary
   heads included), backward; the loss, every parameter gradient and every buffer
   (running statistics) are compared with rtol=1e-3, atol=1e-3 x max(1, max |CPU value|)
   per tensor (:data:`TRAIN_TOL`).  A float32 mismatch is re-checked in float64 on both
   devices (:data:`F64_TOL`): a ReLU whose float32 input lies within rounding of 0 takes
   opposite branches on the two devices, and batch-norm backward (batch 2) amplifies that
   one element into percent-level gradient differences in the early layers.  If float64
   agrees, the step passes and the float32 difference is recorded (``train.f32``);
   otherwise it is a mismatch.

Classes (worst first): ``mismatch``, ``error`` (tpu raised; the missing ATen op when
torchtpu says which), ``timeout``, ``crash``, ``pass``, ``skipped-cpu``, ``skipped-size``.
Each model runs in its own worker process (forkserver, torch and torchvision preloaded)
under ``--timeout`` seconds.  Results go to ``conformance/vision.json`` as they finish
(resumable: recorded models are skipped unless ``--rerun``) and ``conformance/vision.md``
summarizes them, failures grouped by root cause.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import time
from collections import Counter, defaultdict
from typing import Optional

from torchtpu.conformance._common import error_record, first_line, load_json, run_workers, save_json

DEVICE = "tpu"
BATCH = 2
SIZES = (64, 96, 128, 224)
FWD_TOL = dict(rtol=1e-4, atol=1e-4)  # atol is scaled by max |cpu output|
TRAIN_TOL = dict(rtol=1e-3, atol=1e-3)  # per tensor; atol scaled by max(1, max |cpu|)
F64_TOL = dict(rtol=1e-7, atol=1e-7)  # the float64 re-check of a float32 training mismatch
MAX_PARAMS = 700_000_000  # all torchvision classifiers (the largest, 645M: ~9 GB peak RSS)
DEFAULT_TIMEOUT = 900.0
OUT_DIR = "conformance"

# One small model per family (and the two with auxiliary heads / transformers).
TRAIN_SAMPLE = (
    "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "googlenet",
    "mnasnet0_5", "mobilenet_v2", "mobilenet_v3_small", "regnet_y_400mf", "resnet18",
    "resnext50_32x4d", "shufflenet_v2_x0_5", "squeezenet1_1", "swin_t", "vit_b_32",
)

STATUSES = ("mismatch", "error", "timeout", "crash", "pass", "skipped-cpu", "skipped-size")
_SEVERITY = {s: i for i, s in enumerate(STATUSES)}


def enumerate_models() -> list[dict]:
    """``[{name, family}]`` for every classification model torchvision lists."""
    import torchvision
    from torchvision import models

    out = []
    for name in models.list_models(module=models):
        fn = models.get_model_builder(name)
        fam = fn.__module__.rsplit(".", 1)[-1]
        out.append({"name": name, "family": fam})
    del torchvision
    return out


# ---------------------------------------------------------------------------------------
# One model (runs in a worker process)


def _count_params(name: str) -> Optional[int]:
    import torch
    from torchvision import models

    try:
        with torch.device("meta"):
            m = models.get_model(name, weights=None)
        return sum(p.numel() for p in m.parameters())
    except Exception:  # noqa: BLE001
        return None


def _inputs(size: int):
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 3, size, size, generator=g)


class _TooBig(Exception):
    pass


def _build_cpu(name: str, max_params: Optional[int] = None):
    """Model (eval, seeded random init), input and CPU output at the first size that works.
    Raises :class:`_TooBig` for a model over ``max_params`` (for models whose parameters
    could not be counted on the meta device)."""
    import torch
    from torchvision import models

    torch.manual_seed(0)
    model = models.get_model(name, weights=None).eval()
    n = sum(p.numel() for p in model.parameters())
    if max_params is not None and n > max_params:
        raise _TooBig(n)
    reinit = []
    for pname, p in model.named_parameters():
        if p.dim() >= 2 and not p.any():  # ViT's class token and head: outputs would all be 0
            with torch.no_grad():
                p.normal_(0.0, 0.02)
            reinit.append(pname)
    model.reinit = reinit
    first = None
    for size in SIZES:
        x = _inputs(size)
        try:
            with torch.no_grad():
                out = model(x)
            return model, x, out, size
        except Exception as e:  # noqa: BLE001
            first = first or e
    raise first


def _scaled(tol: dict, ref, floor: float) -> dict:
    """``atol`` x max(``floor``, max |ref|) (x 1 where that is 0 or not finite)."""
    import math

    import torch

    m = float(ref.detach().abs().max()) if isinstance(ref, torch.Tensor) and ref.numel() else 0.0
    scale = max(floor, m) if math.isfinite(m) else 1.0
    return dict(rtol=tol["rtol"], atol=tol["atol"] * (scale or 1.0))


def _compare_tensors(pairs, tol: dict, floor: float = 0.0) -> dict:
    """``pairs``: ``[(where, cpu, tpu)]``.  Each compared with ``tol`` scaled by its own
    magnitude (:func:`_scaled`) through :func:`torchtpu.conformance.models.compare`."""
    from torchtpu.conformance.models import compare

    worst = {"ok": True, "max_abs_err": 0.0, "rel_err": 0.0, "where": None, "detail": None, "n": len(pairs)}
    for where, a, b in pairs:
        if (a is None) != (b is None):
            return {**worst, "ok": False, "where": where,
                    "detail": f"cpu {'None' if a is None else 'set'}, tpu {'None' if b is None else 'set'}"}
        if a is None:
            continue
        c = compare(a, b, **_scaled(tol, a, floor))
        err = c["max_abs_err"]
        scale = float(a.detach().abs().max()) if a.numel() and a.is_floating_point() else 0.0
        scale = max(floor, scale)
        rel = err / scale if scale else err
        if not c["ok"]:
            return {**worst, "ok": False, "where": where, "max_abs_err": err, "rel_err": rel,
                    "detail": c["detail"]}
        worst["max_abs_err"] = max(worst["max_abs_err"], err)
        if rel > worst["rel_err"] or worst["where"] is None:
            worst.update(rel_err=rel, where=where)
    return worst


def _outputs(out) -> list:
    from torchtpu.conformance.models import flatten

    return flatten(out)


def _prepare_train(model) -> None:
    """Train mode without randomness: dropout / stochastic depth at p=0."""
    import torch

    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0


def _loss(out, target):
    import torch

    return sum(torch.nn.functional.cross_entropy(t, target) for _, t in _outputs(out))


def _check_train(pristine, x, dtype=None) -> dict:
    """One training step on CPU and tpu (in ``dtype``, default the model's): loss, grads
    and buffers compared.  A float32 mismatch is re-checked in float64."""
    import torch

    target = torch.arange(BATCH) % 7
    tol = F64_TOL if dtype == torch.float64 else TRAIN_TOL
    if dtype is not None:
        pristine, x = copy.deepcopy(pristine).to(dtype), x.to(dtype)
    cm = copy.deepcopy(pristine)
    _prepare_train(cm)
    try:
        closs = _loss(cm(x), target)
        closs.backward()
    except Exception as e:  # noqa: BLE001
        return {"status": "skipped-cpu", "reason": first_line(e)}
    try:
        dm = copy.deepcopy(pristine).to(DEVICE)
        _prepare_train(dm)
        dloss = _loss(dm(x.to(DEVICE)), target.to(DEVICE))
        dloss.backward()
        dloss = dloss.detach().cpu()
        dgrads = {n: (None if p.grad is None else p.grad.cpu()) for n, p in dm.named_parameters()}
        dbufs = {n: b.cpu() for n, b in dm.named_buffers()}
    except Exception as e:  # noqa: BLE001
        return error_record(e, "train", "torchvision")
    pairs = [("loss", closs.detach(), dloss)]
    pairs += [(f"grad {n}", p.grad, dgrads[n]) for n, p in cm.named_parameters()]
    pairs += [(f"buffer {n}", b, dbufs[n]) for n, b in cm.named_buffers()]
    c = _compare_tensors(pairs, tol, floor=1.0)
    res = {"status": "pass" if c["ok"] else "mismatch", "max_abs_err": c["max_abs_err"],
           "rel_err": c["rel_err"], "where": c["where"], "tensors": c["n"]}
    if not c["ok"]:
        res["reason"] = f"{c['where']}: {c['detail']}"
        if dtype is None and x.dtype == torch.float32:
            del cm, dm, dgrads, dbufs
            f64 = _check_train(pristine, x, torch.float64)
            if f64["status"] == "pass":
                return {**f64, "dtype": "float64",
                        "f32": {k: res[k] for k in ("max_abs_err", "rel_err", "where", "reason")}}
            res["f64"] = f64
            if f64["status"] == "mismatch":
                res["reason"] += f" (float64 too: {f64.get('reason')})"
    return res


def run_model(item: dict, do_train: bool = False, max_params: int = MAX_PARAMS) -> dict:
    import torch

    t0 = time.time()
    res: dict = {"name": item["name"], "family": item["family"]}
    n = _count_params(item["name"])  # None where the builder cannot run on meta (RegNet)
    res["params"] = n

    def too_big(n):
        res.update(params=n, status="skipped-size",
                   reason=f"{n / 1e6:.0f}M parameters > {max_params / 1e6:.0f}M budget")
        return res

    if n is not None and n > max_params:
        return too_big(n)
    try:
        model, x, cpu_out, size = _build_cpu(item["name"], max_params)
    except _TooBig as e:
        return too_big(e.args[0])
    except Exception as e:  # noqa: BLE001
        res.update(status="skipped-cpu", reason=f"cpu: {first_line(e)}", seconds=round(time.time() - t0, 2))
        return res
    res["params"] = sum(p.numel() for p in model.parameters())
    res["input"] = [BATCH, 3, size, size]
    if model.reinit:
        res["reinit"] = model.reinit
    pristine = copy.deepcopy(model)
    try:
        dmodel = copy.deepcopy(pristine).to(DEVICE)
        with torch.no_grad():
            dout = dmodel(x.to(DEVICE))
        a, b = dict(_outputs(cpu_out)), dict(_outputs(dout))
        if set(a) != set(b):
            c = {"ok": False, "max_abs_err": 0.0, "rel_err": 0.0, "where": None, "n": len(a),
                 "detail": f"output structure: cpu {sorted(a)} tpu {sorted(b)}"}
        else:
            c = _compare_tensors([(k, a[k], b[k]) for k in a], FWD_TOL)
    except Exception as e:  # noqa: BLE001
        res.update(error_record(e, "forward", "torchvision"), seconds=round(time.time() - t0, 2))
        return res
    del dmodel
    res["forward"] = {"max_abs_err": c["max_abs_err"], "rel_err": c["rel_err"], "where": c["where"],
                      "outputs": c["n"], "cpu_abs_max": max((float(t.abs().max()) for _, t in _outputs(cpu_out)
                                                             if t.numel()), default=0.0)}
    res["status"] = "pass" if c["ok"] else "mismatch"
    if not c["ok"]:
        res.update(stage="forward", reason=f"forward {c['where']}: {c['detail']}", max_abs_err=c["max_abs_err"])
    if do_train and res["status"] == "pass":
        t = res["train"] = _check_train(pristine, x)
        if t["status"] in ("mismatch", "error"):
            res.update(status=t["status"], stage="train", reason=f"train: {t.get('reason')}")
            if t.get("missing_op"):
                res["missing_op"] = t["missing_op"]
            if "max_abs_err" in t:
                res["max_abs_err"] = t["max_abs_err"]
    res["seconds"] = round(time.time() - t0, 2)
    return res


def _worker(item: dict, do_train: bool, max_params: int, threads: int, conn) -> None:
    try:
        from torchtpu.conformance.models import _setup_worker

        _setup_worker(threads)
        res = run_model(item, do_train=do_train, max_params=max_params)
        import resource

        res["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    except BaseException as e:  # noqa: BLE001
        res = {"name": item["name"], "family": item["family"], "status": "crash",
               "reason": f"worker: {first_line(e)}"}
    try:
        conn.send(res)
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------
# Summary


def root_cause(res: dict) -> str:
    from torchtpu.conformance.models import root_cause as rc

    return rc(res)


def versions() -> dict:
    import jax
    import torch
    import torchvision

    return {"torch": torch.__version__, "torchvision": torchvision.__version__, "jax": jax.__version__}


def summarize(results: dict, n_enumerated: int, meta: Optional[dict] = None) -> str:
    meta = meta or {}
    rs = list(results.values())
    counts = Counter(r["status"] for r in rs)
    ran = [r for r in rs if not r["status"].startswith("skipped")]
    passed = counts.get("pass", 0)
    v = meta.get("versions") or {}
    lines = ["# torchvision classification sweep (tpu vs. CPU)", ""]
    if v:
        lines.append("Versions: " + ", ".join(f"{k} {v[k]}" for k in sorted(v)) + ".")
        lines.append("")
    lines.append(f"Models enumerated: **{n_enumerated}**; recorded: **{len(rs)}**; "
                 f"ran (CPU forward worked, within the size budget): **{len(ran)}**; "
                 f"passed on tpu: **{passed}** (**{100.0 * passed / max(1, len(ran)):.1f}%** of those that ran).")
    lines.append("")
    lines.append(f"Random init (seed 0), eval mode, input batch {BATCH}; forward rtol=1e-4, "
                 "atol=1e-4 x max |cpu output|; the training sample (train mode, dropout p=0) "
                 "compares loss, every gradient and every buffer at rtol=1e-3, atol=1e-3 x max(1, max |cpu|) "
                 "per tensor, and re-checks a float32 mismatch in float64 (rtol=atol=1e-7).")
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
        lines.append("| model | stage | max abs err | detail |")
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
    lines.append("## Failures by root cause")
    lines.append("")
    if groups:
        lines.append("| root cause | models | examples |")
        lines.append("|---|---|---|")
        for cause, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            ex = ", ".join(sorted(names)[:6]) + (" …" if len(names) > 6 else "")
            lines.append(f"| {cause.replace('|', '/')} | {len(names)} | {ex} |")
    else:
        lines.append("None.")
    lines.append("")
    skipped = sorted((r for r in rs if r["status"].startswith("skipped")), key=lambda r: r["name"])
    if skipped:
        lines.append(f"## Skipped ({len(skipped)})")
        lines.append("")
        for r in skipped:
            lines.append(f"* {r['name']}: {r['status']}: {r.get('reason', '')}")
        lines.append("")
    f64 = sorted((r for r in rs if (r.get("train") or {}).get("f32")), key=lambda r: r["name"])
    if f64:
        lines.append(f"## Training steps that differ in float32 but agree in float64 ({len(f64)})")
        lines.append("")
        lines.append("A ReLU input within float32 rounding of 0 takes opposite branches on the two devices; "
                     "batch-norm backward at batch 2 amplifies that element in the layers before it. "
                     "Re-run in float64 on both devices, the step agrees (rtol=atol=1e-7), so these "
                     "count as passes (marked * below).")
        lines.append("")
        lines.append("| model | float32: worst tensor | float32 max abs err (rel) | float64 max abs err (rel) |")
        lines.append("|---|---|---|---|")
        for r in f64:
            t = r["train"]
            lines.append(f"| {r['name']} | {t['f32']['where']} | {t['f32']['max_abs_err']:.2g} "
                         f"({t['f32']['rel_err']:.1g}) | {t['max_abs_err']:.2g} ({t['rel_err']:.1g}) |")
        lines.append("")
    lines.append("## Per model")
    lines.append("")
    lines.append("Forward error relative to max |cpu output|; train: worst tensor's error relative to its max.")
    lines.append("")
    lines.append("| model | params | input | status | forward max abs err (rel) | train | s |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in sorted(rs, key=lambda r: r["name"]):
        f = r.get("forward") or {}
        fe = f"{f['max_abs_err']:.2g} ({f['rel_err']:.1g})" if f else ""
        t = r.get("train")
        te = "" if not t else (f"{t['status']} {t['max_abs_err']:.2g} ({t['rel_err']:.1g})"
                               if "rel_err" in t else t["status"])
        if t and t.get("dtype") == "float64":
            te += " in float64*"
        p = r.get("params")
        size = "x".join(map(str, r["input"][2:])) if r.get("input") else ""
        lines.append(f"| {r['name']} | {'' if p is None else f'{p / 1e6:.1f}M'} | {size} | {r['status']} | "
                     f"{fe} | {te} | {r.get('seconds', '')} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torchtpu.conformance vision",
                                 description="torchvision classification sweep: tpu vs. CPU.")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes at a time (default 1)")
    ap.add_argument("--filter", default=None, help="regex on the model name")
    ap.add_argument("--limit", type=int, default=None, help="at most N models (after filtering)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per model")
    ap.add_argument("--max-params", type=float, default=MAX_PARAMS,
                    help=f"skip models with more parameters (default {MAX_PARAMS / 1e6:.0f}M)")
    ap.add_argument("--train", choices=("sample", "all", "none"), default="sample",
                    help="which models also run a training step (default: the fixed sample)")
    ap.add_argument("--rerun", action="store_true", help="rerun models already recorded")
    ap.add_argument("--out", default=OUT_DIR, help="output folder (vision.json, vision.md)")
    ap.add_argument("--no-progress", action="store_true", help="one line per model instead of a bar")
    ap.add_argument("--list", action="store_true", help="print the selected models and exit")
    args = ap.parse_args(argv)

    try:
        all_models = enumerate_models()
    except ImportError as e:
        print(f"torchvision is needed ({e}); `make conformance-vision` sets up .venv-vision", file=sys.stderr)
        return 2
    sel = all_models
    if args.filter:
        rx = re.compile(args.filter)
        sel = [m for m in sel if rx.search(m["name"])]
    if args.limit is not None:
        sel = sel[: args.limit]
    train = {"sample": set(TRAIN_SAMPLE), "all": {m["name"] for m in all_models}, "none": set()}[args.train]
    if args.list:
        for m in sel:
            print(m["name"], m["family"], "train" if m["name"] in train else "")
        return 0
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("TORCHTPU_MODELS_JAX_CACHE", os.path.abspath(os.path.join(args.out, ".jax_cache")))
    jpath = os.path.join(args.out, "vision.json")
    data = load_json(jpath)
    done = data["results"]
    todo = [m for m in sel if args.rerun or m["name"] not in done]
    print(f"{len(all_models)} models enumerated; {len(sel)} selected; {len(sel) - len(todo)} already recorded; "
          f"running {len(todo)} (jobs={args.jobs}, timeout={args.timeout:.0f}s)", flush=True)
    data["meta"] = {"enumerated": len(all_models), "train_sample": sorted(train) if args.train != "all" else "all",
                    "fwd_tol": FWD_TOL, "train_tol": TRAIN_TOL, "max_params": int(args.max_params),
                    "versions": versions()}

    def on_result(res):
        done[res["name"]] = res
        save_json(jpath, data)

    t0 = time.time()
    run_workers(todo, _worker, args_of=lambda m: (m["name"] in train, int(args.max_params)),
                base_of=lambda m: {"name": m["name"], "family": m["family"]},
                jobs=args.jobs, timeout=args.timeout,
                preload=["torch", "torchvision", "torchvision.models", "torchtpu.conformance.vision"],
                on_result=on_result, progress=not args.no_progress, unit="model")
    save_json(jpath, data)
    md = summarize(done, len(all_models), data["meta"])
    mpath = os.path.join(args.out, "vision.md")
    with open(mpath, "w") as f:
        f.write(md)
    rs = [done[m["name"]] for m in sel if m["name"] in done]
    c = Counter(r["status"] for r in rs)
    print(f"done in {time.time() - t0:.0f}s; selected: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    for r in rs:
        if r["status"] not in ("pass", "skipped-cpu", "skipped-size"):
            print(f"  {r['name']}: {r['status']}: {r.get('reason', '')}"[:300])
    print(f"wrote {jpath} and {mpath}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
