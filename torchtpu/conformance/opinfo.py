"""OpInfo conformance sweep: every OpInfo of PyTorch's ``op_db`` on ``tpu`` vs. CPU.

Usage (CLI)::

    python -m torchtpu.conformance.opinfo                       # all ops, float32
    python -m torchtpu.conformance.opinfo --filter '^(add|mul)$' --dtypes float32,bfloat16
    python -m torchtpu.conformance.opinfo --limit-samples 5 --jobs 2 --json sweep.json
    python -m torchtpu.conformance.opinfo --backward     # gradients vs CPU too

(Also ``python -m torchtpu.conformance ops ...``.)  Every run writes all results and the
summary to ``conformance/ops.json`` (``--json`` to change; ``--mode all`` writes
``ops.<mode>.json`` per mode) and the printed summary, as Markdown, next to it
(``conformance/ops.md``).

For each OpInfo (optionally filtered by a regex on its id, ``name`` or
``name.variant_test_name``) and each requested dtype the OpInfo supports on CPU, every
sample of ``op.sample_inputs('cpu', dtype, requires_grad=False)`` (with
``--limit-samples N``: the first N, plus the first sample passing each keyword argument
they miss, see :func:`limited_indices`) runs
on CPU and, on copies moved to ``tpu``, on the device.  Outputs are compared recursively
with :func:`torch.testing.assert_close` (dtype and shape exact, device ignored), and the
sample's ``input`` is compared after the call too (catches wrong in-place writes).

Classes, per sample:

``pass``        same result as CPU;
``pass-f64``    (bfloat16/float16/float32/complex64 samples) values differ from
                CPU's beyond tolerance, but at every element tpu is at least as close to
                the float64 result (the sample run on CPU in float64/complex128) as CPU's
                own result is, or within tolerance of it: CPU's half-precision kernels
                round intermediates (a bfloat16 ``linspace`` step, a bfloat16 ``col2im``
                accumulation) that tpu keeps in float32, and float32 FFTs or reductions
                sum in another order (:func:`f64_verdict`).  For gradients and FFTs
                (every output element a sum over a whole dimension) the bar at each
                element is twice CPU's largest float32 error on that output
                (:func:`_grad_f64_verdict`, ``_WHOLE_INPUT_SUMS``);
``mismatch``    the op ran on tpu but the result differs (values, dtype, shape, device,
                or a mutated input); max abs / rel error reported;
``error``       tpu raised and CPU did not (exception type + first line);
``unsupported`` tpu raised torchtpu's ``NotImplementedError`` ("torchtpu: ...");
``skipped``     CPU itself raised: nothing to compare.

A (op, dtype) pair takes the worst class of its samples (mismatch > error > unsupported >
pass); it is ``skipped`` only if every sample was; it passes only if all non-skipped
samples pass.  An op that times out or crashes its worker makes its remaining pairs
``error`` with cause ``timeout`` / ``worker crashed``.

Tolerances (:func:`tolerance`): :func:`torch.testing.assert_close`'s defaults per dtype
(float32 atol 1e-5 / rtol 1.3e-6), except bfloat16 atol 1e-2 / rtol 1.6e-2 and float16
atol 1e-3 / rtol 1e-3 (PyTorch's device tests compute half types in float32 and round
once; XLA may round differently in between), loosened per op by the largest
``toleranceOverride`` / ``precisionOverride`` that the OpInfo declares for that dtype in
its ``decorators`` for a numerical-comparison test class (:data:`TOLERANCE_CLASSES`)
and for every device or CPU (:data:`TOLERANCE_DEVICES`: an override for CUDA, MPS, XPU,
... loosens that device's comparison, not ours).  As in PyTorch's ``assertEqual``, each
output tensor is compared with the larger of that and its own dtype's default
(:func:`tensor_tolerance`): a float output of an int64 or bool sample gets the float
tolerance; integer and bool outputs compare exactly.

Index outputs that the op's documentation leaves unspecified on ties (sort without
``stable=True``, topk, kthvalue, mode, median/nanmedian with a dim) are checked for
validity instead of equality (:func:`tie_index_check`); the values still compare as usual.

Modes (``--mode``, a comma list; one JSON per mode, ``ops.<mode>.json``, and with several
modes a table comparing them, ``ops.modes.md``): the eager modes ``strict``, ``debug``,
``defer_and_fuse`` (``all`` = these three) and ``compile``: each sample's tpu run is the
one-op function ``lambda inp, args, kwargs: op(inp, *args, **kwargs)`` compiled with
``torch.compile(backend="tpu", fullgraph=True, dynamic=False)`` (:func:`compiled_call`;
Dynamo is reset before each sample, eager pieces run in STRICT), forward and, with
``--backward``, the gradients through the compiled function's autograd; CPU stays eager,
compared with the same tolerances and classes.  A graph break is ``unsupported`` (cause
``graph break: ...``), an op the backend cannot compile is classified by the exception
the backend raised (:func:`classify_compiled_exception`).

Random ops (:func:`is_random`: OpInfo ``has_nondeterministic_output``, a known name, or
two CPU runs of the same sample that disagree) are compared for dtype/shape only.

Each OpInfo runs in a worker process (``multiprocessing`` spawn, ``--jobs`` workers,
recycled every ``--ops-per-worker`` ops) under ``--timeout`` seconds, so one crash or hang
cannot stop the sweep.  ``--jobs 0`` runs in-process (debugging; no timeout).

Inputs move to ``tpu`` with their strides and storage offsets (the whole storage is
copied); the sample function is also run for the ``meta`` device, and a tensor it leaves
on the CPU there (CPU scalar operands, ``tensor_split`` indices) stays on the CPU, as in
PyTorch's own device tests.  A ``device='cpu'`` keyword that the ``meta`` twin shows as
``'cpu'`` too was pinned by the sample function (``new_zeros(..., device='cpu')`` on a
device input): it stays, and the result must be on the CPU.  A sample with neither a
tensor nor a device argument (``arange(2)``) runs with ``tpu`` as the default device
(``torch.device('tpu')`` context) and its result must be on ``tpu``
(:func:`result_device`).

Library use: :func:`select_opinfos`, :func:`sample_inputs`, :func:`run_sample`,
:func:`check_op`, :func:`sweep`, :func:`summarize`; the test suite uses
:func:`assert_sample_matches`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import re
import sys
import time
import traceback
import warnings
from collections import Counter, defaultdict, deque
from typing import Any, Iterable, Optional

import torch

DEVICE = "tpu"

STATUSES = ("pass", "pass-f64", "mismatch", "error", "unsupported", "skipped")
PASSING = ("pass", "pass-f64")
# Worst first: a pair takes the worst class among its non-skipped samples.
_SEVERITY = {"mismatch": 0, "error": 1, "unsupported": 2, "pass-f64": 3, "pass": 4,
             "skipped": 5}
# sample dtypes whose value mismatches are arbitrated against a float64 CPU run, and the
# dtype each becomes there
_WIDE = {torch.bfloat16: torch.float64, torch.float16: torch.float64,
         torch.float32: torch.float64, torch.complex64: torch.complex128}
_ARBITRATED = tuple(_WIDE)
# ops whose CPU (and CUDA) kernels first convert their Scalar end points to the result
# dtype (Scalar::to<scalar_t>()): their float64 reference starts from the rounded values
_ENDS_IN_DTYPE = ("linspace", "logspace")
# ops each of whose output elements is a sum over a whole dimension of the input, in an
# order that is the platform FFT library's choice: their float64 arbiter compares with
# CPU's largest error on the output, like gradients (closer_to_f64's per_tensor)
_WHOLE_INPUT_SUMS = ("fft.",)

# ---------------------------------------------------------------------------------------
# Tolerances

# (atol, rtol) per floating/complex dtype; integer and bool dtypes compare exactly.
BASE_TOLERANCE = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1.3e-6),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.complex128: (1e-7, 1e-7),
    torch.complex64: (1e-5, 1.3e-6),
    torch.complex32: (1e-3, 1e-3),
}

# Test classes of PyTorch's suite whose tolerance overrides describe how much an op's
# numerics may legitimately differ between two correct implementations (device vs CPU,
# reference, decomposition, compiled vs eager).  ``None`` = applies to every test.
# Not ``TestConsistency``: PyTorch's MPS-vs-CPU test class, whose overrides describe MPS.
TOLERANCE_CLASSES = frozenset(
    {
        None,
        "TestCommon",
        "TestUnaryUfuncs",
        "TestBinaryUfuncs",
        "TestReductions",
        "TestDecomp",
        "TestInductorOpInfo",
        "TestMasked",
    }
)


# ``DecorateInfo.device_type`` values whose tolerance overrides apply to tpu results, which
# are compared with CPU's: overrides for every device (None) and CPU's own.
TOLERANCE_DEVICES = frozenset({None, "cpu"})


def tensor_tolerance(out_dtype: torch.dtype, atol: float, rtol: float) -> tuple[float, float]:
    """(atol, rtol) for comparing one output of dtype ``out_dtype`` when the sample's dtype
    gives (``atol``, ``rtol``) (:func:`tolerance`): as PyTorch's ``assertEqual``, the
    larger of the output dtype's default and the sample dtype's tolerance, so a floating
    output of an int64/bool sample is compared with its own dtype's tolerance (not
    exactly); integer and bool outputs compare exactly."""
    base = BASE_TOLERANCE.get(out_dtype)
    if base is None:
        return 0.0, 0.0
    return max(atol, base[0]), max(rtol, base[1])


def _tolerance_decorators():
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride

    return toleranceOverride, precisionOverride


def tolerance(op, dtype: torch.dtype) -> tuple[float, float, str]:
    """(atol, rtol, source) used to compare ``op``'s outputs of ``dtype``."""
    if dtype not in BASE_TOLERANCE:
        return 0.0, 0.0, "exact"
    from torch.testing._internal.opinfo.core import DecorateInfo

    tol_cls, prec_cls = _tolerance_decorators()
    atol, rtol = BASE_TOLERANCE[dtype]
    source = "default"

    def apply(dec, where):
        nonlocal atol, rtol, source
        if isinstance(dec, tol_cls) and dtype in dec.d:
            t = dec.d[dtype]
            if t.atol > atol or t.rtol > rtol:
                atol, rtol = max(atol, t.atol), max(rtol, t.rtol)
                source = f"toleranceOverride({where})"
        elif isinstance(dec, prec_cls) and dtype in dec.d:
            if dec.d[dtype] > atol:
                atol = dec.d[dtype]
                source = f"precisionOverride({where})"

    for info in getattr(op, "decorators", ()) or ():
        if isinstance(info, DecorateInfo):
            if info.cls_name not in TOLERANCE_CLASSES:
                continue
            # an override for another device (CUDA, MPS, XPU, ...) loosens that device's
            # comparison, not CPU's: our results are held to what CPU is held to
            if info.device_type not in TOLERANCE_DEVICES:
                continue
            if (info.test_name or "").endswith("_mps"):
                continue  # an MPS test named without a device_type
            if info.dtypes is not None and dtype not in info.dtypes:
                continue
            if callable(info.active_if) or not info.active_if:
                continue
            where = f"{info.cls_name}.{info.test_name}" if info.cls_name else "all"
            for dec in info.decorators:
                apply(dec, where)
        else:
            apply(info, "all")
    return atol, rtol, source


# ---------------------------------------------------------------------------------------
# Selecting OpInfos

def op_id(op) -> str:
    """Unique id of an OpInfo: ``name`` or ``name.variant_test_name``."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def op_db() -> list:
    from torch.testing._internal.common_methods_invocations import op_db as db

    return db


def select_opinfos(filter: Optional[str] = None, names: Optional[Iterable[str]] = None) -> list:
    """OpInfos of ``op_db`` whose id matches regex ``filter`` (``re.search``) and, if
    ``names`` is given, whose id or name is in it."""
    rx = re.compile(filter) if filter else None
    wanted = set(names) if names is not None else None
    out = []
    for op in op_db():
        oid = op_id(op)
        if rx is not None and not (rx.search(oid) or rx.search(op.name)):
            continue
        if wanted is not None and oid not in wanted and op.name not in wanted:
            continue
        out.append(op)
    return out


def get_opinfo(oid: str):
    for op in op_db():
        if op_id(op) == oid:
            return op
    raise KeyError(f"no OpInfo with id {oid!r}")


def parse_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.strip(), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


_RANDOM_NAME = re.compile(
    r"(^|[._])(rand\w*|bernoulli|multinomial|\w*dropout\d?d?|normal|uniform|cauchy|"
    r"exponential|geometric|log_normal|poisson|empty\w*|new_empty\w*)$"
)
_NOT_RANDOM = frozenset({"signal.windows.exponential", "native_dropout_backward", "item",
                         "__rand__"})
# Random in some samples (dropout / training-mode arguments) though the name does not say.
_RANDOM_OPS = frozenset({"nn.functional.multi_head_attention_forward", "nn.functional.rrelu"})


def is_random(op) -> bool:
    """Whether ``op``'s output values are not reproducible (random or uninitialized):
    compared for dtype/shape only."""
    if getattr(op, "has_nondeterministic_output", False):
        return True
    if op.name in _NOT_RANDOM or op.name.startswith("__"):
        return False
    if op.name in _RANDOM_OPS:
        return True
    # PyTorch wraps ops that draw random numbers in ``wrapper_set_seed`` (a fixed seed, so
    # CPU is reproducible, but tpu's generator is another stream): random too.
    code = getattr(getattr(op, "op", None), "__code__", None)
    if code is not None and "wrapper_set_seed" in code.co_names:
        return True
    return bool(_RANDOM_NAME.search(op.name))


def sample_inputs(op, dtype: torch.dtype, limit: Optional[int] = None, seed: int = 0) -> list:
    """The CPU samples of ``op`` for ``dtype`` that a run with ``limit`` reads
    (deterministic: seeded); see :func:`limited_indices`."""
    torch.manual_seed(seed)
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))
    return [samples[i] for i in limited_indices(samples, limit)]


def limited_indices(samples: list, limit: Optional[int]) -> list[int]:
    """Indices of ``samples`` read under ``limit``: all of them when ``limit`` is None (or
    not positive); else the first ``limit`` ones plus, for each keyword argument they do
    not pass (``alpha=``, ``rounding_mode=``, ``value=``...), the first sample passing it.
    OpInfos often put their keyword samples last (``add``'s ``alpha`` samples are its
    10th and 11th), and a short run must still exercise every keyword."""
    if limit is None or limit <= 0:
        return list(range(len(samples)))
    chosen = list(range(min(limit, len(samples))))
    seen = {k for i in chosen for k in samples[i].kwargs}
    for i in range(len(chosen), len(samples)):
        new = set(samples[i].kwargs) - seen
        if new:
            seen |= new
            chosen.append(i)
    return chosen


# ---------------------------------------------------------------------------------------
# Moving and comparing

def _map(obj, fn, key=None):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, list):
        return [_map(o, fn) for o in obj]
    if isinstance(obj, tuple):
        items = [_map(o, fn) for o in obj]
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*items)
        return tuple(items)
    if isinstance(obj, dict):
        return {k: _map(v, fn, key=k) for k, v in obj.items()}
    return obj


def _is_cpu_device(o) -> bool:
    if isinstance(o, torch.device):
        return o.type == "cpu"
    return isinstance(o, str) and o.split(":")[0] == "cpu"


def _is_meta_device(o) -> bool:
    if isinstance(o, torch.device):
        return o.type == "meta"
    return isinstance(o, str) and o.split(":")[0] == "meta"


def _move_tensor(t: torch.Tensor, device: str, memo: dict) -> torch.Tensor:
    """``t`` on ``device`` with the same sizes, strides and storage offset: its whole
    storage is copied (once per storage, so views that share a CPU storage share the
    device storage too) and the view is re-created there."""
    t = t.detach()
    if t.layout != torch.strided or t.is_conj() or t.is_neg() or t.device.type != "cpu":
        return t.to(device)
    try:
        st = t.untyped_storage()
        key = (st.data_ptr(), st.nbytes(), t.dtype)
        base = memo.get(key)
        if base is None:
            n, rem = divmod(st.nbytes(), t.element_size())
            if rem:
                return t.to(device)
            flat = torch.empty(0, dtype=t.dtype).set_(st, 0, (n,), (1,))
            base = memo[key] = flat.to(device)
        return base.as_strided(t.shape, t.stride(), t.storage_offset())
    except Exception:
        return t.to(device)


def to_device(obj, device: str = DEVICE, guide=None, memo: Optional[dict] = None):
    """Copy of ``obj`` with every tensor (recursively through lists, tuples, dicts)
    moved to ``device`` (same strides and storage offset, see :func:`_move_tensor`) and
    every ``device=`` keyword naming the CPU redirected to it.

    ``guide``: the same sample generated for the ``meta`` device (``sample_inputs``
    with device ``"meta"``).  Where given, only what it shows on ``meta`` moves: a
    tensor it shows on the CPU was put there deliberately by the sample function (a
    CPU scalar operand, ``tensor_split``'s indices) and stays on the CPU; any device
    argument it shows as ``meta`` becomes ``device``."""
    memo = {} if memo is None else memo
    nog = object()

    def walk(o, g, key=None):
        if isinstance(o, torch.Tensor):
            if o.device.type == device:  # already moved (a gradient leaf)
                return o
            if isinstance(g, torch.Tensor) and g.device.type == "cpu":
                return o.detach().clone()
            return _move_tensor(o, device, memo)
        if isinstance(o, (torch.device, str)):
            if g is not nog:
                if _is_meta_device(g):
                    return torch.device(device) if isinstance(o, torch.device) else device
                return o
            if isinstance(o, torch.device) and o.type == "cpu":
                return torch.device(device)
            if key == "device" and _is_cpu_device(o):
                return device
            return o
        if isinstance(o, (list, tuple)):
            same = isinstance(g, (list, tuple)) and len(g) == len(o)
            items = [walk(v, g[i] if same else nog) for i, v in enumerate(o)]
            if isinstance(o, list):
                return items
            return type(o)(*items) if hasattr(o, "_fields") else tuple(items)
        if isinstance(o, dict):
            return {k: walk(v, g[k] if isinstance(g, dict) and k in g else nog, k)
                    for k, v in o.items()}
        return o

    return walk(obj, nog if guide is None else guide)


def _meta_guides(op, dtype, n: int, seed: int = 0) -> list:
    """Per sample, its ``meta``-device twin as (input, args, kwargs), or None where the
    sample function cannot run on ``meta`` or yields a different number of samples."""
    try:
        torch.manual_seed(seed)
        it = op.sample_inputs("meta", dtype, requires_grad=False)
        metas = list(itertools.islice(it, n))
    except Exception:
        return [None] * n
    if len(metas) != n:
        return [None] * n
    return [(m.input, tuple(m.args), dict(m.kwargs)) for m in metas]


def _on_device(obj, device: str) -> bool:
    """Whether ``obj`` (a sample's input, args or kwargs after :func:`to_device`) holds a
    tensor on ``device`` or names ``device`` as a device argument."""
    if isinstance(obj, torch.Tensor):
        return obj.device.type == device
    if isinstance(obj, torch.device):
        return obj.type == device
    if isinstance(obj, str):
        return obj.split(":")[0] == device
    if isinstance(obj, (list, tuple)):
        return any(_on_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return any(_on_device(o, device) for o in obj.values())
    return False


def result_device(dev_sample, device: str = DEVICE) -> tuple[str, bool]:
    """Where a result that CPU PyTorch puts on the CPU must be for the moved sample
    ``dev_sample``, and whether the call must run under ``torch.device(device)``.

    * A ``device=`` keyword that stays on the CPU after :func:`to_device` was pinned there
      by the sample function (its ``meta`` twin shows ``'cpu'`` too: ``new_zeros(...,
      device='cpu')``, ``randint_like(..., device='cpu')``, which test a result on another
      device than the input's): the result must be on the CPU, as on CPU PyTorch and CUDA.
    * A sample with neither a tensor nor a device argument (``torch.arange(2)``): nothing
      can move, so the call runs with ``device`` as the default device (what a user does
      with ``torch.set_default_device``) and the result must be on ``device``.
    * Otherwise the result must be on ``device``."""
    kw = dev_sample.kwargs.get("device") if isinstance(dev_sample.kwargs, dict) else None
    if kw is not None and _is_cpu_device(kw):
        return "cpu", False
    touches = any(_on_device(o, device) for o in
                  (dev_sample.input, tuple(dev_sample.args), dict(dev_sample.kwargs)))
    return device, not touches


def _clone(obj):
    return _map(obj, lambda t: t.detach().clone())


def _to_cpu(obj):
    return _map(obj, lambda t: t.cpu() if t.device.type != "cpu" else t)


@dataclasses.dataclass
class Diff:
    """A difference found by :func:`compare`."""

    path: str
    what: str  # "values", "dtype", "shape", "device", "type", "structure"
    detail: str
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None


def _err_stats(a: torch.Tensor, e: torch.Tensor) -> tuple[float, float, int, int]:
    if a.dtype == torch.bool:
        a, e = a.int(), e.int()
    if a.is_complex():
        a, e = a.to(torch.complex128), e.to(torch.complex128)
    else:
        a, e = a.to(torch.float64), e.to(torch.float64)
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    both_nan = nan_a & nan_e
    same_inf = (a == e) & torch.isinf(e)
    diff = (a - e).abs()
    diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
    diff = torch.where(nan_a ^ nan_e, torch.full_like(diff, math.inf), diff)
    rel = diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
    rel = torch.where(diff == 0, torch.zeros_like(rel), rel)
    n_nan = int((nan_a ^ nan_e).sum())
    if diff.numel() == 0:
        return 0.0, 0.0, 0, 0
    return float(diff.max()), float(rel.max()), n_nan, diff.numel()


def compare(actual, expected, atol: float, rtol: float, shape_only: bool = False,
            path: str = "out", device: str = DEVICE) -> Optional[Diff]:
    """First difference between a tpu result ``actual`` and the CPU result ``expected``
    (recursively through tuples, lists, dicts), or None.  Tensors: device must be
    ``device`` where the CPU result is on the CPU, dtype and shape exact, values within
    (atol, rtol) unless ``shape_only``."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return Diff(path, "type", f"expected a Tensor, got {type(actual).__name__}")
        if expected.device.type == "cpu" and actual.device.type != device:
            return Diff(path, "device", f"result on {actual.device}, expected {device}")
        if actual.dtype != expected.dtype:
            return Diff(path, "dtype", f"dtype {actual.dtype} != expected {expected.dtype}")
        if actual.shape != expected.shape:
            return Diff(path, "shape",
                        f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
        if shape_only:
            return None
        a = actual.cpu() if actual.device.type != "cpu" else actual
        e = expected
        if a.layout != torch.strided:
            a = a.to_dense()
        if e.layout != torch.strided:
            e = e.to_dense()
        at, rt = tensor_tolerance(e.dtype, atol, rtol)
        try:
            torch.testing.assert_close(a, e, atol=at, rtol=rt, equal_nan=True,
                                       check_device=False, check_stride=False,
                                       check_layout=False)
        except AssertionError as exc:
            max_abs, max_rel, n_nan, n = _err_stats(a, e)
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            mism = next((ln for ln in lines if ln.startswith("Mismatched elements")), lines[0])
            extra = f", {n_nan} NaN mismatches" if n_nan else ""
            return Diff(path, "values",
                        f"{mism}{extra} (max abs {max_abs:.3g}, max rel {max_rel:.3g}, "
                        f"atol {at:g}, rtol {rt:g})", max_abs, max_rel)
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)):
            return Diff(path, "type", f"expected {type(expected).__name__}, "
                                      f"got {type(actual).__name__}")
        if len(actual) != len(expected):
            return Diff(path, "structure", f"length {len(actual)} != expected {len(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            d = compare(a, e, atol, rtol, shape_only, f"{path}[{i}]", device)
            if d is not None:
                return d
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return Diff(path, "structure", "dict keys differ")
        for k in expected:
            d = compare(actual[k], expected[k], atol, rtol, shape_only, f"{path}[{k!r}]", device)
            if d is not None:
                return d
        return None
    if isinstance(expected, bool) or isinstance(actual, bool):
        if actual != expected:
            return Diff(path, "values", f"{actual!r} != expected {expected!r}")
        return None
    if isinstance(expected, (int, float, complex)) and isinstance(actual, (int, float, complex)):
        if type(actual) is not type(expected):
            return Diff(path, "type", f"{type(actual).__name__} != expected "
                                      f"{type(expected).__name__}")
        if shape_only:
            return None
        if isinstance(expected, int):
            ok = actual == expected
        else:
            at, rt = tensor_tolerance(
                torch.complex128 if isinstance(expected, complex) else torch.float64, atol, rtol)
            ok = (cmath_isnan(actual) and cmath_isnan(expected)) or abs(actual - expected) <= (
                at + rt * abs(expected))
        if not ok:
            err = abs(actual - expected)
            return Diff(path, "values", f"{actual!r} != expected {expected!r}", float(err),
                        float(err / abs(expected)) if expected else math.inf)
        return None
    if type(actual) is not type(expected):
        return Diff(path, "type", f"{type(actual).__name__} != expected {type(expected).__name__}")
    try:
        same = actual == expected
        same = bool(same)
    except Exception:
        same = repr(actual) == repr(expected)
    if not same:
        return Diff(path, "values", f"{actual!r:.80} != expected {expected!r:.80}")
    return None


def _device_diff(actual, expected, device, path="out") -> Optional[Diff]:
    """A tensor result that is on the CPU for CPU inputs must be on ``device``."""
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        if expected.device.type == "cpu" and actual.device.type != device:
            return Diff(path, "device", f"result on {actual.device}, expected {device}")
    elif isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        for i, (a, e) in enumerate(zip(actual, expected)):
            d = _device_diff(a, e, device, f"{path}[{i}]")
            if d is not None:
                return d
    elif isinstance(expected, dict) and isinstance(actual, dict):
        for k in expected:
            if k in actual:
                d = _device_diff(actual[k], expected[k], device, f"{path}[{k!r}]")
                if d is not None:
                    return d
    return None


def cmath_isnan(x) -> bool:
    return isinstance(x, (float, complex)) and (x != x)


# ---------------------------------------------------------------------------------------
# Running one sample

@dataclasses.dataclass
class SampleResult:
    index: int
    status: str
    cause: str = ""  # root-cause key for grouping (failures only)
    detail: str = ""  # human-readable detail
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    sample: str = ""  # short description of the sample
    random: bool = False  # compared for dtype/shape only

    def to_dict(self):
        return dataclasses.asdict(self)


_MISSING_OP = re.compile(r"the ATen op '([^']+)' is not implemented")
_NUM = re.compile(r"(?<![\w.])-?\d+(\.\d+)?(e-?\d+)?(?![\w])")
_TPU_SRC = os.sep + "torchtpu" + os.sep


def _first_line(msg: str) -> str:
    for ln in msg.splitlines():
        if ln.strip():
            return ln.strip()
    return ""


def _normalize(msg: str, n: int = 140) -> str:
    msg = re.sub(r"\s*\(arguments: .*", "", msg)
    msg = _NUM.sub("#", msg)
    return msg if len(msg) <= n else msg[: n - 3] + "..."


def _location(exc: BaseException) -> str:
    """Innermost frame inside torchtpu (not this module), else the innermost frame."""
    tb = traceback.extract_tb(exc.__traceback__)
    here = os.path.abspath(__file__)
    inner = None
    for fr in tb:
        if _TPU_SRC in fr.filename and os.path.abspath(fr.filename) != here:
            inner = fr
    if inner is None and tb:
        inner = tb[-1]
    if inner is None:
        return ""
    fn = inner.filename
    i = fn.rfind(_TPU_SRC)
    if i >= 0:
        fn = fn[i + 1:]
    return f"{fn}:{inner.lineno} in {inner.name}"


def _lowering_target(name: str) -> str:
    """The overload to lower for missing op ``name`` ('aten.add.out' -> 'aten.add.Tensor'):
    mutable and out= overloads are derived from their functional twin."""
    try:
        ns, pkt, ov = name.split(".")
        op = getattr(getattr(getattr(torch.ops, ns), pkt), ov)
        if not op._schema.is_mutable:
            return name
        from torchtpu.eager.executor import functional_variant

        f = functional_variant(op)
        return str(f) if f is not None else name
    except Exception:
        return name


def classify_exception(exc: BaseException) -> tuple[str, str, str]:
    """(status, cause, detail) of an exception raised on tpu only."""
    msg = str(exc)
    first = _first_line(msg)
    loc = _location(exc)
    detail = f"{type(exc).__name__}: {first[:300]}" + (f" [at {loc}]" if loc else "")
    if isinstance(exc, NotImplementedError) and msg.lstrip().startswith("torchtpu:"):
        m = _MISSING_OP.search(msg)
        if m:
            return "unsupported", f"missing {_lowering_target(m.group(1))}", detail
        return "unsupported", "NotImplementedError: " + _normalize(first), detail
    return "error", f"{type(exc).__name__}: {_normalize(first)}", detail


def describe(obj, n: int = 240) -> str:
    """Short description of a sample (tensors as dtype[shape])."""

    def d(o):
        if isinstance(o, torch.Tensor):
            s = f"{dtype_name(o.dtype)}{list(o.shape)}"
            if o.layout != torch.strided:
                s += f"({str(o.layout).replace('torch.', '')})"
            elif o.numel() > 1 and not o.is_contiguous():
                s += "(nc)"
            return s
        if isinstance(o, (list, tuple)):
            inner = ", ".join(d(v) for v in o)
            return f"[{inner}]" if isinstance(o, list) else f"({inner})"
        if isinstance(o, dict):
            return "{" + ", ".join(f"{k}={d(v)}" for k, v in o.items()) + "}"
        return repr(o)

    try:
        s = d(obj)
    except Exception as exc:  # never let describing a sample fail the run
        s = f"<{type(exc).__name__} describing sample>"
    return s if len(s) <= n else s[: n - 3] + "..."


def _call(op, sample):
    return op(sample.input, *sample.args, **sample.kwargs)


def _compile_mode() -> bool:
    """``--mode compile`` (``TORCHTPU_OPINFO_COMPILE=1``, inherited by the workers)."""
    return os.environ.get("TORCHTPU_OPINFO_COMPILE") == "1"


def compiled_call(op, sample):
    """``op`` on ``sample`` as a one-op function compiled by ``torch.compile(fn,
    backend="tpu", fullgraph=True, dynamic=False)`` (``--mode compile``).  The sample's
    ``input``, ``args`` (a tuple) and ``kwargs`` (a dict) are the compiled function's
    arguments, so its tensors are graph inputs (Python numbers are specialized as
    constants).  Dynamo's caches are reset first: every sample is compiled afresh (no
    recompile limit can silently send a sample to eager), and an OpInfo's samples do not
    accumulate cache entries.  With ``requires_grad`` inputs the result carries the
    compiled function's autograd (AOTAutograd's compiled backward)."""
    import torch._dynamo

    torch._dynamo.reset()
    fn = op.op

    def one_op(inp, args, kwargs):
        return fn(inp, *args, **kwargs)

    compiled = torch.compile(one_op, backend="tpu", fullgraph=True, dynamic=False)
    # Random OpInfos call their op through torch.testing's wrapper_set_seed (saves and
    # restores the RNG state around manual_seed(42)): a graph break for Dynamo, on CPU too.
    # As PyTorch's Inductor OpInfo tests do, the compiled run calls the op directly (the
    # sweep seeds before each run, and random outputs compare by dtype and shape only).
    g = getattr(fn, "__globals__", None)
    seeded = g.get("wrapper_set_seed") if g is not None else None
    if seeded is not None:
        g["wrapper_set_seed"] = _unseeded
    try:
        # data-dependent ops (nonzero, item(), boolean masks...) stay in the graph, as
        # Dynamo captures them for any backend with these settings; the tpu backend cuts
        # the graph at them (torchtpu.compile.staged)
        with torch._dynamo.config.patch(capture_scalar_outputs=True,
                                        capture_dynamic_output_shape_ops=True):
            return compiled(sample.input, tuple(sample.args), dict(sample.kwargs))
    finally:
        if seeded is not None:
            g["wrapper_set_seed"] = seeded


def _unseeded(op, *args, **kwargs):
    return op(*args, **kwargs)


def classify_compiled_exception(exc: BaseException) -> tuple[str, str, str]:
    """:func:`classify_exception` for ``--mode compile``: a backend failure
    (``BackendCompilerFailed``) is classified by the exception our backend raised (an op
    without a lowering: ``unsupported`` naming it, as in eager); a graph break under
    ``fullgraph=True`` (Dynamo's ``Unsupported``) is ``unsupported``, cause ``graph break:
    ...``; other Dynamo failures are ``error`` with their own type."""
    try:
        from torch._dynamo import exc as dexc
    except Exception:  # pragma: no cover
        return classify_exception(exc)
    if isinstance(exc, dexc.BackendCompilerFailed):
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if inner is not None:
            status, cause, detail = classify_compiled_exception(inner)
            return status, cause, "tpu backend: " + detail
    if isinstance(exc, NotImplementedError) and str(exc).lstrip().startswith("torchtpu.compile:"):
        # a case the graph compiler refuses (a device->host copy inside a graph, ...)
        first = _first_line(str(exc))
        loc = _location(exc)
        return ("unsupported", "NotImplementedError: " + _normalize(first),
                f"NotImplementedError: {first[:300]}" + (f" [at {loc}]" if loc else ""))
    if isinstance(exc, dexc.Unsupported):
        first = _first_line(str(exc))
        return ("unsupported", "graph break: " + _normalize(first),
                f"Dynamo graph break (fullgraph=True): {first[:300]}")
    status, cause, detail = classify_exception(exc)
    return status, cause, detail


# ---------------------------------------------------------------------------------------
# Index outputs that are unspecified on ties
#
# Which of several equal elements an index output names is left to the implementation
# by these ops' documentation (sort without ``stable=True``; topk; kthvalue; mode;
# median/nanmedian with a dim: "indices [are] not necessarily the first occurrence ...
# device-specific").  Their values are compared as usual; an index output is accepted
# when it is valid: in range, the input gathered at it gives the values (exactly), and
# for sort/argsort/topk no position is named twice along the dim.  max/min/argmax with a
# dim are documented to return the first maximal index, cummax/cummin are deterministic:
# compared exactly.  (PyTorch's own device-vs-CPU test, TestCommon.test_compare_cpu,
# needs no such rule: CPU and CUDA sorts are both stable and the samples are mostly
# tie-free; our backend's need not pick the same tie.)

# op name -> (parameter names after ``input`` with defaults, value output index or None,
# distinct indices along dim)
_TIE_INDEX_OPS = {
    "sort": ((("dim", -1), ("descending", False), ("stable", False)), 0, True),
    "argsort": ((("dim", -1), ("descending", False), ("stable", False)), None, True),
    "topk": ((("k", None), ("dim", -1), ("largest", True), ("sorted", True)), 0, True),
    "kthvalue": ((("k", None), ("dim", -1), ("keepdim", False)), 0, False),
    "mode": ((("dim", -1), ("keepdim", False)), 0, False),
    "median": ((("dim", None), ("keepdim", False)), 0, False),
    "nanmedian": ((("dim", None), ("keepdim", False)), 0, False),
}


def _bind(params, args, kwargs) -> dict:
    out = {n: d for n, d in params}
    for (n, _), a in zip(params, args):
        out[n] = a
    out.update({k: v for k, v in kwargs.items() if k in out})
    return out


def _same_exact(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return bool((a == b).all())


def tie_index_check(op, sample, actual, expected, atol: float = 0.0, rtol: float = 0.0):
    """For ops whose index output is unspecified on ties (:data:`_TIE_INDEX_OPS`):
    ``(actual', diff)``.  When ``actual``'s indices are valid, ``actual'`` is ``actual``
    with CPU's indices in their place (the rest is then compared as usual); otherwise
    ``diff`` says what is wrong.  Other ops, and calls with defined indices (sort with
    ``stable=True``, median without a dim): ``(actual, None)`` unchanged.  topk with
    ``sorted=False`` leaves the order of the k values unspecified too: they are compared
    as a set (sorted along the dim; within (``atol``, ``rtol``) of the output dtype)."""
    spec = _TIE_INDEX_OPS.get(op.name)
    if spec is None or not isinstance(sample.input, torch.Tensor):
        return actual, None
    params, vpos, distinct = spec
    a = _bind(params, sample.args, sample.kwargs)
    if a.get("stable") or ("dim" in a and a["dim"] is None):
        return actual, None
    if vpos is None:  # argsort: the indices alone
        if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
            return actual, None
        idx, eidx, values = actual, expected, None
    else:
        if not (isinstance(actual, (tuple, list)) and isinstance(expected, (tuple, list))
                and len(actual) == 2 and len(expected) == 2):
            return actual, None
        values, idx = actual
        eidx = expected[1]
    if not (isinstance(idx, torch.Tensor) and isinstance(eidx, torch.Tensor)) or \
            idx.shape != eidx.shape or idx.dtype != eidx.dtype or idx.dtype != torch.int64:
        return actual, None  # the usual comparison reports it
    x = sample.input.detach()
    dim = a["dim"]
    x1 = x.reshape(1) if x.dim() == 0 else x
    d = dim % x1.dim()
    n = x1.shape[d]
    if x.dim() == 0:
        i1 = idx.reshape(1)
    elif not a.get("keepdim", True) and op.name not in ("sort", "argsort", "topk"):
        i1 = idx.unsqueeze(d)  # a reduction's indices without the reduced dim
    else:
        i1 = idx
    path = "out" if vpos is None else "out[1]"
    if i1.numel() and (bool((i1 < 0).any()) or bool((i1 >= n).any())):
        return actual, Diff(path, "values", f"indices out of range [0, {n})")
    if distinct and i1.numel():
        srt = i1.sort(dim=d).values
        if bool((srt.narrow(d, 1, srt.shape[d] - 1) == srt.narrow(d, 0, srt.shape[d] - 1)).any()):
            return actual, Diff(path, "values", "indices name one element twice")
    got = x1.gather(d, i1)
    if vpos is None:
        e1 = eidx.reshape(1) if eidx.dim() == 0 else eidx
        want = x1.gather(d, e1)
    else:
        want = values.reshape(got.shape)
    if not _same_exact(got, want):
        return actual, Diff(path, "values", "the input at the returned indices is not the "
                            "returned values" if vpos is not None else
                            "the input at the returned indices is not sorted as on CPU")
    if vpos is None:
        return eidx, None
    out = list(actual)
    out[1] = eidx
    if op.name == "topk" and not a.get("sorted", True):
        ev = expected[0]
        if isinstance(ev, torch.Tensor) and ev.shape == values.shape and ev.dtype == values.dtype:
            v1 = values.reshape(1) if values.dim() == 0 else values
            e1 = ev.reshape(1) if ev.dim() == 0 else ev
            diff = compare(v1.sort(dim=d).values, e1.sort(dim=d).values, atol, rtol,
                           path="out[0] (as a set)", device="cpu")
            if diff is not None:
                return actual, diff
            out[0] = ev
    return (type(actual)(*out) if hasattr(actual, "_fields") else type(actual)(out)), None


def run_sample(op, sample, dtype: torch.dtype, index: int = 0, random: Optional[bool] = None,
               tol: Optional[tuple[float, float]] = None, seed: int = 0,
               device: str = DEVICE, guide=None, compiled: bool = False) -> SampleResult:
    """Run one sample on CPU and on ``device`` and classify it.  ``guide``: the sample's
    ``meta`` twin (see :func:`to_device`, :func:`_meta_guides`).  ``compiled``: the
    device run is the one-op function compiled with the ``tpu`` backend
    (:func:`compiled_call`); the CPU reference stays eager."""
    from torch.testing._internal.opinfo.core import SampleInput

    desc = describe({"input": sample.input, "args": tuple(sample.args), **sample.kwargs})
    if tol is None:
        tol = tolerance(op, dtype)[:2]
    atol, rtol = tol
    rnd = is_random(op) if random is None else random
    g_in, g_args, g_kwargs = guide if guide is not None else (None, None, None)
    try:
        memo: dict = {}
        dev_sample = SampleInput(
            to_device(sample.input, device, g_in, memo),
            args=to_device(tuple(sample.args), device, g_args, memo),
            kwargs=to_device(dict(sample.kwargs), device, g_kwargs, memo))
    except Exception as exc:  # moving the inputs already fails
        status, cause, detail = classify_exception(exc)
        return SampleResult(index, status, cause, "moving inputs: " + detail, sample=desc)
    # Clones for the extra CPU runs that detect random outputs (made before the first
    # run: an op may mutate its inputs).
    extra = [] if rnd else [
        SampleInput(_clone(sample.input), args=_clone(tuple(sample.args)),
                    kwargs=_clone(dict(sample.kwargs))) for _ in range(2)]
    process = getattr(sample, "output_process_fn_grad", None) or (lambda x: x)

    # CPU reference (twice, to detect random outputs the name does not reveal).
    torch.manual_seed(seed)
    try:
        expected = process(_call(op, sample))
    except Exception as exc:
        return SampleResult(index, "skipped", "",
                            f"CPU raised {type(exc).__name__}: {_first_line(str(exc))[:200]}",
                            sample=desc)
    # Two more seeds: small random outputs (dropout of a 1-element softmax) can collide.
    for k, cpu2 in enumerate(extra, 1):
        try:
            torch.manual_seed(seed + k)
            again = process(_call(op, cpu2))
            if compare(again, expected, 0.0, 0.0, device="cpu") is not None:
                rnd = True
                break
        except Exception:
            break

    out_device, default_device = result_device(dev_sample, device)
    torch.manual_seed(seed)
    try:
        with (torch.device(device) if default_device else contextlib.nullcontext()):
            actual = (compiled_call if compiled else _call)(op, dev_sample)
        actual_cpu = process(_to_cpu(actual))
        input_after = _to_cpu(dev_sample.input)
    except Exception as exc:
        status, cause, detail = (classify_compiled_exception if compiled
                                 else classify_exception)(exc)
        return SampleResult(index, status, cause, detail, sample=desc, random=rnd)

    diff = _device_diff(actual, expected, out_device)
    if diff is None and not rnd:
        actual_cpu, diff = tie_index_check(op, sample, actual_cpu, expected, atol, rtol)
    if diff is None:
        diff = compare(actual_cpu, expected, atol, rtol, shape_only=rnd, device="cpu")
    if diff is None:
        # Inputs must be left as CPU left them (in-place ops, or stray writes).
        diff = compare(input_after, sample.input, atol, rtol, shape_only=rnd, path="input",
                       device="cpu")
    if (diff is not None and diff.what == "values" and diff.path.startswith("out")
            and not rnd and dtype in _ARBITRATED):
        ok, info = f64_verdict(op, sample, expected, actual_cpu, atol, rtol, seed)
        if ok:
            return SampleResult(index, "pass-f64", "", f"{diff.path}: {diff.detail}; {info}",
                                diff.max_abs, diff.max_rel, sample=desc, random=rnd)
        diff.detail += f"; {info}"
    if diff is not None:
        cause = f"wrong {diff.what}: {op_id(op)}"
        return SampleResult(index, "mismatch", cause, f"{diff.path}: {diff.detail}",
                            diff.max_abs, diff.max_rel, sample=desc, random=rnd)
    return SampleResult(index, "pass", sample=desc, random=rnd)


def _to_f64(obj):
    """The sample with its float16/bfloat16 tensors (and dtype arguments) in float64."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(_WIDE[obj.dtype]) if obj.dtype in _WIDE else obj
    if isinstance(obj, torch.dtype):
        return _WIDE.get(obj, obj)
    if isinstance(obj, (list, tuple)):
        items = [_to_f64(o) for o in obj]
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*items)
        return type(obj)(items)
    if isinstance(obj, dict):
        return {k: _to_f64(v) for k, v in obj.items()}
    return obj


def f64_verdict(op, sample, expected, actual, atol: float, rtol: float,
                seed: int = 0) -> tuple[bool, str]:
    """Arbitrate a value mismatch with float64: run ``sample`` on CPU with its
    float16/bfloat16/float32 tensors and dtype arguments in float64 (complex64 in
    complex128: the reference ``r``);
    tpu's ``actual`` (``y``) passes if, at every element of every floating output,
    ``|y - r| <= max(|x - r|, atol + rtol * |r|)`` with ``x`` CPU's ``expected`` (tpu is
    as close to float64 as CPU, or within tolerance of it), NaN where ``x`` or ``r`` has
    NaN, infinities equal to ``x``'s or ``r``'s; every other output equal to CPU's.
    Returns ``(passes, explanation)``."""
    from torch.testing._internal.opinfo.core import SampleInput

    process = getattr(sample, "output_process_fn_grad", None) or (lambda x: x)
    inp, args = _clone(sample.input), _clone(tuple(sample.args))
    if op.name in _ENDS_IN_DTYPE:
        dt = sample.kwargs.get("dtype")

        def in_dtype(v):
            if isinstance(v, torch.Tensor):
                v = v.item()
            return v if isinstance(v, complex) else float(torch.tensor(float(v), dtype=dt))

        inp, args = in_dtype(inp), (in_dtype(args[0]),) + tuple(args[1:])
    s64 = SampleInput(_to_f64(inp), args=_to_f64(args), kwargs=_to_f64(_clone(dict(sample.kwargs))))
    torch.manual_seed(seed)
    try:
        ref = process(_call(op, s64))
    except Exception as exc:  # noqa: BLE001 - no float64 kernel: no verdict
        return False, f"float64 run raised {type(exc).__name__}"
    xs, _ = torch.utils._pytree.tree_flatten(expected)
    ys, _ = torch.utils._pytree.tree_flatten(actual)
    rs, _ = torch.utils._pytree.tree_flatten(ref)
    if not (len(xs) == len(ys) == len(rs)):
        return False, "float64 output structure differs"
    return closer_to_f64(xs, ys, rs, atol, rtol,
                         per_tensor=op.name.startswith(_WHOLE_INPUT_SUMS))


def closer_to_f64(xs, ys, rs, atol: float, rtol: float,
                  per_tensor: bool = False) -> tuple[bool, str]:
    """The float64 arbiter's rule over flat output lists: CPU's ``xs``, tpu's ``ys`` and
    the float64 reference ``rs``.  Each floating ``y`` passes if, at every element,
    ``|y - r| <= max(e, atol + rtol * |r|)`` where ``e`` is CPU's error ``|x - r|`` at
    that element, or with ``per_tensor`` twice CPU's largest error over the whole tensor
    (used for gradients: see :func:`_grad_f64_verdict`); NaN where ``x`` or ``r`` has
    NaN, infinities equal to ``x``'s or ``r``'s; every other output equal to CPU's.
    Returns ``(passes, explanation)``."""
    worst_tpu = worst_cpu = 0.0
    for x, y, r in zip(xs, ys, rs):
        if not isinstance(x, torch.Tensor) or not (x.is_floating_point() or x.is_complex()):
            if compare(y, x, 0.0, 0.0, device="cpu") is not None:
                return False, "a non-floating output differs"
            continue
        if not isinstance(r, torch.Tensor) or r.shape != x.shape or y.shape != x.shape:
            return False, "float64 output shape differs"
        wide = torch.complex128 if (x.is_complex() or r.is_complex()) else torch.float64
        xf, yf, rf = (t.detach().to(wide) for t in (x, y, r))
        ny, nx, nr = torch.isnan(yf), torch.isnan(xf), torch.isnan(rf)
        if bool(((ny & ~(nx | nr)) | (nx & nr & ~ny)).any()):
            return False, "NaN positions differ"
        fin = torch.isfinite(xf) & torch.isfinite(rf) & ~ny
        inf_ok = fin | ny | (yf == xf) | (yf == rf)
        dy, dx = (yf - rf).abs(), (xf - rf).abs()
        bar = dx
        if per_tensor and fin.any():
            bar = torch.full_like(dx, 2 * float(dx[fin].max()))
        ok = (dy <= torch.maximum(bar, atol + rtol * rf.abs())) | ~fin
        if fin.any():
            worst_tpu = max(worst_tpu, float(dy[fin].max()))
            worst_cpu = max(worst_cpu, float(dx[fin].max()))
        if not bool((ok & inf_ok).all()):
            return False, (f"float64 arbiter: tpu farther from float64 than CPU (tpu err "
                           f"{worst_tpu:.3g}, CPU err {worst_cpu:.3g})")
    rule = "<= 2 x CPU's largest err" if per_tensor else "<= CPU err"
    return True, f"float64 arbiter: tpu err {worst_tpu:.3g} {rule} {worst_cpu:.3g}"


class BackendFailure(Exception):
    """The tpu run raised (unsupported or error) where CPU did not."""


class ValueMismatch(AssertionError):
    """The tpu run returned a different result than CPU."""


def assert_sample_matches(op, sample, dtype: torch.dtype, index: int = 0,
                          guide=None) -> SampleResult:
    """Run one sample; raise :class:`ValueMismatch` or :class:`BackendFailure` unless it
    passes (returns the result; ``status == 'skipped'`` when CPU itself raised)."""
    r = run_sample(op, sample, dtype, index=index, guide=guide)
    msg = f"{op_id(op)} {dtype_name(dtype)} sample {index} [{r.sample}]: {r.detail}"
    if r.status == "mismatch":
        raise ValueMismatch(msg)
    if r.status in ("error", "unsupported"):
        raise BackendFailure(f"{r.status}: {msg}")
    return r


# ---------------------------------------------------------------------------------------
# One OpInfo

@dataclasses.dataclass
class PairResult:
    op: str
    dtype: str
    status: str
    counts: dict
    samples: list  # of SampleResult dicts
    cause: str = ""  # cause of the worst sample
    detail: str = ""
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    atol: float = 0.0
    rtol: float = 0.0
    tol_source: str = ""
    random: bool = False
    seconds: float = 0.0

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        return cls(**d)


def aggregate(oid: str, dtype: torch.dtype, results: list, tol=(0.0, 0.0, ""),
              seconds: float = 0.0) -> PairResult:
    counts = Counter(r.status for r in results)
    judged = [r for r in results if r.status != "skipped"]
    if not judged:
        status = "skipped"
        worst = results[0] if results else None
    else:
        worst = min(judged, key=lambda r: _SEVERITY[r.status])
        status = worst.status
    mism = [r for r in results if r.status == "mismatch"]
    pr = PairResult(
        op=oid, dtype=dtype_name(dtype), status=status,
        counts={k: counts.get(k, 0) for k in STATUSES},
        samples=[r.to_dict() for r in results],
        cause=worst.cause if worst is not None and status not in PASSING else "",
        detail=((worst.detail if worst is not None else "no samples")
                if status != "pass" else ""),
        max_abs=max((r.max_abs for r in mism if r.max_abs is not None), default=None),
        max_rel=max((r.max_rel for r in mism if r.max_rel is not None), default=None),
        atol=tol[0], rtol=tol[1], tol_source=tol[2],
        random=any(r.random for r in results), seconds=round(seconds, 3),
    )
    return pr


def check_op(op, dtypes: Iterable[torch.dtype], limit: Optional[int] = None, seed: int = 0,
             on_pair=None, compiled: Optional[bool] = None) -> list[PairResult]:
    """All (op, dtype) pairs of one OpInfo for the requested dtypes it supports on CPU.
    ``compiled`` (default: ``--mode compile``, ``TORCHTPU_OPINFO_COMPILE=1``): each sample
    runs as a one-op function compiled with the ``tpu`` backend (:func:`compiled_call`),
    backward too (``--backward``)."""
    if compiled is None:
        compiled = _compile_mode()
    supported = op.supported_dtypes("cpu")
    out = []
    for dt in dtypes:
        if dt not in supported:
            continue
        t0 = time.perf_counter()
        tol = tolerance(op, dt)
        try:
            torch.manual_seed(seed)
            every = list(op.sample_inputs("cpu", dt, requires_grad=False))
            indices = limited_indices(every, limit)
            samples = [every[i] for i in indices]
        except Exception as exc:
            r = SampleResult(0, "skipped", "",
                             f"sample_inputs raised {type(exc).__name__}: "
                             f"{_first_line(str(exc))[:200]}")
            out.append(aggregate(op_id(op), dt, [r], tol, time.perf_counter() - t0))
            if on_pair:
                on_pair(out[-1])
            continue
        rnd = is_random(op)
        guides = _meta_guides(op, dt, len(every), seed)
        results = []
        for i, s in zip(indices, samples):
            try:
                results.append(run_sample(op, s, dt, index=i, random=rnd or None,
                                          tol=tol[:2], seed=seed, guide=guides[i],
                                          compiled=compiled))
            except Exception as exc:  # a harness problem: still one result per sample
                results.append(SampleResult(
                    i, "error", f"harness: {type(exc).__name__}: {_normalize(_first_line(str(exc)))}",
                    f"harness {type(exc).__name__}: {_first_line(str(exc))[:300]}"))
        out.append(aggregate(op_id(op), dt, results, tol, time.perf_counter() - t0))
        if on_pair:
            on_pair(out[-1])
        if compiled:
            torch._dynamo.reset()  # drop this OpInfo's compiled functions
        if os.environ.get("TORCHTPU_OPINFO_BACKWARD") == "1":  # set by --backward
            bw = check_op_backward(op, dt, limit, seed, compiled=compiled)
            if bw is not None:
                out.append(bw)
                if on_pair:
                    on_pair(bw)
    return out


# ---------------------------------------------------------------------------------------
# Worker processes

def _init_process():
    os.environ.pop("TORCHTPU_CPU_FALLBACK", None)
    warnings.simplefilter("ignore")
    import torchtpu  # noqa: F401  (registers the device)
    from torchtpu._device import tpu_module

    tpu_module.enable_cpu_fallback = False  # measure native coverage only


def _worker_main(conn, seed):
    try:
        _init_process()
        ops = {op_id(op): op for op in op_db()}
        conn.send(("ready", os.getpid()))
    except BaseException as exc:  # pragma: no cover
        conn.send(("init_failed", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        oid, dtype_names, limit = msg
        try:
            dts = [parse_dtype(n) for n in dtype_names]
            check_op(ops[oid], dts, limit, seed,
                     on_pair=lambda pr: conn.send(("pair", oid, pr.to_dict())))
            conn.send(("done", oid, None))
        except BaseException as exc:
            conn.send(("failed", oid, f"{type(exc).__name__}: {_first_line(str(exc))[:300]}"))


class _Worker:
    def __init__(self, ctx, seed):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, seed), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()
        self.task = None  # (oid, [dtype names], deadline)
        self.done_pairs: set = set()
        self.n_tasks = 0

    def kill(self):
        try:
            self.proc.kill()
            self.proc.join(5)
        except Exception:
            pass
        self.conn.close()

    def stop(self):
        try:
            self.conn.send(None)
            self.proc.join(10)
        except Exception:
            pass
        if self.proc.is_alive():
            self.kill()


def _failed_pairs(oid, dtype_names, done, status, cause, detail):
    return [PairResult(op=oid, dtype=n, status=status,
                       counts={k: 0 for k in STATUSES}, samples=[], cause=cause,
                       detail=detail) for n in dtype_names if n not in done]


def sweep(ops: list, dtypes: list, limit: Optional[int] = None, jobs: int = 1,
          timeout: float = 300.0, ops_per_worker: int = 60, seed: int = 0,
          progress: bool = True, startup_timeout: float = 600.0) -> list[PairResult]:
    """Run :func:`check_op` for every OpInfo in ``ops`` (in ``jobs`` worker processes,
    each OpInfo under ``timeout`` seconds; ``jobs=0``: in this process)."""
    dtype_names = [dtype_name(d) for d in dtypes]
    # Only dtypes each op supports on CPU, so skipped/timeout rows name real pairs.
    plan = [(op_id(op), [n for n, d in zip(dtype_names, dtypes)
                         if d in op.supported_dtypes("cpu")]) for op in ops]
    plan = [(oid, dts) for oid, dts in plan if dts]
    bar = _progress_bar(len(plan), progress)
    results: list[PairResult] = []

    def report(oid, prs, secs):
        results.extend(prs)
        if bar is not None:
            line = " ".join(f"{p.dtype}:{p.status}" for p in prs)
            worst = min(prs, key=lambda p: _SEVERITY[p.status], default=None)
            why = f"  ({worst.cause})" if worst is not None and worst.cause else ""
            bar.write(f"{oid:<44} {line}{why}  {secs:.1f}s")
            bar.update(1)

    if jobs <= 0:
        _init_process()
        by_id = {op_id(op): op for op in ops}
        for oid, dts in plan:
            t0 = time.monotonic()
            prs = check_op(by_id[oid], [parse_dtype(n) for n in dts], limit, seed)
            report(oid, prs, time.monotonic() - t0)
        if bar is not None:
            bar.close()
        return results

    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    pending = deque(plan)
    workers: list[_Worker] = []
    partial: dict = defaultdict(list)
    t_start: dict = {}
    init_failures = 0
    try:
        while pending or any(w.task for w in workers):
            while len(workers) < min(jobs, len(pending) + sum(1 for w in workers if w.task)):
                workers.append(_Worker(ctx, seed))
            for w in workers:
                if w.ready and w.task is None and pending:
                    oid, dts = pending.popleft()
                    w.conn.send((oid, dts, limit))
                    w.task = (oid, dts, time.monotonic() + timeout)
                    w.done_pairs = set()
                    w.n_tasks += 1
                    t_start[oid] = time.monotonic()
            now = time.monotonic()
            deadlines = [w.task[2] for w in workers if w.task] + [
                w.started + startup_timeout for w in workers if not w.ready]
            wait_s = max(0.05, min(deadlines) - now) if deadlines else 0.05
            ready = wait([w.conn for w in workers], timeout=min(wait_s, 5.0))
            retire = []
            for w in workers:
                if w.conn in ready:
                    try:
                        kind, oid, payload = _recv3(w.conn)
                    except (EOFError, OSError):
                        code = w.proc.exitcode
                        if w.proc.is_alive():
                            w.proc.join(2)
                            code = w.proc.exitcode
                        if w.task:
                            oid, dts, _ = w.task
                            prs = partial.pop(oid, []) + _failed_pairs(
                                oid, dts, w.done_pairs, "error", "worker crashed",
                                f"worker process died (exit code {code}) while running {oid}")
                            report(oid, prs, time.monotonic() - t_start[oid])
                        elif not w.ready:
                            init_failures += 1
                        retire.append((w, False))
                        continue
                    if kind == "ready":
                        w.ready = True
                        init_failures = 0
                    elif kind == "init_failed":
                        raise RuntimeError(f"conformance worker failed to start: {oid}")
                    elif kind == "pair":
                        pr = PairResult.from_dict(payload)
                        partial[oid].append(pr)
                        w.done_pairs.add(pr.dtype)
                    elif kind in ("done", "failed"):
                        dts = w.task[1]
                        prs = partial.pop(oid, [])
                        if kind == "failed":
                            prs += _failed_pairs(oid, dts, w.done_pairs, "error",
                                                 "harness error", payload)
                        report(oid, prs, time.monotonic() - t_start[oid])
                        w.task = None
                        if w.n_tasks >= ops_per_worker:
                            retire.append((w, True))
                elif w.task and time.monotonic() > w.task[2]:
                    oid, dts, _ = w.task
                    prs = partial.pop(oid, []) + _failed_pairs(
                        oid, dts, w.done_pairs, "error", "timeout",
                        f"{oid} did not finish within {timeout:g}s")
                    report(oid, prs, time.monotonic() - t_start[oid])
                    retire.append((w, False))
                elif not w.ready and time.monotonic() > w.started + startup_timeout:
                    raise RuntimeError("conformance worker did not start in time")
            for w, graceful in retire:
                workers.remove(w)
                w.stop() if graceful else w.kill()
            if init_failures >= 3:
                raise RuntimeError("conformance workers keep dying at startup")
    finally:
        for w in workers:
            w.kill()
        if bar is not None:
            bar.close()
    return results


def _recv3(conn):
    msg = conn.recv()
    if len(msg) == 2:
        return msg[0], msg[1], None
    return msg


def _progress_bar(total, enabled):
    if not enabled:
        return None
    try:
        if not sys.stderr.isatty():
            raise ImportError("plain lines when not on a terminal")
        from tqdm import tqdm

        return tqdm(total=total, unit="op", dynamic_ncols=True, file=sys.stderr)
    except ImportError:
        class _Plain:
            def __init__(self):
                self.n = 0

            def write(self, s):
                print(f"[{self.n + 1}/{total}] {s}", file=sys.stderr, flush=True)

            def update(self, k):
                self.n += k

            def close(self):
                pass

        return _Plain()


# ---------------------------------------------------------------------------------------
# Summary

def summary_data(results: list[PairResult]) -> dict:
    pairs = Counter(r.status for r in results)
    samples = Counter()
    for r in results:
        samples.update(r.counts)
    per_dtype = {}
    for dt in sorted({r.dtype for r in results}):
        rs = [r for r in results if r.dtype == dt]
        judged = [r for r in rs if r.status != "skipped"]
        sc = Counter()
        for r in rs:
            sc.update(r.counts)
        s_judged = sum(sc[k] for k in STATUSES if k != "skipped")
        per_dtype[dt] = {
            "pairs_total": len(rs), "pairs_judged": len(judged),
            "pairs_pass": sum(r.status in PASSING for r in rs),
            "pairs_pass_f64": sum(r.status == "pass-f64" for r in rs),
            "samples_judged": s_judged, "samples_pass": sc["pass"] + sc["pass-f64"],
            "samples_pass_f64": sc["pass-f64"],
            "pair_counts": dict(Counter(r.status for r in rs)),
        }
    causes: dict = {}
    for r in results:
        seen = set()
        for s in r.samples or [{"status": r.status, "cause": r.cause}]:
            if s["status"] in PASSING + ("skipped",) or not s["cause"]:
                continue
            c = causes.setdefault(s["cause"], {"cause": s["cause"], "status": s["status"],
                                               "pairs": 0, "samples": 0, "ops": []})
            c["samples"] += 1
            if s["cause"] not in seen:
                seen.add(s["cause"])
                c["pairs"] += 1
                c["ops"].append(f"{r.op}:{r.dtype}")
    ranked = sorted(causes.values(), key=lambda c: (-c["pairs"], -c["samples"], c["cause"]))
    mismatches = sorted((r for r in results if r.status == "mismatch"),
                        key=lambda r: (r.op, r.dtype))
    return {
        "pairs": {k: pairs.get(k, 0) for k in STATUSES},
        "samples": {k: samples.get(k, 0) for k in STATUSES},
        "per_dtype": per_dtype,
        "root_causes": ranked,
        "mismatches": [{"op": r.op, "dtype": r.dtype, "detail": r.detail,
                        "max_abs": r.max_abs, "max_rel": r.max_rel,
                        "samples_mismatched": r.counts.get("mismatch", 0),
                        "samples": sum(r.counts.values())} for r in mismatches],
    }


def _pct(a, b):
    return f"{a}/{b} ({100.0 * a / b:.1f}%)" if b else f"{a}/{b}"


def summarize(results: list[PairResult], top: int = 30) -> str:
    """Human-readable summary: totals, pass rate per dtype, mismatches, root causes."""
    s = summary_data(results)
    out = []
    fmt = lambda c: " | ".join(f"{k} {c[k]}" for k in STATUSES)  # noqa: E731
    out.append(f"pairs   : {fmt(s['pairs'])} | total {sum(s['pairs'].values())}")
    out.append(f"samples : {fmt(s['samples'])} | total {sum(s['samples'].values())}")
    out.append("pass rate per dtype (pass + pass-f64; skipped = CPU could not run; excluded):")
    for dt, d in s["per_dtype"].items():
        f64 = (f" (pass-f64: pairs {d['pairs_pass_f64']}, samples {d['samples_pass_f64']})"
               if d["pairs_pass_f64"] else "")
        out.append(f"  {dt:<10} pairs {_pct(d['pairs_pass'], d['pairs_judged'])}   "
                   f"samples {_pct(d['samples_pass'], d['samples_judged'])}   "
                   f"(pairs skipped {d['pairs_total'] - d['pairs_judged']}){f64}")
    f64_pairs = [r for r in results if r.status == "pass-f64"]
    if f64_pairs:
        out.append(f"\nPASS-F64 (half-precision values differ from CPU's, tpu at least as close "
                   f"to float64 at every element; {len(f64_pairs)} pairs):")
        for r in sorted(f64_pairs, key=lambda r: (r.op, r.dtype)):
            out.append(f"  {r.op:<40} {r.dtype:<9} {r.counts.get('pass-f64', 0)}/"
                       f"{sum(r.counts.values())} samples  {r.detail[-90:]}")
    if s["mismatches"]:
        out.append(f"\nMISMATCHES (wrong results, {len(s['mismatches'])} pairs):")
        for m in s["mismatches"]:
            out.append(f"  {m['op']:<40} {m['dtype']:<9} {m['samples_mismatched']}/"
                       f"{m['samples']} samples  {m['detail'][:160]}")
    if s["root_causes"]:
        out.append(f"\nROOT CAUSES of failures (by pairs affected; top {top} of "
                   f"{len(s['root_causes'])}):")
        for i, c in enumerate(s["root_causes"][:top], 1):
            ops = ", ".join(c["ops"][:4]) + (" ..." if len(c["ops"]) > 4 else "")
            out.append(f"  {i:>3}. [{c['status']}] {c['cause'][:110]}")
            out.append(f"       pairs {c['pairs']}, samples {c['samples']}: {ops}")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# CLI

def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m torchtpu.conformance.opinfo",
        description="Run PyTorch's OpInfo samples on tpu and compare with CPU.")
    p.add_argument("--filter", help="regex (re.search) on the OpInfo id / name")
    p.add_argument("--dtypes", default="float32", help="comma list (default float32)")
    p.add_argument("--limit-samples", type=int, default=None,
                   help="first N samples of each (op, dtype), plus the first sample "
                        "passing each keyword argument they miss (default: all samples)")
    p.add_argument("--json", default=DEFAULT_JSON,
                   help=f"write all results and the summary to this file (default "
                        f"{DEFAULT_JSON}; a Markdown summary goes next to it, same name .md)")
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes (default 1; 0 = in this process, no timeout)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds per OpInfo (all its dtypes) before it is killed")
    p.add_argument("--ops-per-worker", type=int, default=60,
                   help="recycle a worker after this many OpInfos (bounds memory)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=30, help="root causes to list")
    p.add_argument("--list", action="store_true", help="list the selected OpInfo ids and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.add_argument("--backward", action="store_true",
                   help="also compare gradients (ops with supports_autograd): pairs named "
                        "'<op>.backward'")
    p.add_argument("--mode", default="strict",
                   help="mode(s) to run: the eager modes strict, debug, defer_and_fuse; "
                        "compile (each sample as a one-op function compiled with "
                        "torch.compile(backend='tpu', fullgraph=True)); a comma list, "
                        "'all' = the three eager modes (default strict)")
    a = p.parse_args(argv)
    modes = []
    for m in ([x.strip() for x in a.mode.split(",") if x.strip()]):
        for x in (EAGER_MODES if m == "all" else [m]):
            if x not in EAGER_MODES + ("compile",):
                p.error(f"unknown mode {x!r} (strict, debug, defer_and_fuse, compile, all)")
            if x not in modes:
                modes.append(x)
    if len(modes) > 1:
        rc = 0
        per_mode = {}
        for m in modes:
            sub = [x for x in (argv if argv is not None else sys.argv[1:])]
            sub = _replace_opt(sub, "--mode", m)
            sub = _replace_opt(sub, "--json", _with_suffix(a.json, f".{m}"))
            print(f"\n===== {'eager mode ' if m != 'compile' else ''}{m} =====")
            rc = max(rc, main(sub))
            per_mode[m] = _with_suffix(a.json, f".{m}")
        if a.json and not a.list:
            data = {}
            for m, path in per_mode.items():
                try:
                    with open(path) as f:
                        data[m] = [PairResult.from_dict(d) for d in json.load(f)["pairs"]]
                except (OSError, ValueError, KeyError):
                    continue
            if data:
                text = modes_table(data)
                print(f"\n===== per mode =====\n{text}")
                md = _with_suffix(a.json, ".modes", ext=".md")
                with open(md, "w") as f:
                    f.write(f"# OpInfo conformance sweep, per mode\n\nCommand: "
                            f"`{_command(argv)}`.\n\n{text}\n")
                print(f"\nwrote {md}")
        return rc
    # workers inherit the environment; the in-process path switches directly
    if a.backward:
        os.environ["TORCHTPU_OPINFO_BACKWARD"] = "1"
    compile_mode = modes[0] == "compile"
    os.environ["TORCHTPU_OPINFO_COMPILE"] = "1" if compile_mode else "0"
    # compile mode: what runs eagerly around the compiled function runs in STRICT
    eager = "strict" if compile_mode else modes[0]
    os.environ["TORCHTPU_EAGER_MODE"] = eager
    torch.tpu.eager_mode = eager

    dtypes = [parse_dtype(n) for n in a.dtypes.split(",") if n.strip()]
    ops = select_opinfos(a.filter)
    if a.list:
        for op in ops:
            print(op_id(op))
        return 0
    if not ops:
        print("no OpInfo matches", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    results = sweep(ops, dtypes, a.limit_samples, jobs=a.jobs, timeout=a.timeout,
                    ops_per_worker=a.ops_per_worker, seed=a.seed, progress=not a.quiet)
    elapsed = time.monotonic() - t0
    head = (f"OpInfo sweep: {len(ops)} OpInfos, dtypes {','.join(map(dtype_name, dtypes))}, "
            f"samples per pair {a.limit_samples or 'all'}, {elapsed:.0f}s")
    text = summarize(results, a.top)
    print(f"\n{head}")
    print(text)
    if a.json:
        config = {"filter": a.filter, "dtypes": [dtype_name(d) for d in dtypes],
                  "mode": modes[0], "backward": a.backward,
                  "limit_samples": a.limit_samples, "jobs": a.jobs,
                  "timeout": a.timeout, "seed": a.seed, "seconds": round(elapsed, 1),
                  "n_opinfos": len(ops), "command": _command(argv),
                  "date": time.strftime("%Y-%m-%d"), **versions()}
        data = {"config": config, "summary": summary_data(results),
                "pairs": [r.to_dict() for r in results]}
        d = os.path.dirname(a.json)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(data, f, indent=1, default=str)
        md = _with_suffix(a.json, "", ext=".md")
        with open(md, "w") as f:
            f.write(markdown_summary(config, head, text))
        print(f"\nwrote {a.json} and {md}")
    return 0


DEFAULT_JSON = os.path.join("conformance", "ops.json")
# ``--mode all``: the eager modes (``compile`` is named explicitly: ``--mode strict,compile``)
EAGER_MODES = ("strict", "debug", "defer_and_fuse")


def modes_table(by_mode: dict) -> str:
    """Markdown tables comparing modes (``{mode: [PairResult]}``): the pass rate of each
    mode (pairs and samples, per dtype, mismatches), then every pair that does not pass
    in some mode with its class in each mode (one column per mode)."""
    modes = list(by_mode)
    lines = ["| mode | dtype | pairs pass | samples pass | mismatch pairs | error pairs | "
             "unsupported pairs |", "|---|---|---|---|---|---|---|"]
    for m in modes:
        s = summary_data(by_mode[m])
        for dt, d in s["per_dtype"].items():
            pc = d["pair_counts"]
            lines.append(f"| {m} | {dt} | {_pct(d['pairs_pass'], d['pairs_judged'])} | "
                         f"{_pct(d['samples_pass'], d['samples_judged'])} | "
                         f"{pc.get('mismatch', 0)} | {pc.get('error', 0)} | "
                         f"{pc.get('unsupported', 0)} |")
    status = {m: {(r.op, r.dtype): r for r in rs} for m, rs in by_mode.items()}
    keys = sorted({k for st in status.values() for k in st})
    bad = [k for k in keys if any(k in status[m] and status[m][k].status not in
                                  PASSING + ("skipped",) for m in modes)]
    if bad:
        lines += ["", "| op | dtype | " + " | ".join(modes) + " | cause (first failing mode) |",
                  "|---|---|" + "---|" * len(modes) + "---|"]
        for k in bad:
            cells = [status[m][k].status if k in status[m] else "-" for m in modes]
            cause = next((status[m][k].cause for m in modes if k in status[m]
                          and status[m][k].status not in PASSING + ("skipped",)), "")
            lines.append(f"| {k[0]} | {k[1]} | " + " | ".join(cells) +
                         f" | {cause[:100].replace('|', '/')} |")
    return "\n".join(lines)


def _with_suffix(path: str, suffix: str, ext: Optional[str] = None) -> str:
    """``conformance/ops.json`` -> ``conformance/ops<suffix><ext or .json>``."""
    root, e = os.path.splitext(path)
    return f"{root}{suffix}{ext if ext is not None else (e or '.json')}"


def _command(argv) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    return "python -m torchtpu.conformance ops " + " ".join(
        a if re.fullmatch(r"[\w.,=/:+-]+", a) else repr(a) for a in args)


def versions() -> dict:
    out = {"torch": torch.__version__}
    try:
        import jax

        out["jax"] = jax.__version__
    except Exception:  # pragma: no cover
        out["jax"] = None
    return out


def markdown_summary(config: dict, head: str, text: str) -> str:
    """The Markdown summary written next to the JSON results."""
    return (f"# OpInfo conformance sweep\n\n"
            f"Measured {config['date']}: torch {config['torch']}, jax {config['jax']}, "
            f"{'eager mode ' if config['mode'] != 'compile' else 'mode '}{config['mode']}{', with gradients' if config.get('backward') else ''}.  "
            f"Command: `{config['command']}`.\n\n```\n{head}\n{text}\n```\n")


def _replace_opt(argv, name, value):
    out, skip = [], False
    for i, x in enumerate(argv):
        if skip:
            skip = False
            continue
        if x == name:
            skip = True
            continue
        if x.startswith(name + "="):
            continue
        out.append(x)
    return out + [name, value]



# ---------------------------------------------------------------------------------------
# Backward: gradients vs CPU (``--backward``)

def _leaves(obj, out):
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad and obj.is_leaf:
            out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _leaves(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _leaves(x, out)
    return out


def _grad_outputs(obj, out):
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad and (obj.is_floating_point() or obj.is_complex()):
            out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _grad_outputs(x, out)
    return out


def _swap_leaves(obj, mapping):
    if isinstance(obj, torch.Tensor):
        return mapping.get(id(obj), obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_swap_leaves(x, mapping) for x in obj)
    if isinstance(obj, dict):
        return {k: _swap_leaves(v, mapping) for k, v in obj.items()}
    return obj


def run_sample_backward(op, sample, dtype: torch.dtype, index: int = 0, tol=None,
                        seed: int = 0, device: str = DEVICE,
                        compiled: bool = False, guide=None) -> SampleResult:
    """Gradients of ``op`` for one ``requires_grad`` sample, tpu vs CPU: the same random
    output cotangents on both (each on its output's device), ``torch.autograd.grad``
    with respect to every leaf input.  ``compiled``: the tpu forward is the one-op
    function compiled with the ``tpu`` backend (:func:`compiled_call`), so the gradients
    come from AOTAutograd's compiled backward graph.  ``guide``: the sample's ``meta``
    twin, which moves the inputs that need no gradient as in the forward check
    (:func:`to_device`: ``tensor_split``'s CPU indices stay on the CPU, a ``"cpu"``
    device argument becomes tpu)."""
    from torch.testing._internal.opinfo.core import SampleInput

    desc = describe({"input": sample.input, "args": tuple(sample.args), **sample.kwargs})
    atol, rtol = tol if tol is not None else tolerance(op, dtype)[:2]
    leaves = _leaves([sample.input, list(sample.args), dict(sample.kwargs)], [])
    if not leaves:
        return SampleResult(index, "skipped", "", "no input requires grad", sample=desc)
    # the OpInfo's own post-processing (e.g. eigenvector sign normalisation) makes the
    # gradient well defined; PyTorch's gradient tests apply it too
    process = getattr(sample, "output_process_fn_grad", None) or (lambda x: x)
    try:
        outs = _grad_outputs(process(_call(op, sample)), [])
        if not outs:
            return SampleResult(index, "skipped", "", "no differentiable output", sample=desc)
        gen = torch.Generator().manual_seed(seed + index)
        cots = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
        expected = torch.autograd.grad(outs, leaves, cots, allow_unused=True)
    except Exception as exc:
        return SampleResult(index, "skipped", "",
                            f"CPU backward raised {type(exc).__name__}: "
                            f"{_first_line(str(exc))[:200]}", sample=desc)
    try:
        # leaves keep their strides and storage offset (the whole storage moves, see
        # _move_tensor): ops such as as_strided address the storage, not the elements
        memo: dict = {}
        mapping = {id(t): _move_tensor(t, device, memo).detach().requires_grad_(True)
                   for t in leaves}
        dev_sample = SampleInput(_swap_leaves(sample.input, mapping),
                                 args=_swap_leaves(tuple(sample.args), mapping),
                                 kwargs=_swap_leaves(dict(sample.kwargs), mapping))
        dev_leaves = [mapping[id(t)] for t in leaves]
        # tensors of the sample that need no grad move too
        g_in, g_args, g_kwargs = guide if guide is not None else (None, None, None)
        dev_sample = SampleInput(
            to_device(dev_sample.input, device, g_in, memo),
            args=to_device(tuple(dev_sample.args), device, g_args, memo),
            kwargs=to_device(dict(dev_sample.kwargs), device, g_kwargs, memo))
        douts = _grad_outputs(process((compiled_call if compiled else _call)(op, dev_sample)),
                              [])
        actual = torch.autograd.grad(douts, dev_leaves,
                                     [c.to(o.device) for c, o in zip(cots, douts)],
                                     allow_unused=True)
        actual = [None if a is None else a.cpu() for a in actual]
    except Exception as exc:
        status, cause, detail = (classify_compiled_exception if compiled
                                 else classify_exception)(exc)
        return SampleResult(index, status, cause, "backward: " + detail, sample=desc)
    for k, (a, e) in enumerate(zip(actual, expected)):
        if (a is None) != (e is None):
            return SampleResult(index, "mismatch", f"wrong gradient: {op_id(op)}",
                                f"grad[{k}]: None on one side only", sample=desc)
        if a is None:
            continue
        diff = compare(a, e, atol, rtol, device="cpu")
        if diff is not None:
            detail = f"grad[{k}] {diff.path}: {diff.detail}"
            if diff.what == "values" and dtype in _ARBITRATED:
                ok, info = _grad_f64_verdict(op, sample, leaves, cots, expected, actual,
                                             atol, rtol, seed)
                if ok:
                    return SampleResult(index, "pass-f64", "", f"{detail}; {info}",
                                        diff.max_abs, diff.max_rel, sample=desc)
                detail += f"; {info}"
            return SampleResult(index, "mismatch", f"wrong gradient: {op_id(op)}",
                                detail, diff.max_abs, diff.max_rel, sample=desc)
    return SampleResult(index, "pass", sample=desc)


def _grad_f64_verdict(op, sample, leaves, cots, expected, actual, atol: float,
                      rtol: float, seed: int = 0) -> tuple[bool, str]:
    """Arbitrate a gradient value mismatch with float64: the same gradients computed on
    CPU with the sample's leaves, other floating tensors and cotangents in
    float64/complex128.  The rule is :func:`closer_to_f64` with ``per_tensor``: every
    element of tpu's gradient is within twice CPU's own largest float32 error on that
    gradient (or within tolerance of float64).  Gradients are sums over many outputs
    (the backward of ``grid_sampler_2d`` in bicubic mode accumulates 16 taps per output
    with scatter-adds; its grid gradients reach ~100 with float32 errors ~1e-4 on CPU
    and tpu alike) whose float32 rounding depends on the order of summation, so CPU and
    tpu err by similar amounts at different elements; a wrong formula fails, being
    orders of magnitude outside that noise.  Returns ``(passes, explanation)``."""
    from torch.testing._internal.opinfo.core import SampleInput

    process = getattr(sample, "output_process_fn_grad", None) or (lambda x: x)
    mapping = {id(t): t.detach().to(_WIDE.get(t.dtype, t.dtype)).requires_grad_(True)
               for t in leaves}
    s64 = SampleInput(_to_f64(_swap_leaves(sample.input, mapping)),
                      args=_to_f64(_swap_leaves(tuple(sample.args), mapping)),
                      kwargs=_to_f64(_swap_leaves(dict(sample.kwargs), mapping)))
    torch.manual_seed(seed)
    try:
        outs = _grad_outputs(process(_call(op, s64)), [])
        wide_cots = [c.to(o.dtype) for c, o in zip(cots, outs)]
        ref = torch.autograd.grad(outs, [mapping[id(t)] for t in leaves], wide_cots,
                                  allow_unused=True)
    except Exception as exc:  # noqa: BLE001 - no float64 kernel: no verdict
        return False, f"float64 backward raised {type(exc).__name__}"
    pairs = [(x, y, r) for x, y, r in zip(expected, actual, ref)
             if x is not None and y is not None]
    if any(r is None for _, _, r in pairs) or len(outs) != len(cots):
        return False, "float64 gradient structure differs"
    xs, ys, rs = zip(*pairs) if pairs else ((), (), ())
    return closer_to_f64(xs, ys, rs, atol, rtol, per_tensor=True)


def check_op_backward(op, dtype: torch.dtype, limit: Optional[int] = None,
                      seed: int = 0, compiled: Optional[bool] = None) -> Optional[PairResult]:
    """The (op, dtype) backward pair, or None when the OpInfo has no autograd support.
    ``compiled``: as in :func:`check_op`."""
    if compiled is None:
        compiled = _compile_mode()
    if not getattr(op, "supports_autograd", False) or is_random(op) or \
            dtype not in op.supported_backward_dtypes("cpu"):
        return None
    t0 = time.perf_counter()
    tol = tolerance(op, dtype)
    torch.manual_seed(seed)
    try:
        every = list(op.sample_inputs("cpu", dtype, requires_grad=True))
        indices = limited_indices(every, limit)
        samples = [every[i] for i in indices]
    except Exception as exc:
        r = SampleResult(0, "skipped", "", f"sample_inputs raised {type(exc).__name__}")
        return aggregate(op_id(op) + ".backward", dtype, [r], tol, 0.0)
    guides = _meta_guides(op, dtype, len(every), seed)
    results = []
    for i, s in zip(indices, samples):
        try:
            results.append(run_sample_backward(op, s, dtype, i, tol[:2], seed,
                                               compiled=compiled, guide=guides[i]))
        except Exception as exc:
            results.append(SampleResult(i, "error", f"harness: {type(exc).__name__}",
                                        _first_line(str(exc))[:300]))
    if compiled:
        torch._dynamo.reset()
    return aggregate(op_id(op) + ".backward", dtype, results, tol, time.perf_counter() - t0)


if __name__ == "__main__":
    sys.exit(main())
