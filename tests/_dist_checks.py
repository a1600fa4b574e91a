"""What every multi-process test worker shares (tests/_dist*_worker.py, _dtensor_worker.py).

A worker runs as ``python tests/<worker>.py RANK WORLD PORT OUT``; each check is a
function decorated with :func:`check`, run at once, its outcome recorded as ``"ok"`` or
the traceback; :func:`write_results` writes ``{check name: outcome}`` to
``OUT/rank{RANK}.json`` for the spawning test to read.  ``DIST_WORKER_ONLY=a,b`` runs
only the checks whose names start with ``a`` or ``b``.
"""

import json
import os
import sys
import time
import traceback

import torch

RANK, WORLD, PORT, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
ONLY = [c for c in os.environ.get("DIST_WORKER_ONLY", "").split(",") if c]
results: dict = {}
seconds: dict = {}


def check(name, enabled=True):
    """Decorator: run the function now as check ``name`` (unless ``enabled`` is false or
    ``DIST_WORKER_ONLY`` leaves it out) and record its outcome and seconds."""
    def deco(fn):
        if not enabled or (ONLY and not any(name.startswith(c) for c in ONLY)):
            return fn
        t0 = time.perf_counter()
        try:
            fn()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
        seconds[name] = round(time.perf_counter() - t0, 2)
        return fn
    return deco


def data(dtype, shape=(2, 3), rank=RANK):
    """A rank-dependent test tensor of ``dtype`` (on the CPU)."""
    x = torch.arange(1, 1 + torch.Size(shape).numel()).reshape(shape) * (rank + 1) + rank
    if dtype.is_floating_point:
        x = x * 0.37 - 1.1
    return x.to(dtype)


def assert_same(got, want, what):
    """``got`` (any device) equals CPU tensor ``want`` exactly, dtype and shape included."""
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: tpu {got} != cpu {want}")


def write_results():
    """Write this rank's outcomes to ``OUT/rank{RANK}.json`` and print the seconds."""
    with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
        json.dump(results, f)
    print("seconds per check:", seconds, flush=True)
