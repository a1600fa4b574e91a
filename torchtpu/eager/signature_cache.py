"""On-disk cache of the eager per-op executables, keyed by op signature.

The executor keys each per-op executable by its signature (the op, every argument's
geometry and dtype, the static arguments, the default dtype: ``keying.gather``).  A
fresh process used to trace and lower each signature again before JAX's persistent cache
could find the stored executable by its StableHLO.  Here the executable is stored under
its signature (plus :mod:`torchtpu._device.executable_store`'s source version and
environment), so a later process loads it without tracing: a warm per-op executable costs
about 5 ms instead of ~27 ms on the CPU platform.

A signature missing here is compiled with JAX's persistent cache bypassed
(``persistent_cache.bypassed``), since an executable JAX loaded from its cache cannot be
serialized again on XLA:CPU: after a torchtpu source change the first process compiles
each signature afresh and stores it.

Both compile tiers (:mod:`torchtpu.eager.tiers`) are stored; the full tier replaces a
quick one.  With the quick tier switched on, a stored quick executable is used and
recompiled at the full tier on its second call as usual; with it off, only a full one is
used.  Stored with each executable: its device-side checks (exception type and message),
which the executor otherwise learns while tracing.

Where: ``<persistent cache directory>/torchtpu-signatures/``; off with the persistent
cache (``TORCHTPU_CACHE_DIR=off``) and with ``TORCHTPU_SIGNATURE_CACHE=0``.  Signatures
whose description is not stable across processes (an object printed with its address)
are not stored.  DeferAndFuse segments and ``torch.compile`` graphs have their own
paths (JAX's persistent cache; ``torchtpu.compile.graph_cache``).

Counters in ``torchtpu.metrics()["signature_cache"]``: ``hits`` (executables loaded
instead of traced and compiled), ``stores`` and ``load_seconds``.
"""

from __future__ import annotations

import os
import time

from torchtpu import _metrics
from torchtpu._device import executable_store, persistent_cache, runtime

M = _metrics.METRICS

_enabled = os.environ.get("TORCHTPU_SIGNATURE_CACHE", "1").strip().lower() not in (
    "0", "off", "false", "no")
_enabled_at_start = _enabled
_dir = False  # not looked up yet


def directory() -> str | None:
    """The cache directory, or None when the cache is off."""
    global _dir
    if not _enabled:
        return None
    if _dir is False:
        runtime.jax()  # configures the persistent cache
        base = persistent_cache.directory()
        _dir = os.path.join(base, persistent_cache.SIGNATURE_DIR) if base else None
    return _dir


def set_enabled(enabled: bool) -> None:
    """Switch the cache on or off for signatures compiled from now on
    (``TORCHTPU_SIGNATURE_CACHE`` sets the start-up value)."""
    global _enabled, _dir
    _enabled = bool(enabled)
    _dir = False


class Entry:
    """The stored executables of one signature: ``path(tier)`` names the file of each
    tier ("quick", "full")."""

    __slots__ = ("base", "index")

    def __init__(self, base: str, index: int):
        self.base = base
        self.index = index

    def path(self, tier: str) -> str:
        return f"{self.base}.{tier}"

    def stored(self, tier: str) -> bool:
        """Whether an earlier process stored ``tier`` (without reading it)."""
        return os.path.exists(self.path(tier))

    def load(self, tier: str):
        """``(compiled, check_info)`` of ``tier``, or None."""
        t0 = time.perf_counter()
        rec = executable_store.load(self.path(tier), self.index)
        if rec is None:
            return None
        M.signature_cache["hits"] += 1
        M.signature_cache["load_seconds"] += time.perf_counter() - t0
        return rec

    def save(self, tier: str, compiled, check_info, pc_hits_before: int) -> None:
        """Store ``compiled`` unless JAX loaded it from its own persistent cache (its
        hit counter moved since ``pc_hits_before``): such an executable cannot be
        serialized again on XLA:CPU."""
        if M.persistent_cache["hits"] != pc_hits_before:
            return
        if executable_store.save(self.path(tier), compiled, list(check_info)):
            M.signature_cache["stores"] += 1


def entry(key, index: int) -> Entry | None:
    """The cache entry of the executor signature ``key`` on ``tpu:index``, or None (cache
    off, or a key whose description is not stable across processes)."""
    base = directory()
    if base is None:
        return None
    desc = repr(key)
    if " at 0x" in desc:
        return None
    return Entry(executable_store.key_path(base, desc, executable_store.environment(index)),
                 index)
