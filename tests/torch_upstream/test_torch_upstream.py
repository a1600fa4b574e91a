"""PyTorch's own device-generic test files (test_view_ops.py, test_indexing.py,
test_shape_ops.py, test_scatter_gather.py, test_sort_and_select.py,
test_type_promotion.py, test_unary_ufuncs.py, test_reductions.py) run on ``tpu``, each in a
child pytest, against an expected-failure list kept here (``expected_failures.txt``: test id,
the exception it raises on tpu, reason; see ``torchtpu_upstream_xfail.py``).

The files are upstream PyTorch's, unmodified, and are not in this repository nor shipped
with it: copy them (``test/<file>`` of pytorch/pytorch at the revisions in
docs/conformance/torch-tests.md) into a folder outside the repository and name it in
``TORCHTPU_TORCH_TESTS_DIR`` (several folders: ``os.pathsep``-separated).  The runner also
looks in ``shared/torch_tests`` beside the clone (the first such folder walking up from the
repository).  A file found in none of these folders runs nothing: its test skips with one
line saying so (``pytest -rs`` lists the reasons), so a checkout without the files, CI
included, runs none of them.  A folder named in
``TORCHTPU_TORCH_TESTS_DIR`` that does not exist is an error, not a skip.  A child process
keeps the upstream files' global state (default dtype, warnings filters, PyTorch's TestCase
set-up) out of our suite.

A test here fails when an upstream test fails that is not on the list, when a listed test
passes (``XPASS(strict)``: take it off the list) or raises another exception than its
``raises=``, or when a listed id no longer exists.

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
ENV_DIR = "TORCHTPU_TORCH_TESTS_DIR"
DOC = "docs/conformance/torch-tests.md"
#: prefix of the lines this runner reports (skip reasons, the result line of each file)
TAG = "torchtpu_upstream"


def fast_subset(name: str) -> list[str]:
    """The node ids of upstream file ``name`` in ``fast_subset.txt``."""
    ids = []
    for line in FAST_SUBSET.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith(name + "::"):
            ids.append(line)
    return ids


def env_dirs(environ=None) -> list[Path]:
    """The folders named in ``$TORCHTPU_TORCH_TESTS_DIR`` (``os.pathsep``-separated)."""
    environ = os.environ if environ is None else environ
    return [Path(p) for p in environ.get(ENV_DIR, "").split(os.pathsep) if p]


def torch_tests_dirs(environ=None, repo: Path | None = None) -> list[Path]:
    """Folders that may hold the upstream files, in search order: each existing folder
    of ``$TORCHTPU_TORCH_TESTS_DIR``, then the first ``shared/torch_tests`` found walking
    up from the repository (the clone's sibling ``shared/``)."""
    dirs = [d for d in env_dirs(environ) if d.is_dir()]
    for parent in (REPO if repo is None else repo).parents:
        cand = parent / "shared" / "torch_tests"
        if cand.is_dir():
            dirs.append(cand)
            break
    return dirs


def find_file(name: str, environ=None, repo: Path | None = None) -> Path | None:
    """The folder of :func:`torch_tests_dirs` holding upstream file ``name``, or None."""
    return next((d for d in torch_tests_dirs(environ, repo) if (d / name).is_file()), None)


def missing_dirs_error(environ=None) -> str | None:
    """The error for ``$TORCHTPU_TORCH_TESTS_DIR`` naming a folder that does not exist."""
    bad = [str(d) for d in env_dirs(environ) if not d.is_dir()]
    if bad:
        return (f"{TAG}: {ENV_DIR} names {', '.join(bad)}, not a folder: point it at the "
                f"folder holding your copies of PyTorch's test files (see {DOC})")
    return None


def absent_line(name: str, environ=None, repo: Path | None = None) -> str:
    """The one line saying that upstream file ``name`` was found nowhere, so nothing ran."""
    dirs = torch_tests_dirs(environ, repo)
    where = ("in " + " nor ".join(str(d) for d in dirs) if dirs
             else f"({ENV_DIR} unset, no shared/torch_tests beside the clone)")
    return (f"{TAG}: {name} not found {where}: ran nothing (set {ENV_DIR}=<folder> "
            f"to a local copy of PyTorch's test/{name}, see {DOC})")


def _summary(out: str) -> str:
    lines = out.strip().splitlines()
    return lines[-1].strip("= ") if lines else ""


def run_child(folder: Path, selection: list[str], extra_env=None, args=()):
    """Run the child pytest on ``selection`` (file or node ids) in ``folder``.

    Returns ``(returncode, output, stale ids, wall seconds)``."""
    env = dict(os.environ)
    env.update(extra_env or {})
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
               "-k", "PRIVATEUSE1 or TPU", *selection, *args]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        wall = time.perf_counter() - t0
        stale = stale_file.read_text().split() if stale_file.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, stale, wall


@pytest.mark.parametrize("name", FILES)
def test_upstream_file(name):
    """Run one upstream file on tpu; every result must match the expected-failure list."""
    mode = os.environ.get("TORCHTPU_TORCH_TESTS", "fast").strip().lower()
    if mode == "0":
        pytest.skip(f"{TAG}: {name}: TORCHTPU_TORCH_TESTS=0: ran nothing")
    error = missing_dirs_error()
    if error:
        pytest.fail(error, pytrace=False)
    folder = find_file(name)
    if folder is None:
        pytest.skip(absent_line(name))
    selection = [name]
    if mode == "fast":
        selection = fast_subset(name)
        if not selection:
            pytest.skip(f"{TAG}: no test of {name} in fast_subset.txt: ran nothing "
                        f"(TORCHTPU_TORCH_TESTS=1 runs the whole file)")
    rc, out, stale, wall = run_child(
        folder, selection, args=shlex.split(os.environ.get("TORCHTPU_TORCH_TESTS_ARGS", "")))
    what = "the whole file" if mode != "fast" else f"{len(selection)} tests of fast_subset.txt"
    print(f"{TAG}: {name} from {folder} ({what}): {_summary(out)} ({wall:.0f} s)")
    assert not stale, (f"{name}: expected_failures.txt lists tests that no longer exist: "
                       f"{stale}")
    assert rc == 0, (
        f"{name}: upstream tests fail that are not in tests/torch_upstream/"
        f"expected_failures.txt, fail with another exception than its raises=, or "
        f"listed ones now pass (XPASS(strict): remove them):\n" + out[-12000:])
