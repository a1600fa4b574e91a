"""The sync point: wait until every op dispatched so far has finished
(``torch.tpu.synchronize``, ``Stream.synchronize``, ``Event.synchronize``).

PJRT runs a device's executables in dispatch order, so waiting for the results of the
most recently dispatched executable (``inflight.LAST_OUTPUTS``) waits for everything
before it.  A pending DeferAndFuse segment is dispatched first, and first calls still
compiling on worker threads (``eager.async_compile``) are waited for.  Errors that the device
reported meanwhile (device-side checks: an out-of-range index) are raised here.
"""

from __future__ import annotations

from torchtpu import _metrics
from torchtpu._device import runtime
from torchtpu.eager import async_compile, defer, host_reads, inflight


def synchronize() -> None:
    """Wait for every op queued so far on every ``tpu`` device (a host sync, counted in
    ``torchtpu.metrics()["host_syncs"]`` under ``"synchronize"``).

    Raises:
        RuntimeError: a device-side check of an op dispatched earlier failed
            (``host_reads.check_pending``).
    """
    if defer.pending_ops():
        defer.flush("synchronize")
    else:
        _metrics.METRICS.sync("synchronize")
    async_compile.settle_all()  # first calls compiling on workers: their runs finished
    runtime.jax().block_until_ready(inflight.last_outputs())
    host_reads.check_pending()
