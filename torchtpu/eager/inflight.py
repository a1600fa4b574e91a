"""What has been dispatched to the device and not yet waited on or verified.

Two pieces of process-wide state, shared by every executor (strict eager and its C++ hot
path, DeferAndFuse segments, shape buckets, ``torch.compile`` graphs, ``tpu_dist``
collectives) and read at the sync points (``eager.sync``, ``_device.streams``):

* :data:`LAST_OUTPUTS`: the results of the most recently dispatched executable.  PJRT
  runs a device's executables in dispatch order, so waiting for them
  (``torch.tpu.synchronize``) waits for everything dispatched before.
* :data:`PENDING_CHECKS`: device-side error flags (an out-of-range index, a collective's
  mismatched signatures) not verified yet; ``host_reads.check_pending`` verifies and clears
  them at the next sync point.

Everyone calls the functions below.  The executor's per-op paths (``executor.py`` and
the C++ hot path in ``_tensor/_native.cpp``, handed this module by ``hot_setup``) store
``LAST_OUTPUTS`` and append to ``PENDING_CHECKS`` directly, for speed: the list is one
object for the whole process (emptied in place, never replaced), so they may keep a
reference to it.  This module imports nothing (no JAX).
"""

from __future__ import annotations

from torchtpu._tensor import storage as _st

# the results of the most recently dispatched executable: a tuple (or list) of JAX arrays,
# or of DeferAndFuse values; () when nothing dispatched since is to be waited on
LAST_OUTPUTS = ()

# device-side checks not verified yet, oldest first: (flags, info, op), ``flags`` a bool[n]
# JAX array (or a DeferAndFuse ``Lazy`` standing for one), ``info`` the n
# ``(exception type, message)`` pairs (see ``ops._checks``), ``op`` what the error names
PENDING_CHECKS: list = []

# more pending checks than this are verified at once (``host_reads.check_pending``): the
# flags are small, but each holds a device buffer
CHECK_LIMIT = 256


def dispatched(outputs) -> None:
    """Record ``outputs`` (a tuple or list of JAX arrays, or a pytree of them) as the
    results of the most recently dispatched executable: ``torch.tpu.synchronize`` waits
    for them, ``Event.record`` remembers them."""
    global LAST_OUTPUTS
    LAST_OUTPUTS = outputs


def last_outputs():
    """The results of the most recently dispatched executable (see :func:`dispatched`);
    ``()`` if none is held.  Pending first calls' results (``eager.async_compile``) are
    waited for and given as their arrays."""
    outs = LAST_OUTPUTS
    if any(o.__class__ is _st.Lazy for o in outs):
        outs = tuple(x for x in map(_concrete, outs) if x is not None)
    return outs


def _concrete(o):
    if o.__class__ is not _st.Lazy:
        return o
    if o.node is not _st.ASYNC:
        return o.value
    try:
        return _st.settle(o)
    except RuntimeError:  # its job failed: raised where the value is read, not here
        return None


def clear_last() -> None:
    """Stop holding the last executable's results, e.g. before a call that donates
    buffers: a reference held here would keep an input array from being donated.  The
    caller records its own results afterwards (:func:`dispatched`)."""
    global LAST_OUTPUTS
    LAST_OUTPUTS = ()


def add_check(flags, info, op) -> bool:
    """Queue a device-side check: ``flags`` a bool[n] JAX array (or a DeferAndFuse
    ``Lazy``), true where check ``i`` failed; ``info`` the n ``(exception type,
    message)`` pairs; ``op`` what the error names.  Returns whether more than
    :data:`CHECK_LIMIT` are pending (the caller then verifies them:
    ``host_reads.check_pending``)."""
    PENDING_CHECKS.append((flags, info, op))
    return len(PENDING_CHECKS) > CHECK_LIMIT


def take_checks(upto=None) -> list:
    """The pending checks, ``[(flags, info, op)]`` oldest first, removed from the queue
    (the caller verifies them).  With ``upto`` (a :func:`mark`): only those queued up to
    that mark, the later ones staying queued; none when the mark's check is no longer
    queued (a sync verified it and everything before it)."""
    if upto is None:
        pending = PENDING_CHECKS[:]
        PENDING_CHECKS.clear()
        return pending
    if upto is _NOTHING:
        return []
    for i in range(len(PENDING_CHECKS) - 1, -1, -1):
        if PENDING_CHECKS[i] is upto:
            pending = PENDING_CHECKS[:i + 1]
            del PENDING_CHECKS[:i + 1]
            return pending
    return []


_NOTHING = ("nothing pending",)


def mark():
    """A mark of the checks queued so far (the latest entry itself, or a token for an
    empty queue), for ``take_checks(upto=...)``: a sync point that covers only the work
    dispatched before the mark (an asynchronous host copy of a step's results) verifies
    those checks and leaves later work's checks queued."""
    return PENDING_CHECKS[-1] if PENDING_CHECKS else _NOTHING


def drop_check(flags) -> bool:
    """Remove the latest pending check whose flags are ``flags`` (the same object): its
    caller verified it itself (a ``tpu_dist`` work's ``wait()``).  Returns whether one was
    queued."""
    for i in range(len(PENDING_CHECKS) - 1, -1, -1):
        if PENDING_CHECKS[i][0] is flags:
            del PENDING_CHECKS[i]
            return True
    return False
