"""Device-side checks: index bounds and similar conditions PyTorch's CPU kernels raise on.

A lowering calls :func:`check` with a traced boolean "something is wrong" and the error
PyTorch would raise.  The executor returns the flags as extra outputs of the executable
and verifies them at the next sync point — the way CUDA reports a device-side assert —
or right after the op in DEBUG mode.  So an out-of-range index never yields a silent
value: the program raises, at the op in DEBUG mode, or at the next ``item()``/``.cpu()``/
``synchronize()`` otherwise.
"""

from __future__ import annotations

_active = None  # list of (flag, exc_type, message) while an executable is being traced


def check(bad, exc_type, message: str) -> None:
    """Record that ``bad`` (traced bool, any shape) must be all False, else raise
    ``exc_type(message)``.  Outside a traced executable it is evaluated at once."""
    if _active is not None:
        _active.append((bad, exc_type, message))
        return
    import numpy as np

    if bool(np.asarray(bad).any()):
        raise exc_type(message)


def index_in_range(index, size: int, dim: int, what: str = "index"):
    """Check ``-size <= index < size`` (PyTorch's bounds rule); returns the traced mask of
    the entries outside it (what a writing lowering drops its updates on)."""
    bad = (index < -size) | (index >= size)
    check(bad, IndexError, f"{what} out of bounds for dimension {dim} with size {size}")
    return bad


class Tracing:
    """Context for the executor: collect the checks of one traced lowering call."""

    def __enter__(self):
        global _active
        self.prev = _active
        _active = []
        self.checks = _active
        return self

    def __exit__(self, *exc):
        global _active
        _active = self.prev
        return False
