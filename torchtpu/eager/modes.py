"""Eager modes: STRICT, DEBUG and DEFER_AND_FUSE (``torch.tpu.EagerMode``).

* ``STRICT``: asynchronous per-op dispatch (like CUDA): each op is one compiled
  executable, queued without waiting; the host waits only at sync points.
* ``DEBUG``: synchronous: every op finishes before the next one is dispatched, so a
  runtime error surfaces at the op that caused it, in the user's frame.  With
  ``TORCHTPU_DEBUG_NANS=1`` (``torch.tpu.debug_nans = True``) each op's floating outputs
  are checked and the first op producing NaN/Inf raises, naming the op and shapes.
  ``TORCHTPU_LOG_OPS=1`` logs each op (name, shapes, dtypes, seconds) to stderr.
* ``DEFER_AND_FUSE``: ops are recorded, not run; a recorded segment runs as one fused XLA
  computation when a value must exist (see :mod:`torchtpu.eager.defer`).

The start-up mode comes from ``TORCHTPU_EAGER_MODE=strict|debug|defer_and_fuse``.
"""

from __future__ import annotations

import contextlib
import enum
import os


class EagerMode(enum.Enum):
    """How ``tpu`` ops execute (``torch.tpu.EagerMode``)."""

    STRICT = "strict"
    DEBUG = "debug"
    DEFER_AND_FUSE = "defer_and_fuse"


def _from_env() -> EagerMode:
    v = os.environ.get("TORCHTPU_EAGER_MODE", "strict").strip().lower()
    try:
        return EagerMode(v)
    except ValueError:
        raise ValueError(
            f"TORCHTPU_EAGER_MODE={v!r}: expected one of strict, debug, defer_and_fuse"
        ) from None


_mode = None


def get_eager_mode() -> EagerMode:
    """The current eager mode."""
    global _mode
    if _mode is None:
        _apply(_from_env())
    return _mode


def _apply(mode: EagerMode) -> None:
    global _mode
    from torchtpu.eager import executor

    if _mode is EagerMode.DEFER_AND_FUSE and mode is not EagerMode.DEFER_AND_FUSE:
        from torchtpu.eager import defer

        defer.flush("mode_change")
    _mode = mode
    executor.CONFIG.debug_sync = mode is EagerMode.DEBUG
    executor.CONFIG.defer = mode is EagerMode.DEFER_AND_FUSE


def set_eager_mode_now(mode) -> None:
    """Switch the eager mode (a pending DeferAndFuse segment runs first)."""
    if isinstance(mode, str):
        mode = EagerMode(mode.lower())
    if not isinstance(mode, EagerMode):
        raise TypeError(f"expected torch.tpu.EagerMode, got {mode!r}")
    get_eager_mode()
    _apply(mode)


class set_eager_mode:
    """Switch the eager mode now; as a context manager, restore the previous mode on exit
    (also when the block raises).  Like ``torch.set_grad_enabled``, both forms work::

        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEBUG)          # from here on
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEBUG):    # for the block

    Raises ``ValueError`` for an unknown mode name, ``TypeError`` for a non-mode."""

    def __init__(self, mode):
        self.prev = get_eager_mode()
        set_eager_mode_now(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        set_eager_mode_now(self.prev)
        return False
