"""pytest plugin for PyTorch's own test files run on ``tpu`` (see test_torch_upstream.py).

Loaded in the child pytest with ``-p torchtpu_upstream_xfail``.  Every test id listed in
``expected_failures.txt`` (beside this file) gets ``xfail(strict=True, reason=...)``: it
must fail; if it passes, pytest reports ``XPASS(strict)`` as a failure, so the list can
only shrink.  Listed ids that were not collected (renamed or removed upstream) are
written to the file named by ``TORCHTPU_UPSTREAM_STALE`` for the parent test to report.

An id holding ``*`` is a pattern (``fnmatch``) for a family of tests that fail for one
reason (an op with no lowering, across every OpInfo test and dtype): every test it
matches is a strict xfail, and a pattern that matches no collected test is stale.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import pytest

LIST = Path(__file__).with_name("expected_failures.txt")


def load(path: Path = LIST) -> dict:
    """``{test id: reason}`` from the expected-failure list.

    One entry a line, ``<file>::<Class>::<test>  # <reason>``; ``#`` lines and blank lines
    are comments.  A missing reason is an error (every entry says why it fails)."""
    entries = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        test_id, sep, reason = line.partition(" # ")
        if not sep or not reason.strip():
            raise ValueError(f"{path}:{n}: entry without a reason (`<id>  # <reason>`)")
        entries[test_id.strip()] = reason.strip()
    return entries


@pytest.hookimpl(tryfirst=True)  # before -k deselects: ids only missing if gone
def pytest_collection_modifyitems(session, config, items):
    entries = load()
    patterns = [(t, r) for t, r in entries.items() if "*" in t]
    files = {Path(str(a).split("::")[0]).name for a in config.args}
    seen = set()
    for item in items:
        key, reason = item.nodeid, entries.get(item.nodeid)
        if reason is None:
            key, reason = next(((t, r) for t, r in patterns
                                if fnmatch.fnmatchcase(item.nodeid, t)), (None, None))
        if reason is not None:
            seen.add(key)
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
    # node ids on the command line (the fast subset): only those can be reported stale
    requested = {str(a) for a in config.args if "::" in str(a)}
    stale = sorted(t for t in entries if t not in seen and t.split("::")[0] in files
                   and (not requested or t in requested))
    out = os.environ.get("TORCHTPU_UPSTREAM_STALE")
    if out:
        Path(out).write_text("".join(t + "\n" for t in stale))
