"""What the default test run leaves to ``make test-full`` (``TORCHTPU_FULL_TESTS=1``).

``make test`` is what CI runs, on a 2-core machine with a 20-minute budget for the whole
command (set-up, the main suite, the vision part).  Sweeps run a sample there (every
k-th case, fewer dtypes or samples) and a few long process-level tests run only in the
full run; each such place says what it leaves out.  One place for the switch.
"""

from __future__ import annotations

import os

import pytest

FULL = os.environ.get("TORCHTPU_FULL_TESTS") == "1"

# a test that runs only in the full run (its reason names what covers it by default)
full_only = pytest.mark.skipif(not FULL, reason="long: TORCHTPU_FULL_TESTS=1 (make test-full)")


def every(cases, k: int) -> list:
    """``cases`` in the full run; every ``k``-th of them (the first included) by default."""
    cases = list(cases)
    return cases if FULL else cases[::k]
