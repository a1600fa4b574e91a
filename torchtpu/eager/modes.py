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

The start-up mode comes from the environment variable ``TORCHTPU_EAGER_MODE``, read
when torchtpu loads (``import torch`` autoloads it), before the first op, in every
process: torchrun ranks and DataLoader workers included.  :data:`SPELLINGS` is the one
list of the names it accepts (case-insensitive; ``-`` and ``_`` are the same); any other
value raises ``ValueError`` at load, naming them.
"""

from __future__ import annotations

import enum
import os


class EagerMode(enum.Enum):
    """How ``tpu`` ops execute (``torch.tpu.EagerMode``)."""

    STRICT = "strict"
    DEBUG = "debug"
    DEFER_AND_FUSE = "defer_and_fuse"


ENV = "TORCHTPU_EAGER_MODE"

# The names TORCHTPU_EAGER_MODE, torch.tpu.eager_mode = "..." and set_eager_mode("...")
# accept, after lower-casing and reading "-" as "_".  The one place they are listed.
SPELLINGS = {
    "strict": EagerMode.STRICT,
    "debug": EagerMode.DEBUG,
    "defer_and_fuse": EagerMode.DEFER_AND_FUSE,
    "defer": EagerMode.DEFER_AND_FUSE,
    "deferandfuse": EagerMode.DEFER_AND_FUSE,
}


def parse(value: str, *, source: str = ENV) -> EagerMode:
    """The :class:`EagerMode` a user's spelling names.

    Args:
        value: ``"strict"``, ``"debug"``, ``"defer_and_fuse"`` / ``"defer"`` (any case,
            ``-`` or ``_``).
        source: what to name in the error (the environment variable by default).

    Raises:
        ValueError: an unknown name; the message lists the accepted spellings.
    """
    key = value.strip().lower().replace("-", "_")
    try:
        return SPELLINGS[key]
    except KeyError:
        raise ValueError(
            f"{source}={value!r} is not an eager mode: expected one of "
            f"{', '.join(SPELLINGS)} (any case; '-' or '_')"
        ) from None


def from_environment() -> EagerMode:
    """The mode ``TORCHTPU_EAGER_MODE`` selects (STRICT when unset or empty).

    Raises:
        ValueError: the variable names no mode (see :func:`parse`)."""
    v = os.environ.get(ENV, "")
    return parse(v) if v.strip() else EagerMode.STRICT


class Config:
    """The eager executor's switches, one object for the process (``CONFIG``): the eager
    mode sets ``debug_sync`` (wait for every op) and ``defer`` (record ops) in
    :func:`_apply`; ``debug_nans``, ``log_ops`` and ``cpu_fallback`` start from
    ``TORCHTPU_DEBUG_NANS``, ``TORCHTPU_LOG_OPS`` and ``TORCHTPU_CPU_FALLBACK`` and are
    set by ``torch.tpu.debug_nans`` / ``torch.tpu.enable_cpu_fallback``.  The C++ op
    kernels read the same object (``set_kernel_switches``)."""

    debug_sync = False
    defer = False
    debug_nans = os.environ.get("TORCHTPU_DEBUG_NANS", "0") not in ("", "0")
    log_ops = os.environ.get("TORCHTPU_LOG_OPS", "0") not in ("", "0")
    # torch.tpu.enable_cpu_fallback: ops without a lowering run on the CPU
    cpu_fallback = os.environ.get("TORCHTPU_CPU_FALLBACK", "0") not in ("", "0")


CONFIG = Config()
_mode: EagerMode | None = None


def load_from_environment() -> EagerMode:
    """Apply ``TORCHTPU_EAGER_MODE``: called once when torchtpu registers the device.

    No JAX import: the executor, when it loads later, reads the mode with
    :func:`get_eager_mode`.  Raises ``ValueError`` for an unknown value."""
    mode = from_environment()
    if _mode is None:
        _apply(mode)
    return _mode


def get_eager_mode() -> EagerMode:
    """The current eager mode."""
    if _mode is None:
        _apply(from_environment())
    return _mode


def _apply(mode: EagerMode) -> None:
    global _mode
    if _mode is EagerMode.DEFER_AND_FUSE and mode is not EagerMode.DEFER_AND_FUSE:
        from torchtpu.eager import defer

        defer.flush("mode_change")
    if mode is not EagerMode.STRICT:
        # DEBUG and DeferAndFuse take concrete arrays: first calls still compiling on
        # worker threads (eager.async_compile) finish and hand their storages the arrays
        from torchtpu._tensor import storage

        storage.settle_all()
    _mode = mode
    CONFIG.debug_sync = mode is EagerMode.DEBUG
    CONFIG.defer = mode is EagerMode.DEFER_AND_FUSE


def set_eager_mode_now(mode) -> None:
    """Switch the eager mode (a pending DeferAndFuse segment runs first).

    Args:
        mode: an :class:`EagerMode` or one of :data:`SPELLINGS`.

    Raises:
        ValueError: an unknown name.  TypeError: neither a mode nor a string."""
    if isinstance(mode, str):
        mode = parse(mode, source="eager mode")
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
