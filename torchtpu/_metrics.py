"""Counters for every cache and every sync point (read with ``torchtpu.metrics()``)."""

from __future__ import annotations

import collections
import copy
import threading

_lock = threading.Lock()


class Metrics:
    """Process-wide counters.

    Attributes:
        ops_dispatched: ATen ops that reached the tpu backend.
        lowered_ops: ops run through a compiled per-op executable.
        decomposed_ops: ops run through a PyTorch decomposition.
        view_ops: view ops (metadata only, no device work).
        cache_hits / cache_misses: per-op executable cache lookups.
        compiles: XLA compilations; compile_seconds: wall time spent in them (seconds).
        host_syncs: Counter of host synchronizations by cause ("item", "to_cpu", ...).
        fallbacks: Counter of ops run on CPU through the opt-in CPU fallback, by op name.
        transfers_to_device_bytes / transfers_to_host_bytes: host<->device copies (bytes).
    """

    def __init__(self):
        self.reset()

    def reset(self):
        self.ops_dispatched = 0
        self.lowered_ops = 0
        self.decomposed_ops = 0
        self.view_ops = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.compiles = 0
        self.compile_seconds = 0.0
        self.host_syncs = collections.Counter()
        self.fallbacks = collections.Counter()
        self.transfers_to_device_bytes = 0
        self.transfers_to_host_bytes = 0

    def sync(self, cause: str):
        self.host_syncs[cause] += 1

    def snapshot(self) -> dict:
        with _lock:
            d = copy.deepcopy(self.__dict__)
        d["host_syncs"] = dict(d["host_syncs"])
        d["host_syncs_total"] = sum(d["host_syncs"].values())
        d["fallbacks"] = dict(d["fallbacks"])
        return d


METRICS = Metrics()


def metrics() -> dict:
    """A snapshot of torchtpu's counters as a plain dict (see :class:`Metrics`)."""
    return METRICS.snapshot()


def reset_metrics() -> None:
    """Zero every counter."""
    METRICS.reset()
