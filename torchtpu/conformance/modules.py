"""``module_db`` sweep: every ``torch.nn`` ModuleInfo of PyTorch's test suite on ``tpu`` vs. CPU.

Usage (CLI)::

    python -m torchtpu.conformance modules                       # all, float32 + float64
    python -m torchtpu.conformance modules --quick               # 1 sample, float32, train
    python -m torchtpu.conformance modules --filter 'Conv|Pool' --dtypes float32 --json /tmp/m.json

What it does, per ModuleInfo of ``torch.testing._internal.common_modules.module_db``, per
dtype (``--dtypes`` intersected with the info's ``dtypes``; default float32 and float64)
and per mode (``training=True`` and ``training=False``; ``--modes``), per sample of
``module_inputs_func(info, device="cpu", dtype, requires_grad=True, training)`` (inputs
generated under ``torch.manual_seed(seed)``):

1. **Build** the module on CPU from the sample's constructor args,
   ``torch.manual_seed(seed)`` first, ``.to(dtype)``, ``.train(training)``.  A lazy module
   (``LazyConv*``) is materialized by one CPU forward under ``no_grad`` first, so that both
   devices start from the same weights.
2. **Random probe**: two more CPU forwards of copies of the module with seeds 1 and 2;
   outputs that differ come from random numbers drawn inside forward (dropout with p > 0,
   fractional max pooling without ``_random_samples``).  tpu's random stream is not CPU's,
   so such a sample is compared by dtype and shape only (verdict ``skip``, reason
   ``random``).  The samples of ``module_db`` mostly pass ``dropout=0.0`` and
   ``_random_samples=`` themselves, and those are compared by value.
3. **CPU run**: a ``deepcopy`` of the module, the sample's forward args (tensors cloned as
   leaves with the sample's ``requires_grad``), forward; then
   ``torch.autograd.grad`` of every floating output that requires grad with a fixed random
   cotangent (``torch.randn`` with seed ``seed + 1``, one per output; not ``ones``: the
   gradient of ``sum(softmax(x))`` is 0 whatever the backend does) with respect to the
   input leaves and the module's parameters (``allow_unused=True``); and the module's
   buffers after the forward (running statistics in train mode).
4. **tpu run**: ``copy.deepcopy(module).to("tpu")`` (same weights; tensor attributes that
   are neither parameters nor buffers, e.g. ``FractionalMaxPool2d._random_samples``, are
   moved too), inputs and cotangents moved to tpu, the same forward / backward / buffers.
5. **Compare** (:func:`torchtpu.conformance.opinfo.compare`: tpu results must be on tpu,
   dtype and shape exact, values within PyTorch's default ``assertEqual`` tolerance of the
   dtype, :data:`torchtpu.conformance.opinfo.BASE_TOLERANCE`).  A float32 value
   difference beyond tolerance is arbitrated by a **float64 CPU run** of the same sample
   (module ``.double()``, float32 inputs and cotangents in float64):
   :func:`torchtpu.conformance.opinfo.closer_to_f64` with ``per_tensor`` (tpu's largest
   error over each tensor at most twice CPU float32's largest error, or within tolerance of
   the float64 value; NaN and infinity positions as CPU's).  Passing that is ``pass-f64``.
   bfloat16 and float16 are arbitrated the same way; a sample that fails the rule is then
   judged by CPU's own sensitivity (:func:`_arbitrate_noise`: two CPU runs with every
   weight, buffer and input moved one ulp up / down; tpu within ``max(2 E, atol + rtol
   |r|)`` of the float64 value, ``E`` the farthest of CPU's runs from it): half-precision results
   of deep modules are chaotic (a ReLU gate flipped by one rounding), so the float64 rule
   alone calls ordinary rounding a mismatch.

Verdicts per sample (worst first): ``mismatch`` (a wrong value, dtype, shape, device or
structure; ``stage`` says forward / backward / buffers), ``error`` (tpu raised),
``unsupported`` (torchtpu's ``NotImplementedError``, naming the missing ATen op),
``pass-f64``, ``pass``, ``skip`` (CPU itself raised on the sample; or ``random``: compared
by shape only).  Each (module, dtype, mode) row reports the count of every verdict and the
first failure's line.

The report goes to ``docs/conformance/modules.md`` for a full sweep only (a partial run
writes none unless ``--md PATH`` names one).  Modules run in worker processes (``multiprocessing`` forkserver, torch preloaded),
``--per-worker`` modules each, killed after ``--timeout`` seconds per module of the chunk
(``--jobs 0``: in this process, no timeout).  Results: a Markdown report (``--md``, default
``docs/conformance/modules.md``) and, with ``--json PATH``, the raw per-sample records.
Modes ``train_cl`` / ``eval_cl`` (``--modes train_cl,eval_cl``): the module and its 4-D
(5-D) floating inputs in ``torch.channels_last`` (``channels_last_3d``) on both devices;
the outputs' strides must equal CPU's as well as their values.  ``--dtypes bfloat16`` runs
the two infos that list bfloat16; ``--any-dtype`` runs every module at the given dtypes (the
bfloat16 report, ``docs/conformance/modules-bfloat16.md``).  Not done: second-order
gradients.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import re
import sys
import time
from collections import Counter
from typing import Iterable, Optional

DEVICE = "tpu"
VERDICTS = ("mismatch", "error", "unsupported", "pass-f64", "pass", "skip")
PASSING = ("pass", "pass-f64")
_SEVERITY = {v: i for i, v in enumerate(VERDICTS)}
DEFAULT_DTYPES = ("float32", "float64")
# dtypes whose value differences beyond tolerance go to the float64 arbiter (float64 itself
# is the reference: its differences are mismatches)
_ARBITRATED = frozenset(("float32", "bfloat16", "float16"))
# half-precision dtypes: a sample the float64 arbiter rejects is judged against CPU's own
# one-ulp sensitivity (``_noise_runs``) before it is called a mismatch
_NOISE_ARBITRATED = frozenset(("bfloat16", "float16"))
DEFAULT_MD = os.path.join("docs", "conformance", "modules.md")
DEFAULT_TIMEOUT = 600.0


# ---------------------------------------------------------------------------------------
# Selecting ModuleInfos


def module_infos(filter: Optional[str] = None, names: Optional[Iterable[str]] = None) -> list:
    """The ModuleInfos of ``module_db`` whose ``name`` (``"nn.Linear"``) matches the regex
    ``filter`` (``re.search``) and, if given, is in ``names``; in ``module_db`` order.
    Importing ``common_modules`` takes ~15 s on this machine."""
    from torch.testing._internal.common_modules import module_db

    rx = re.compile(filter) if filter else None
    keep = set(names) if names is not None else None
    return [m for m in module_db
            if (rx is None or rx.search(m.name)) and (keep is None or m.name in keep)]


def get_module_info(name: str):
    """The ModuleInfo named ``name`` (``"nn.Linear"``); KeyError if there is none."""
    for m in module_infos(names=[name]):
        return m
    raise KeyError(name)


def dtype_of(name: str):
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


# ---------------------------------------------------------------------------------------
# Moving things between devices


def _map(obj, fn):
    import torch

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map(o, fn) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def _leaf(t, device: Optional[str] = None, dtype=None):
    """``t`` detached, cloned (onto ``device``, floating tensors in ``dtype``), with
    ``t``'s ``requires_grad``: a fresh leaf."""
    out = t.detach()
    if dtype is not None and out.is_floating_point():
        out = out.to(dtype)
    out = out.to(device) if device is not None else out.clone()
    return out.requires_grad_(t.requires_grad)


def _to64(dtype):
    """Fresh-leaf conversion of float32 tensors (and ``torch.float32`` arguments) to
    float64 (the arbiter's inputs)."""
    import torch

    def conv(obj):
        if isinstance(obj, torch.Tensor):
            return _leaf(obj, dtype=torch.float64 if obj.dtype == dtype else None)
        if isinstance(obj, torch.dtype):
            return torch.float64 if obj == dtype else obj
        if isinstance(obj, (list, tuple)):
            return type(obj)(conv(o) for o in obj)
        if isinstance(obj, dict):
            return {k: conv(v) for k, v in obj.items()}
        return obj

    return conv


def module_to(m, device: str = DEVICE, dtype=None):
    """A ``deepcopy`` of module ``m`` moved with ``.to(device)`` (and ``.to(dtype)``), tensor
    attributes that are neither parameters nor buffers (``_random_samples``) moved to
    ``device`` as well (their dtype kept).  ``m`` is left as it was."""
    import torch

    c = copy.deepcopy(m).to(device)
    if dtype is not None:
        c = c.to(dtype)
    for sub in c.modules():
        for k, v in list(vars(sub).items()):
            if isinstance(v, torch.Tensor):
                setattr(sub, k, v.to(device))
    return c


# ---------------------------------------------------------------------------------------
# One sample


def _flat(obj) -> list:
    import torch

    leaves, _ = torch.utils._pytree.tree_flatten(obj)
    return leaves


def _cotangents(outs: list, seed: int) -> list:
    """A fixed random cotangent (CPU, seed ``seed``) for each floating output that requires
    grad, None for the others."""
    import torch

    g = torch.Generator().manual_seed(seed)
    cots = []
    for o in outs:
        if isinstance(o, torch.Tensor) and o.requires_grad and (o.is_floating_point() or o.is_complex()):
            cots.append(torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype))
        else:
            cots.append(None)
    return cots


def run_module(m, args, kwargs, cots=None, seed: int = 0, cot_seed: int = 1,
               device: Optional[str] = None):
    """Forward module ``m`` on ``(args, kwargs)`` (already on the module's device; floating
    tensors requiring grad are leaves), then backward.

    Returns ``(outs, grads, buffers, cots)``: ``outs`` the flat forward outputs,
    ``grads`` ``{"input[i]": g, "param <name>": g}`` (None where unused; empty where nothing
    requires grad), or a ``_Stage("backward", exc)`` when the backward raised, or None when
    an output's shape differs from its given cotangent's (no backward run); ``buffers``
    ``{name: tensor}`` after the forward, ``cots`` the CPU cotangents used (made from
    ``cot_seed`` when ``cots`` is None; moved to each output's device).  The forward runs
    under ``torch.manual_seed(seed)``; what it raises is raised as ``_Stage("forward",
    exc)``."""
    import torch

    torch.manual_seed(seed)
    try:
        out = m(*args, **kwargs)
    except Exception as e:
        raise _Stage("forward", e) from e
    outs = _flat(out)
    if cots is None:
        cots = _cotangents(outs, cot_seed)
    leaves = [("input[%d]" % i, t) for i, t in enumerate(_flat((args, kwargs)))
              if isinstance(t, torch.Tensor) and t.requires_grad]
    leaves += [(f"param {n}", p) for n, p in m.named_parameters() if p.requires_grad]
    diff = [(o, c) for o, c in zip(outs, cots)
            if c is not None and isinstance(o, torch.Tensor) and o.requires_grad]
    grads = {}
    buffers = {n: b.detach().clone() for n, b in m.named_buffers()}
    outs_d = [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]
    if diff and leaves:
        if any(o.shape != c.shape for o, c in diff):
            # a wrong output shape: no backward (the forward comparison reports it)
            return outs_d, None, buffers, cots
        try:
            gs = torch.autograd.grad([o for o, _ in diff],
                                     [t for _, t in leaves],
                                     [c.to(o.device) for o, c in diff],
                                     allow_unused=True)
        except Exception as e:  # noqa: BLE001 - returned: the forward is still compared
            return outs_d, _Stage("backward", e), buffers, cots
        grads = {n: g for (n, _), g in zip(leaves, gs)}
    return outs_d, grads, buffers, cots


class _Stage(Exception):
    """An exception raised by the module at ``stage`` (forward / backward)."""

    def __init__(self, stage: str, exc: BaseException):
        super().__init__(str(exc))
        self.stage, self.exc = stage, exc


def _cpu(x):
    import torch

    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def _same_bits(a, b) -> bool:
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def _is_random(m, args, kwargs) -> bool:
    """Do the CPU forward outputs of (copies of) ``m`` change between seeds 1 and 2?"""
    import torch

    res = []
    for seed in (1, 2):
        mc = copy.deepcopy(m)
        a, k = _map((args, kwargs), lambda t: t.detach().clone())
        torch.manual_seed(seed)
        with torch.no_grad():
            res.append(_flat(mc(*a, **k)))
    x, y = res
    return len(x) != len(y) or not all(_same_bits(p, q) for p, q in zip(x, y))


def _compare_all(pairs, atol: float, rtol: float, shape_only: bool = False):
    """First :class:`~torchtpu.conformance.opinfo.Diff` over ``[(path, tpu, cpu)]``."""
    from torchtpu.conformance.opinfo import Diff, compare

    for path, y, x in pairs:
        if (x is None) != (y is None):
            return Diff(path, "structure", f"cpu {'None' if x is None else 'a tensor'}, "
                                           f"tpu {'None' if y is None else 'a tensor'}")
        if x is None:
            continue
        d = compare(y, x, atol, rtol, shape_only=shape_only, path=path)
        if d is not None:
            return d
    return None


def _arbitrate(pairs64, atol: float, rtol: float):
    """The float64 arbiter over ``[(path, tpu, cpu32, cpu64)]`` (tensors on CPU):
    ``(ok, explanation)``."""
    from torchtpu.conformance.opinfo import closer_to_f64

    xs, ys, rs = [], [], []
    for path, y, x, r in pairs64:
        if x is None:
            continue
        xs.append(_cpu(x)), ys.append(_cpu(y)), rs.append(_cpu(r))
    return closer_to_f64(xs, ys, rs, atol, rtol, per_tensor=True)


def _noise_runs(m0, args, kwargs, dtype, cots, seed) -> list:
    """CPU's own rounding sensitivity at ``dtype``: two CPU runs of the sample with every
    floating parameter, buffer and input of ``dtype`` moved one ulp up (then down), as
    ``{"forward": outs, "backward": grads, "buffers": buffers}`` each."""
    import torch

    def bump(t, sign):
        if not (isinstance(t, torch.Tensor) and t.dtype == dtype):
            return t
        return torch.nextafter(t.detach(), torch.full_like(t.detach(), sign * float("inf")))

    runs = []
    for sign in (1, -1):
        m = copy.deepcopy(m0)
        with torch.no_grad():
            for t in list(m.parameters()) + list(m.buffers()):
                if t.dtype == dtype:
                    t.copy_(bump(t, sign))
        a, k = _map((args, kwargs),
                    lambda t, _s=sign: _leaf(bump(t, _s)).requires_grad_(t.requires_grad))
        outs, grads, bufs, _ = run_module(m, a, k, cots=cots, seed=seed)
        if not isinstance(grads, dict):
            raise grads.exc if isinstance(grads, _Stage) else RuntimeError("output shape")
        runs.append({"forward": outs, "backward": grads, "buffers": bufs})
    return runs


def _arbitrate_noise(pairs64, stage: str, noise: list, atol: float, rtol: float):
    """The noise rule for half-precision samples the float64 arbiter rejected (CPU's
    result is itself chaotic there: a one-ulp change of the weights moves it farther than
    tpu is from CPU): each tpu tensor ``y`` passes if, at every element, ``|y - r| <=
    max(2 E, atol + rtol |r|)``, ``E`` the largest distance from the float64 value ``r``
    of CPU's run or a noise run (:func:`_noise_runs`) over the tensor; NaN positions as
    CPU's (the optimizers sweep's rule, ``conformance.optimizers``, with a max where it
    adds: a bfloat16 tolerance is 1.6%).  Returns ``(ok, why)``."""
    import torch

    worst_t = worst_e = 0.0
    for i, (path, y, x, r) in enumerate(pairs64):
        if x is None or not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            continue
        if stage == "forward":
            ns = [n["forward"][i] for n in noise]
        elif stage == "backward":
            ns = [n["backward"].get(path) for n in noise]
        else:
            ns = [n["buffers"].get(path[len("buffer "):]) for n in noise]
        xf, yf, rf = (_cpu(t).detach().double() for t in (x, y, r))
        fin = torch.isfinite(xf) & torch.isfinite(rf)
        if bool((torch.isnan(yf) != torch.isnan(xf)).any()):
            return False, f"noise rule: {path}: NaN positions differ"
        if not fin.any():
            continue
        e = float((xf - rf).abs()[fin].max())
        for n in ns:
            if n is not None:
                nf = _cpu(n).detach().double()
                ok_n = fin & torch.isfinite(nf)
                if ok_n.any():
                    e = max(e, float((nf - rf).abs()[ok_n].max()))
        dy = (yf - rf).abs()
        worst_t, worst_e = max(worst_t, float(dy[fin].max())), max(worst_e, e)
        if not bool((dy <= torch.clamp(atol + rtol * rf.abs(), min=2 * e))[fin].all()):
            return False, (f"noise rule: tpu err {float(dy[fin].max()):.3g} > 2 x CPU's "
                           f"1-ulp sensitivity {e:.3g} ({path})")
    return True, (f"noise rule: tpu err {worst_t:.3g} within 2 x CPU's 1-ulp sensitivity "
                  f"{worst_e:.3g}")


def describe_sample(sample) -> str:
    """Short description of a ModuleInput: constructor args and forward tensors' shapes."""
    from torchtpu.conformance.opinfo import describe

    ci, fi = sample.constructor_input, sample.forward_input
    ctor = describe((tuple(ci.args), dict(ci.kwargs)), 160) if ci is not None else "()"
    fwd = describe((tuple(fi.args), dict(fi.kwargs)), 160) if fi is not None else "-"
    return f"{sample.desc or '-'}: ctor{ctor} fwd{fwd}"


def _channels_last(t):
    """A 4-D (5-D) floating tensor in channels_last (channels_last_3d) memory format."""
    import torch

    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() in (4, 5):
        fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        return t.detach().contiguous(memory_format=fmt).requires_grad_(t.requires_grad)
    return t


def _stride_mismatch(x_out, y_out):
    """The first output whose strides differ between CPU and tpu, as a detail line."""
    import torch

    for i, (x, y) in enumerate(zip(x_out, y_out)):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape \
                and x.numel() > 1 and x.stride() != y.stride():
            return f"out[{i}]: strides {tuple(y.stride())} vs CPU {tuple(x.stride())}"
    return None


def check_sample(info, sample, dtype, training: bool, index: int = 0, seed: int = 0,
                 channels_last: bool = False) -> dict:
    """Run one ModuleInput of ``info`` on CPU and tpu and judge it.

    ``sample``: a ``ModuleInput`` made on CPU by ``info.module_inputs_func`` at ``dtype``
    (float32, float64, ...); ``training``: the module's ``train()`` mode;
    ``channels_last``: module and 4-D/5-D inputs in channels_last memory format, output
    strides compared too.  Returns
    ``{index, desc, status, stage, detail, f64}`` with ``status`` one of :data:`VERDICTS`,
    ``stage`` forward / backward / buffers (where the first failure was), ``detail`` its
    first line, ``f64`` the arbiter's explanation where it was asked.  Never raises for
    what the module or the backend raises."""
    import torch

    from torchtpu.conformance.opinfo import classify_exception

    rec = {"index": index, "desc": describe_sample(sample), "status": "pass", "stage": None,
           "detail": None, "f64": None}
    if sample.forward_input is None:
        return {**rec, "status": "skip", "detail": "sample has no forward input"}
    ci, fi = sample.constructor_input, sample.forward_input
    args, kwargs = tuple(fi.args), dict(fi.kwargs)
    if channels_last:
        args, kwargs = _map((args, kwargs), _channels_last)
    # CPU: build (and materialize a lazy module), probe randomness, run
    try:
        torch.manual_seed(seed)
        m0 = info.module_cls(*ci.args, **ci.kwargs).to(dtype)
        if channels_last:
            m0 = m0.to(memory_format=torch.channels_last)
        m0.train(training)
        if info.is_lazy:
            with torch.no_grad():
                a, k = _map((args, kwargs), lambda t: t.detach().clone())
                m0(*a, **k)
        random = _is_random(m0, args, kwargs)
        cpu_in = _map((args, kwargs), _leaf)
        x_out, x_grads, x_bufs, cots = run_module(copy.deepcopy(m0), *cpu_in, seed=seed,
                                                  cot_seed=seed + 1)
        if isinstance(x_grads, _Stage):
            raise x_grads
    except Exception as e:  # noqa: BLE001 - nothing to compare with
        exc = e.exc if isinstance(e, _Stage) else e
        return {**rec, "status": "skip",
                "detail": f"CPU raised {type(exc).__name__}: {str(exc).strip()[:200]}"}
    # tpu
    try:
        mt = module_to(m0, DEVICE)
        tpu_in = _map((args, kwargs), lambda t: _leaf(t, DEVICE))
        y_out, y_grads, y_bufs, _ = run_module(mt, *tpu_in, cots=cots, seed=seed, device=DEVICE)
    except Exception as e:  # noqa: BLE001
        stage = e.stage if isinstance(e, _Stage) else "to-device"
        exc = e.exc if isinstance(e, _Stage) else e
        status, _cause, detail = classify_exception(exc)
        return {**rec, "status": status, "stage": stage, "detail": detail}
    bwd_failure = None
    if isinstance(y_grads, _Stage):  # tpu's backward raised: its forward is still judged
        bwd_failure, y_grads = y_grads, dict(x_grads)
    elif y_grads is None:  # an output of the wrong shape: the forward comparison says so
        y_grads = dict(x_grads)
    if channels_last and not random:
        why = _stride_mismatch(x_out, y_out)
        if why is not None:
            return {**rec, "status": "mismatch", "stage": "forward", "detail": why}
    res = _judge(m0, args, kwargs, dtype, cots, seed, random, rec,
                 (x_out, x_grads, x_bufs), (y_out, y_grads, y_bufs),
                 skip_backward=bwd_failure is not None)
    if bwd_failure is not None and res["status"] != "mismatch":
        status, _cause, detail = classify_exception(bwd_failure.exc)
        return {**rec, "status": status, "stage": "backward", "detail": detail}
    return res


def _judge(m0, args, kwargs, dtype, cots, seed, random, rec, cpu, tpu,
           skip_backward=False) -> dict:
    """The verdict of one sample from the CPU and tpu ``(outs, grads, buffers)``."""
    import torch

    from torchtpu.conformance.opinfo import BASE_TOLERANCE

    (x_out, x_grads, x_bufs), (y_out, y_grads, y_bufs) = cpu, tpu
    rec = dict(rec)
    atol, rtol = BASE_TOLERANCE.get(dtype, (0.0, 0.0))
    stages = [
        ("forward", [(f"out[{i}]", y, x) for i, (x, y) in enumerate(zip(x_out, y_out))]
         if len(x_out) == len(y_out) else None),
        ("backward", [(n, y_grads.get(n), g) for n, g in x_grads.items()]
         if set(x_grads) == set(y_grads) else None),
        ("buffers", [(f"buffer {n}", y_bufs.get(n), b) for n, b in x_bufs.items()]
         if set(x_bufs) == set(y_bufs) else None),
    ]
    if random:
        rec.update(status="skip", detail="random (CPU output changes with the seed): "
                                         "dtype and shape compared only")
    failing = []
    for stage, pairs in stages:
        if stage == "backward" and skip_backward:
            continue
        if pairs is None:
            return {**rec, "status": "mismatch", "stage": stage,
                    "detail": "different output structure (count or names)"}
        d = _compare_all(pairs, atol, rtol, shape_only=random)
        if d is None:
            continue
        if d.what != "values" or dtype_name(dtype) not in _ARBITRATED:
            return {**rec, "status": "mismatch", "stage": stage, "detail": f"{d.path}: {d.detail}"}
        failing.append((stage, pairs, d))
    if not failing:
        return rec
    # float64 arbiter
    try:
        to64 = _to64(dtype)
        m64 = copy.deepcopy(m0).to(torch.float64)
        r_out, r_grads, r_bufs, _ = run_module(m64, *to64((args, kwargs)), cots=[
            c.to(torch.float64) if c is not None else None for c in cots], seed=seed)
        if not isinstance(r_grads, dict):
            raise r_grads.exc if isinstance(r_grads, _Stage) else RuntimeError("output shape")
        refs = {"forward": r_out, "backward": r_grads, "buffers": r_bufs}
    except Exception as e:  # noqa: BLE001
        stage, _, d = failing[0]
        return {**rec, "status": "mismatch", "stage": stage,
                "detail": f"{d.path}: {d.detail}; float64 CPU run raised {type(e).__name__}"}
    notes, noise = [], None
    for stage, pairs, d in failing:
        ref = refs[stage]
        if stage == "forward":
            p64 = [(p, y, x, r) for (p, y, x), r in zip(pairs, ref)]
        elif stage == "backward":
            p64 = [(p, y, x, ref.get(p)) for p, y, x in pairs]
        else:
            p64 = [(p, y, x, ref.get(p[len("buffer "):])) for p, y, x in pairs]
        try:
            ok, why = _arbitrate(p64, atol, rtol)
        except Exception as e:  # noqa: BLE001
            ok, why = False, f"arbiter raised {type(e).__name__}: {e}"
        if not ok and dtype_name(dtype) in _NOISE_ARBITRATED:
            try:
                if noise is None:
                    noise = _noise_runs(m0, args, kwargs, dtype, cots, seed)
                ok, why2 = _arbitrate_noise(p64, stage, noise, atol, rtol)
            except Exception as e:  # noqa: BLE001
                ok, why2 = False, f"noise runs raised {type(e).__name__}: {e}"
            why = f"{why}; {why2}"
        if not ok:
            return {**rec, "status": "mismatch", "stage": stage,
                    "detail": f"{d.path}: {d.detail}; {why}"}
        notes.append(f"{stage} {d.path}: {why}")
    if rec["status"] != "skip":
        rec["status"] = "pass-f64"
    rec["f64"] = "; ".join(notes)
    return rec


# ---------------------------------------------------------------------------------------
# One module (all dtypes, modes, samples)


def _samples(info, dtype, training: bool, seed: int) -> list:
    import torch

    torch.manual_seed(seed)
    return list(info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True,
                                        training=training))


def check_module(info, dtypes: Iterable, modes: Iterable[str] = ("train", "eval"),
                 limit: Optional[int] = None, seed: int = 0, dtype_filter: bool = True) -> list[dict]:
    """Every (dtype, mode) row of one ModuleInfo: ``[{module, dtype, mode, samples,
    counts, status, first_failure, results, seconds}]``.

    ``dtypes``: torch dtypes (those not in ``info.dtypes`` are left out when
    ``dtype_filter``); ``modes``: ``"train"`` / ``"eval"`` (``"train_cl"`` / ``"eval_cl"``:
    in channels_last memory format); ``limit``: first N samples.
    ``status``: the worst verdict of the row (``skip`` only if every sample was skipped).
    A failure to generate the samples is one ``error`` row."""
    rows = []
    for dt in dtypes:
        if dtype_filter and dt not in set(info.dtypes):
            continue
        for mode in modes:
            t0 = time.time()
            row = {"module": info.name, "dtype": dtype_name(dt), "mode": mode}
            try:
                samples = _samples(info, dt, mode.startswith("train"), seed)
            except Exception as e:  # noqa: BLE001
                rows.append({**row, "samples": 0, "counts": {"error": 1}, "status": "error",
                             "first_failure": f"module_inputs_func raised {type(e).__name__}: {e}"[:300],
                             "results": [], "seconds": round(time.time() - t0, 2)})
                continue
            if limit is not None:
                samples = samples[:limit]
            results = [check_sample(info, s, dt, mode.startswith("train"), i, seed,
                                    channels_last=mode.endswith("_cl"))
                       for i, s in enumerate(samples)]
            rows.append(summarize_row(row, results, time.time() - t0))
    return rows


def summarize_row(row: dict, results: list[dict], seconds: float = 0.0) -> dict:
    """``row`` with ``samples``, verdict ``counts``, worst ``status`` and the first
    failure's line (``#index stage: detail``) of the per-sample ``results``."""
    counts = Counter(r["status"] for r in results)
    judged = [r for r in results if r["status"] != "skip"]
    status = min((r["status"] for r in judged), key=_SEVERITY.get) if judged else "skip"
    first = next((r for r in sorted(results, key=lambda r: _SEVERITY[r["status"]])
                  if r["status"] not in PASSING and r["status"] != "skip"), None)
    return {**row, "samples": len(results), "counts": dict(counts), "status": status,
            "first_failure": (f"#{first['index']} {first['stage']}: {first['detail']}"
                              if first else None),
            "results": results, "seconds": round(seconds, 2)}


def _init_worker(threads: int) -> None:
    import warnings

    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(max(1, threads))
    os.environ.pop("TORCHTPU_CPU_FALLBACK", None)
    import torchtpu  # noqa: F401  (registers the device)
    from torchtpu._device import tpu_module

    tpu_module.enable_cpu_fallback = False  # native coverage only


def _worker(item: dict, threads: int, conn) -> None:
    """Worker process: the rows of every module of ``item["modules"]``, sent as one
    ``{name, status: "done", rows}`` message (``status: "crash"`` if the worker itself
    failed)."""
    try:
        import torch

        _init_worker(threads)
        infos = module_infos(names=item["modules"])
        rows = []
        for info in infos:
            rows += check_module(info, [getattr(torch, d) for d in item["dtypes"]],
                                 item["modes"], item["limit"], item["seed"],
                                 dtype_filter=not item.get("any_dtype", False))
        conn.send({"name": item["name"], "status": "done", "rows": rows})
    except BaseException as e:  # noqa: BLE001
        conn.send({"name": item["name"], "status": "crash", "reason": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()


def sweep(infos: list, dtypes: list[str], modes: list[str], limit: Optional[int] = None,
          seed: int = 0, jobs: int = 1, timeout: float = DEFAULT_TIMEOUT,
          progress: bool = True, per_worker: int = 8, any_dtype: bool = False) -> list[dict]:
    """Rows (:func:`check_module`) of every ModuleInfo in ``infos``.  ``jobs`` >= 1: one
    worker process per chunk of ``per_worker`` modules, at most ``jobs`` at a time, killed
    after ``timeout`` s per module of the chunk (its rows then have status ``error`` and
    the reason: rerun those with ``--filter``); ``jobs == 0``: in this process.
    ``any_dtype``: every module runs every dtype of ``dtypes``, also those its ModuleInfo
    does not list (samples CPU itself rejects are ``skip``)."""
    import torch

    want = [dtype_of(d) for d in dtypes]

    def runs(info, d):
        return any_dtype or d in set(info.dtypes)

    def planned(info):
        return [(dtype_name(d), m) for d in want if runs(info, d) for m in modes]

    if jobs == 0:
        _init_worker(torch.get_num_threads())
        rows = []
        for i, info in enumerate(infos):
            rs = check_module(info, want, modes, limit, seed, dtype_filter=not any_dtype)
            rows += rs
            if progress:
                print(f"[{i + 1}/{len(infos)}] {info.name}: "
                      + ", ".join(f"{r['dtype']}/{r['mode']} {r['status']}" for r in rs), flush=True)
        return rows
    from torchtpu.conformance._common import run_workers

    # a fresh process per chunk of modules: importing common_modules costs ~10 s per
    # process, and it cannot be preloaded in the forkserver (forked workers then hang)
    items = []
    sel = [i for i in infos if any(runs(i, d) for d in want)]
    for k in range(0, len(sel), max(1, per_worker)):
        chunk = sel[k:k + max(1, per_worker)]
        items.append({"name": f"{chunk[0].name}..{chunk[-1].name}" if len(chunk) > 1 else chunk[0].name,
                      "modules": [i.name for i in chunk], "dtypes": list(dtypes),
                      "modes": list(modes), "limit": limit, "seed": seed, "any_dtype": any_dtype})
    chunks = {it["name"]: it["modules"] for it in items}
    by_name = {i.name: i for i in infos}
    results = run_workers(items, _worker, jobs=jobs, timeout=timeout * max(1, per_worker),
                          unit="chunk", preload=("torch",), progress=progress)
    rows = []
    for res in results:
        if res.get("status") == "done":
            rows += res["rows"]
            continue
        for name in chunks[res["name"]]:
            for dt, m in planned(by_name[name]):
                rows.append({"module": name, "dtype": dt, "mode": m, "samples": 0,
                             "counts": {"error": 1}, "status": "error", "results": [],
                             "first_failure": f"worker {res['status']} (chunk {res['name']}): "
                                              f"{res.get('reason')}"})
    order = {i.name: k for k, i in enumerate(infos)}
    rows.sort(key=lambda r: (order[r["module"]], r["dtype"], r["mode"] != "train"))
    return rows


# ---------------------------------------------------------------------------------------
# Report


def _cell(s: Optional[str], n: int = 160) -> str:
    if not s:
        return ""
    s = s.replace("|", "\\|").replace("\n", " ")
    return s if len(s) <= n else s[: n - 3] + "..."


def totals(rows: list[dict]) -> dict:
    """``{dtype: {"rows": Counter of row statuses, "samples": Counter of sample verdicts}}``."""
    out: dict = {}
    for r in rows:
        t = out.setdefault(r["dtype"], {"rows": Counter(), "samples": Counter()})
        t["rows"][r["status"]] += 1
        t["samples"].update(r["counts"])
    return out


def markdown(rows: list[dict], config: dict) -> str:
    """The Markdown report: configuration, totals per dtype, one table row per
    (module, dtype, mode), then every non-passing sample."""
    lines = ["# `module_db` conformance sweep (tpu vs. CPU)", "",
             f"Measured {config['date']} on {config['platform']}: torch {config['torch']}, "
             f"jax {config['jax']}.  Command: `{config['command']}` ({config['seconds']:.0f} s).",
             "",
             "Each sample of each `ModuleInfo` of `torch.testing._internal.common_modules.module_db` "
             "is built on CPU, copied with `copy.deepcopy(m).to(\"tpu\")`, and run forward and "
             "backward (a fixed random cotangent per output; gradients of the inputs and of "
             "every parameter) on both devices; outputs, gradients and buffers (running "
             "statistics) are compared at PyTorch's default tolerance of the dtype, and a "
             "float32 (bfloat16, float16) difference beyond it is judged against a float64 CPU "
             "run (`pass-f64`: tpu's largest error per tensor at most twice CPU's; for "
             "bfloat16/float16, failing that, within twice CPU's own one-ulp sensitivity: two "
             "CPU runs with every weight and input moved one ulp up / down).  "
             "`skip`: CPU raised on the sample, or its output is random (compared by shape). "
             "See `torchtpu/conformance/modules.py` for the rules.",
             "", "## Totals", "",
             "| dtype | rows | " + " | ".join(f"rows {v}" for v in VERDICTS)
             + " | samples | " + " | ".join(VERDICTS) + " |",
             "|---|---|" + "---|" * len(VERDICTS) + "---|" + "---|" * len(VERDICTS)]
    for dt, t in sorted(totals(rows).items()):
        lines.append(f"| {dt} | {sum(t['rows'].values())} | "
                     + " | ".join(str(t["rows"].get(v, 0)) for v in VERDICTS)
                     + f" | {sum(t['samples'].values())} | "
                     + " | ".join(str(t["samples"].get(v, 0)) for v in VERDICTS) + " |")
    lines += ["", "## Per module", "",
              "| module | dtype | mode | samples | verdict | " + " | ".join(VERDICTS)
              + " | first failure |",
              "|---|---|---|---|---|" + "---|" * len(VERDICTS) + "---|"]
    for r in rows:
        lines.append(f"| {r['module']} | {r['dtype']} | {r['mode']} | {r['samples']} | "
                     f"{r['status']} | " + " | ".join(str(r["counts"].get(v, 0) or "")
                                                      for v in VERDICTS)
                     + f" | {_cell(r.get('first_failure'))} |")
    bad = [(r, s) for r in rows for s in r["results"] if s["status"] not in PASSING + ("skip",)]
    skipped = [(r, s) for r in rows for s in r["results"] if s["status"] == "skip"]
    if bad:
        lines += ["", "## Failing samples", "", "| module | dtype | mode | sample | verdict | stage | detail |",
                  "|---|---|---|---|---|---|---|"]
        for r, s in bad:
            lines.append(f"| {r['module']} | {r['dtype']} | {r['mode']} | #{s['index']} "
                         f"{_cell(s['desc'], 120)} | {s['status']} | {s['stage']} | "
                         f"{_cell(s['detail'], 240)} |")
    if skipped:
        why = Counter((r["module"], (s["detail"] or "")[:90]) for r, s in skipped)
        lines += ["", "## Skipped samples", "", "| module | reason | samples |", "|---|---|---|"]
        for (mod, d), n in sorted(why.items()):
            lines.append(f"| {mod} | {_cell(d)} | {n} |")
    if config.get("notes"):
        lines += ["", "## Notes", "", config["notes"]]
    return "\n".join(lines) + "\n"


def _versions() -> dict:
    import torch

    out = {"torch": torch.__version__, "jax": None}
    try:
        import jax

        out["jax"] = jax.__version__
    except Exception:  # pragma: no cover
        pass
    return out


def main(argv=None) -> int:
    """CLI: ``python -m torchtpu.conformance modules [--filter RE] [--dtypes L] [--modes L]
    [--quick] [--limit N] [--jobs N] [--timeout S] [--json PATH] [--md PATH]``.  Returns 1
    if any row is ``mismatch``, else 0."""
    p = argparse.ArgumentParser(prog="python -m torchtpu.conformance modules",
                                description="Run PyTorch's module_db on tpu and compare with CPU.")
    p.add_argument("--filter", help="regex (re.search) on the module name, e.g. 'Conv|Pool'")
    p.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES),
                   help="comma list (default float32,float64; each module runs those its "
                        "ModuleInfo lists)")
    p.add_argument("--any-dtype", action="store_true",
                   help="run every selected module at every --dtypes dtype, also those its "
                        "ModuleInfo does not list (e.g. --dtypes bfloat16: 2 infos list it)")
    p.add_argument("--modes", default="train,eval",
                   help="comma list of train, eval, train_cl, eval_cl (channels_last; default "
                   "train,eval)")
    p.add_argument("--quick", action="store_true",
                   help="one sample per module, float32, train mode only")
    p.add_argument("--limit", type=int, default=None, help="first N samples per (module, dtype, mode)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes (default 1; 0 = in this process, no timeout)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="seconds per module (all its dtypes and modes) before it is killed")
    p.add_argument("--per-worker", type=int, default=8,
                   help="modules per worker process (default 8)")
    p.add_argument("--json", default=None, help="write the raw per-sample results here "
                                                "(default: not written)")
    p.add_argument("--md", default=None,
                   help=f"Markdown report ('-' = none; default {DEFAULT_MD} for a full sweep "
                        "(no --quick/--filter/--limit, default --dtypes/--modes), else none)")
    p.add_argument("--list", action="store_true", help="list the selected modules and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    a = p.parse_args(argv)
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("train", "eval", "train_cl", "eval_cl"):
            p.error(f"unknown mode {m!r} (train, eval, train_cl, eval_cl)")
    for d in dtypes:
        try:
            dtype_of(d)
        except ValueError as e:
            p.error(str(e))
    full = not (a.quick or a.filter or a.limit is not None) and \
        dtypes == list(DEFAULT_DTYPES) and modes == ["train", "eval"] and not a.any_dtype
    if a.md is None:
        a.md = DEFAULT_MD if full else "-"
    if a.quick:
        dtypes, modes, a.limit = ["float32"], ["train"], 1
    infos = module_infos(a.filter)
    if a.list:  # each module and the dtypes of --dtypes it would run
        for i in infos:
            runs = [d for d in dtypes if a.any_dtype or dtype_of(d) in set(i.dtypes)]
            print(i.name, ",".join(runs) or "-")
        return 0
    t0 = time.time()
    rows = sweep(infos, dtypes, modes, a.limit, a.seed, a.jobs, a.timeout, not a.quiet,
                 a.per_worker, a.any_dtype)
    secs = time.time() - t0
    args = list(sys.argv[1:] if argv is None else argv)
    config = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "platform": "the JAX CPU platform", "seconds": secs,
              "command": "python -m torchtpu.conformance modules " + " ".join(args),
              "dtypes": dtypes, "any_dtype": a.any_dtype, "modes": modes, "limit": a.limit,
              "seed": a.seed, **_versions()}
    for dt, t in sorted(totals(rows).items()):
        print(f"{dt}: rows {dict(t['rows'])}; samples {dict(t['samples'])}")
    for r in rows:
        if r["status"] not in PASSING + ("skip",):
            print(f"  {r['status']:11s} {r['module']} {r['dtype']}/{r['mode']}: {r['first_failure']}"[:300])
    if a.json:
        from torchtpu.conformance._common import save_json

        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        save_json(a.json, {"meta": config, "rows": rows})
    if a.md and a.md != "-":
        os.makedirs(os.path.dirname(os.path.abspath(a.md)), exist_ok=True)
        with open(a.md, "w") as f:
            f.write(markdown(rows, config))
        print(f"wrote {a.md}")
    return 1 if any(r["status"] == "mismatch" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
