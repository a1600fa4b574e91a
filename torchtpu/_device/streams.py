"""``torch.tpu.Stream`` / ``Event``: enough of CUDA's stream API for code written for it.

PJRT runs a device's work in dispatch order, so every ``tpu`` stream is the one PJRT
queue of its device: ``wait_stream``/``wait_event`` need no device work, and
``synchronize``/``query`` wait for (or check) every op dispatched so far.

How ``query`` knows: the results of the most recently dispatched executable
(``eager.inflight.LAST_OUTPUTS``, what ``torch.tpu.synchronize`` waits on) are ready only once
everything dispatched before them has run too.  ``Event.record`` keeps (weak references
to) those arrays; ``Event.query`` / ``Stream.query`` ask them ``is_ready()``, which never
blocks.  In DEFER_AND_FUSE, ops recorded but not run yet are first dispatched (the pending
segment is cut, asynchronously: ``metrics()["segment_cuts"]`` under ``"event_record"`` /
``"stream_query"``), so that the event stands for them.
"""

from __future__ import annotations

import itertools
import time
import weakref

import torch

from torchtpu._device import state


_ids = itertools.count()


class Stream:
    """A ``tpu`` stream (``torch.cuda.Stream``); ``device`` is a tpu device or index."""

    # c10's DeviceType number of PrivateUse1 (``torch.Stream(device="tpu").device_type``)
    device_type = 20

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device_index = state.to_index(device)
        self.priority = priority
        self._prev = []
        # ``torch.Stream.stream_id``: a number of its own per stream (torch 2.15's FSDP2
        # passes it to ``fsdp.record_grad_output_stream``); every tpu stream is the one
        # PJRT queue of its device, so nothing else reads it
        self.stream_id = next(_ids)

    @property
    def device(self) -> torch.device:
        return torch.device("tpu", self.device_index)

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        """Whether every op dispatched so far has finished (never blocks)."""
        _dispatch_pending("stream_query")
        return _all_ready(_last_outputs())

    def synchronize(self) -> None:
        from torchtpu.eager import sync

        sync.synchronize()

    def __enter__(self):
        self._prev.append(_current.get(self.device_index))
        _current[self.device_index] = self
        return self

    def __exit__(self, *exc):
        _current[self.device_index] = self._prev.pop()
        return False

    def __eq__(self, other):
        return isinstance(other, Stream) and other is self

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"<torch.tpu.Stream device=tpu:{self.device_index} priority={self.priority}>"


_current: dict = {}
_default: dict = {}


def default_stream(device=None) -> Stream:
    i = state.to_index(device)
    if i not in _default:
        _default[i] = Stream(i)
    return _default[i]


def current_stream(device=None) -> Stream:
    i = state.to_index(device)
    return _current.get(i) or default_stream(i)


class stream:
    """Context manager selecting a stream (``torch.cuda.stream``); ``None`` is a no-op."""

    def __init__(self, s):
        self.s = s

    def __enter__(self):
        if self.s is not None:
            self.s.__enter__()
        return self.s

    def __exit__(self, *exc):
        if self.s is not None:
            self.s.__exit__(*exc)
        return False


def _dispatch_pending(cause: str) -> None:
    """DEFER_AND_FUSE: run the ops recorded so far (asynchronously, no host sync)."""
    from torchtpu.eager import defer

    if defer.pending_ops():
        defer.flush(cause, sync=False)


def _last_outputs() -> list:
    """The arrays of the most recently dispatched executable, and the pending results
    (``storage.Lazy``) of first calls still compiling or running on worker threads
    (``eager.async_compile``): work dispatched before now, in no particular order."""
    from torchtpu._tensor import storage
    from torchtpu.eager import async_compile, inflight

    out = []
    for a in list(inflight.LAST_OUTPUTS) + async_compile.unfinished_results():
        if a.__class__ is storage.Lazy and a.value is not None:
            a = a.value
        if a.__class__ is storage.Lazy or hasattr(a, "is_ready"):
            out.append(a)
    return out


def _all_ready(arrays, deleted_means_later=True) -> bool:
    """Whether every array in ``arrays`` is computed (a pending first call's result: once
    its job has finished).  An array since deleted (donated to
    a later executable, which only runs after it) cannot be asked; then the latest
    dispatched work is asked instead: it being done implies this work is."""
    from torchtpu._tensor import storage

    for a in arrays:
        if a.__class__ is storage.Lazy:
            if a.value is None or (a.node is storage.ASYNC and not a.seg.done):
                return False
            a = a.value
        if a.is_deleted():  # (is_ready() on a deleted array must not be called)
            if deleted_means_later:
                return _all_ready(_last_outputs(), deleted_means_later=False)
            continue
        if not a.is_ready():
            return False
    return True


class Event:
    """A ``tpu`` event (``torch.cuda.Event``).

    ``record`` marks the work dispatched so far; ``query`` says, without blocking, whether
    that work has finished (its last executable's results are ready, see the module
    docstring); ``synchronize`` waits for it.  Timing is host wall time at ``record`` after
    the device queue drained (so ``elapsed_time`` is in milliseconds, as CUDA's)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._t = None
        self._stream = None
        self._refs = []  # weak references to the recorded work's arrays
        self._lost = False  # one of them died before query() saw it ready

    def record(self, stream=None) -> None:
        self._stream = stream or current_stream()
        _dispatch_pending("event_record")
        # weak references: an event must not keep the arrays alive (that would stop the
        # next in-place op from donating their buffers to XLA)
        self._refs = [weakref.ref(a) for a in _last_outputs()]
        self._lost = False
        if self.enable_timing:
            self._stream.synchronize()
        self._t = time.perf_counter()

    def wait(self, stream=None) -> None:
        pass

    def _arrays(self):
        """The recorded arrays still alive; None when one died unseen (its buffer freed:
        whether its computation finished cannot be asked any more)."""
        out = []
        for r in self._refs:
            a = r()
            if a is None:
                return None
            out.append(a)
        return out

    def query(self) -> bool:
        """Whether the work dispatched before :meth:`record` has finished (True for an
        event never recorded, as CUDA's); never blocks."""
        if self._lost:
            return _all_ready(_last_outputs())
        arrays = self._arrays()
        if arrays is None:  # the latest work being done implies the recorded work is
            self._lost = True
            return _all_ready(_last_outputs())
        if _all_ready(arrays):
            self._refs = []  # done: nothing more to hold or ask
            return True
        return False

    def synchronize(self) -> None:
        """Wait until the work dispatched before :meth:`record` has finished (waits for
        the stream: every op dispatched so far, a sync point)."""
        if self._stream is not None:
            self._stream.synchronize()

    def elapsed_time(self, end_event) -> float:
        """Milliseconds between this event's and ``end_event``'s ``record``."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        end_event.synchronize()
        return (end_event._t - self._t) * 1000.0
