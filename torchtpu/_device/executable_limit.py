"""How many compiled executables one process keeps loaded.

Every XLA executable loaded on the CPU PJRT platform maps its machine code into the
process: about ten memory mappings each (measured: 3,578 per-op executables, 34,725
mappings).  Linux refuses mappings past ``vm.max_map_count`` (65,530 by default), and
XLA then crashes the process (a segmentation fault in the next executable it loads).  A
program that meets thousands of shapes (PyTorch's device-generic test files, a shape
sweep) got there.  So each executable cache here is least-recently-used and bounded:
an evicted signature that comes back is loaded again from the on-disk caches
(``eager.signature_cache``, JAX's persistent cache) or compiled again.

``TORCHTPU_MAX_EXECUTABLES`` sets the bound of the per-op cache (default 2048); the
DeferAndFuse segment cache keeps a quarter of it.  Evictions are counted in
``torchtpu.metrics()["executable_evictions"]``.
"""

from __future__ import annotations

import os
from collections import OrderedDict

from torchtpu import _metrics

M = _metrics.METRICS


def _limit_from_env() -> int:
    raw = os.environ.get("TORCHTPU_MAX_EXECUTABLES", "").strip() or "2048"
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"TORCHTPU_MAX_EXECUTABLES must be an integer, got {raw!r}") from None
    if n < 1:
        raise ValueError(f"TORCHTPU_MAX_EXECUTABLES must be at least 1, got {n}")
    return n


MAX_EXECUTABLES = _limit_from_env()


class LRUCache(OrderedDict):
    """A dict of executables bounded to ``limit()`` entries, least recently used first.

    The hot path stays two C calls: ``v = cache.get(key)`` then, on a hit,
    ``cache.move_to_end(key)``; :meth:`put` inserts and evicts the least recently used
    entries past the bound (their executables are freed once nothing else holds them).
    """

    def __init__(self, share: float = 1.0):
        super().__init__()
        self.share = share
        # ``on_drop(values)`` is called with the evicted values after an eviction, and
        # with None after the cache was cleared (tables that point at these executables
        # forget them: eager.hotpath)
        self.on_drop = None

    def clear(self):
        super().clear()
        if self.on_drop is not None:
            self.on_drop(None)

    def limit(self) -> int:
        """The bound: ``share`` of ``MAX_EXECUTABLES``, at least 1."""
        return max(1, int(MAX_EXECUTABLES * self.share))

    def put(self, key, value):
        """Insert ``value`` under ``key``; evict past the bound; return ``value``."""
        self[key] = value
        if len(self) > MAX_EXECUTABLES * self.share:
            limit = self.limit()
            dropped = []
            while len(self) > limit:
                dropped.append(self.popitem(last=False)[1])
                M.executable_evictions += 1
            if self.on_drop is not None:
                self.on_drop(dropped)
        return value
