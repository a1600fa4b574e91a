"""Pieces shared by the model sweeps (:mod:`.models`, :mod:`.vision`).

* :func:`run_workers` -- one worker process per item (``multiprocessing`` forkserver with
  some modules preloaded), at most ``jobs`` at a time, killed after ``timeout`` seconds;
  a worker that dies or hangs becomes a ``crash`` / ``timeout`` record.
* :func:`load_json` / :func:`save_json` -- the resumable result files.
* :func:`error_record` -- an exception on tpu as a result record (with the missing ATen
  op when torchtpu says which).

Comparison of outputs (:func:`torchtpu.conformance.models.compare`) and root-cause
grouping (:func:`torchtpu.conformance.models.root_cause`) live in :mod:`.models`.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import time
import traceback
from typing import Callable, Optional, Sequence

MISSING_OP_RE = re.compile(r"the ATen op '(aten\.[^']+)' is not implemented")


def first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:300] if s else ''}"


def error_record(e: BaseException, stage: str, frames_from: str = "") -> dict:
    """``{status: error, stage, reason, missing_op, where}``; ``where`` is the innermost
    traceback frame whose file path contains ``frames_from``."""
    m = MISSING_OP_RE.search(str(e))
    tb = traceback.extract_tb(e.__traceback__)
    where = next((f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(tb)
                  if frames_from and frames_from in f.filename), None)
    return {"status": "error", "stage": stage, "reason": first_line(e),
            "missing_op": m.group(1) if m else None, "where": where}


def load_json(path: str) -> dict:
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"meta": {}, "results": {}}


def save_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def progress_bar(total: int, unit: str):
    """A ``tqdm`` progress bar over ``total`` items (None where tqdm is missing: the
    sweeps then print a line per item)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit=unit, dynamic_ncols=True)


def run_workers(items: Sequence[dict], target: Callable, *, args_of: Callable[[dict], tuple] = lambda item: (),
                base_of: Callable[[dict], dict] = lambda item: {"name": item["name"]},
                jobs: int = 1, timeout: float = 300.0, preload: Sequence[str] = ("torch",),
                on_result: Optional[Callable[[dict], None]] = None, progress: bool = True,
                unit: str = "item") -> list[dict]:
    """Run ``target(item, *args_of(item), threads, conn)`` in its own process per item;
    ``target`` sends one result dict through ``conn``.  At most ``jobs`` at a time (each
    gets ``cpu_count // jobs`` torch threads); killed after ``timeout`` seconds.  Results
    (in completion order) are passed to ``on_result`` as they come and returned."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))
    pending = list(items)
    running: list = []  # (item, proc, conn, start)
    results: list[dict] = []
    bar = progress_bar(len(items), unit) if progress else None

    def finish(item, res):
        results.append(res)
        if on_result:
            on_result(res)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{item['name'][:30]}: {res['status']}")
        else:
            print(f"[{len(results)}/{len(items)}] {item['name']}: {res['status']} "
                  f"{res.get('reason', '') or ''}"[:200], flush=True)

    try:
        while pending or running:
            while pending and len(running) < jobs:
                item = pending.pop(0)
                r, w = ctx.Pipe(duplex=False)
                p = ctx.Process(target=target, args=(item, *args_of(item), threads, w), daemon=True)
                p.start()
                w.close()
                running.append((item, p, r, time.time()))
            time.sleep(0.05)
            still = []
            for item, p, r, t0 in running:
                base = base_of(item)
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
                    still.append((item, p, r, t0))
                else:
                    r.close()
                    finish(item, res)
            running = still
    finally:
        for _, p, _, _ in running:
            p.kill()
        if bar is not None:
            bar.close()
    return results
