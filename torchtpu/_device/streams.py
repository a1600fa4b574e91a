"""``torch.tpu.Stream`` / ``Event``: enough of CUDA's stream API for code written for it.

PJRT runs a device's work in dispatch order, so every ``tpu`` stream is the one PJRT
queue of its device: ``wait_stream``/``wait_event`` need no device work, and
``synchronize``/``query`` wait for (or check) every op dispatched so far.
"""

from __future__ import annotations

import itertools
import time

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
        self.synchronize()
        return True

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


class Event:
    """A ``tpu`` event (``torch.cuda.Event``); timing is host wall time at ``record``
    after the device queue drained (so ``elapsed_time`` is in milliseconds, as CUDA's)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._t = None
        self._stream = None

    def record(self, stream=None) -> None:
        self._stream = stream or current_stream()
        if self.enable_timing:
            self._stream.synchronize()
        self._t = time.perf_counter()

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def elapsed_time(self, end_event) -> float:
        """Milliseconds between this event's and ``end_event``'s ``record``."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        end_event.synchronize()
        return (end_event._t - self._t) * 1000.0
