"""PyTorch's own device-generic test files (test_view_ops.py, test_indexing.py,
test_shape_ops.py, test_scatter_gather.py, test_sort_and_select.py,
test_type_promotion.py, test_unary_ufuncs.py, test_reductions.py) run on ``tpu``, each in a
child pytest, against an expected-failure list kept here (``expected_failures.txt``: test id
+ reason).

The files are upstream PyTorch's, unmodified, in ``shared/torch_tests`` beside the clone
(``<clone>/../shared/torch_tests``); ``TORCHTPU_TORCH_TESTS_DIR`` names other folders to look
in first (``os.pathsep``-separated).  This repository carries no upstream code: a file found
in none of these folders skips (today shared/ holds test_view_ops, test_indexing and
test_shape_ops; the others were run from a local copy, see docs/conformance/torch-tests.md).  A child process keeps the upstream files' global state
(default dtype, warnings filters, PyTorch's TestCase set-up) out of our suite.

A test here fails when an upstream test fails that is not on the list, when a listed test
passes (``XPASS(strict)``: take it off the list), or when a listed id no longer exists.

``TORCHTPU_TORCH_TESTS`` picks what runs:

* ``fast`` (the default, what ``make test`` and CI run): the tests listed in
  ``fast_subset.txt`` (one per upstream test function among those that took under 3 s
  on the loaded 2-core machine in a complete run: a minute or two in all);
* ``1`` / ``all`` (``make test-upstream``): every test of every file in ``FILES`` (~1 h
  on 2 cores: every new shape compiles an executable);
* ``0``: none.

``TORCHTPU_TORCH_TESTS_ARGS`` adds arguments to the child pytest (``-x``, a later ``-k``
narrows the selection).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FILES = ["test_view_ops.py", "test_indexing.py", "test_shape_ops.py",
         "test_scatter_gather.py", "test_sort_and_select.py", "test_type_promotion.py",
         "test_unary_ufuncs.py", "test_reductions.py"]
TIMEOUT_S = int(os.environ.get("TORCHTPU_TORCH_TESTS_TIMEOUT", "3600"))
FAST_SUBSET = HERE / "fast_subset.txt"


def fast_subset(name: str) -> list[str]:
    """The node ids of upstream file ``name`` in ``fast_subset.txt``."""
    ids = []
    for line in FAST_SUBSET.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith(name + "::"):
            ids.append(line)
    return ids


def torch_tests_dirs() -> list[Path]:
    """Folders that may hold the upstream files, in search order: each folder of
    ``$TORCHTPU_TORCH_TESTS_DIR`` (``os.pathsep``-separated), then the first
    ``shared/torch_tests`` found walking up from the repository (the clone's sibling
    ``shared/`` on CI; ``/work/shared`` for a worktree under ``/work/wt``)."""
    dirs = [Path(p) for p in os.environ.get("TORCHTPU_TORCH_TESTS_DIR", "").split(os.pathsep)
            if p and Path(p).is_dir()]
    for parent in REPO.parents:
        cand = parent / "shared" / "torch_tests"
        if cand.is_dir():
            dirs.append(cand)
            break
    return dirs


def find_file(name: str) -> Path | None:
    """The folder of :func:`torch_tests_dirs` holding upstream file ``name``, or None."""
    return next((d for d in torch_tests_dirs() if (d / name).is_file()), None)


def _summary(out: str) -> str:
    lines = out.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.mark.parametrize("name", FILES)
def test_upstream_file(name):
    """Run one upstream file on tpu; every result must match the expected-failure list."""
    mode = os.environ.get("TORCHTPU_TORCH_TESTS", "fast").strip().lower()
    if mode == "0":
        pytest.skip("TORCHTPU_TORCH_TESTS=0")
    folder = find_file(name)
    if folder is None:
        pytest.skip(f"PyTorch's {name} not found in shared/torch_tests beside the clone "
                    f"({REPO.parent / 'shared' / 'torch_tests'}) nor in "
                    f"TORCHTPU_TORCH_TESTS_DIR")
    selection = [name]
    if mode == "fast":
        selection = fast_subset(name)
        if not selection:
            pytest.skip(f"no test of {name} in fast_subset.txt (TORCHTPU_TORCH_TESTS=1 "
                        f"runs the whole file)")
    env = dict(os.environ)
    env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = "privateuse1"
    # these files run most op signatures once (loops over shapes and dtypes): the quick
    # compile tier (torchtpu.eager.tiers) pays off there
    env.setdefault("TORCHTPU_COMPILE_TIERS", "1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryDirectory() as tmp:
        stale_file = Path(tmp) / "stale.txt"
        env["TORCHTPU_UPSTREAM_STALE"] = str(stale_file)
        cmd = [sys.executable, "-m", "pytest", "-c", str(HERE / "pytest.ini"),
               "--rootdir", str(folder), "-p", "torchtpu_upstream_xfail", "-q", "-rfEX",
               "-k", "PRIVATEUSE1 or TPU", *selection,
               *shlex.split(os.environ.get("TORCHTPU_TORCH_TESTS_ARGS", ""))]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        wall = time.perf_counter() - t0
        stale = stale_file.read_text().split() if stale_file.exists() else []
    out = proc.stdout + proc.stderr
    print(f"{name}: {_summary(out)} ({wall:.0f} s)")
    assert not stale, (f"{name}: expected_failures.txt lists tests that no longer exist: "
                       f"{stale}")
    assert proc.returncode == 0, (
        f"{name}: upstream tests fail that are not in tests/torch_upstream/"
        f"expected_failures.txt, or listed ones now pass (XPASS(strict): remove them):\n"
        + out[-12000:])
