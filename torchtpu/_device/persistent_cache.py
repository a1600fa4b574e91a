"""JAX's persistent compilation cache, on by default, for every executable torchtpu compiles.

A second process skips XLA compilation for every signature an earlier process compiled:
the eager modes' per-op executables (both compile tiers), DeferAndFuse segments and
``torch.compile`` graphs all go through ``jax.jit``, whose executables JAX stores on disk
keyed by the StableHLO module, the compile options, the device kind and the jax/jaxlib
versions (so a stale entry is never reused after an upgrade).

Where (read once, when torchtpu first configures JAX):

* ``TORCHTPU_CACHE_DIR=<dir>``: the directory (created if missing).
* ``TORCHTPU_CACHE_DIR=off`` (or ``0``, ``false``, empty): no persistent cache.
* unset: ``$XDG_CACHE_HOME/torchtpu/xla``, else ``~/.cache/torchtpu/xla``.
* If the program set ``jax_compilation_cache_dir`` itself before torchtpu configured JAX,
  that setting is kept.

Every executable is stored however short its compile (JAX's default threshold of 1 s
would skip all per-op executables, whose compiles take 10-300 ms each); the directory is
capped at ``TORCHTPU_CACHE_MAX_BYTES`` (default 4 GiB), least recently used entries
evicted first (JAX's LRU cache).

Counters in ``torchtpu.metrics()["persistent_cache"]``: ``hits`` (executables loaded from
disk instead of compiled), ``misses`` (compiled, then stored) and ``load_seconds`` (time
spent loading the hits).  (JAX also reports a "compile time saved", but it stores compile
times in whole seconds, so for per-op executables it is always 0: not reported.)

Mirrors ``torch._inductor``'s on-by-default FX graph cache and JAX's
``jax_compilation_cache_dir``.
"""

from __future__ import annotations

import os

from torchtpu import _metrics

M = _metrics.METRICS

_OFF = ("off", "0", "false", "no", "")
_DEFAULT_MAX_BYTES = 4 << 30

_directory: str | None = None


def default_directory() -> str:
    """``$XDG_CACHE_HOME/torchtpu/xla`` or ``~/.cache/torchtpu/xla``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torchtpu", "xla")


def directory() -> str | None:
    """The persistent cache directory in use, or ``None`` when it is off."""
    return _directory


def configure(jax) -> None:
    """Point JAX's persistent compilation cache at torchtpu's directory (see the module
    docstring for the environment variables) and count its hits and misses.  Called once
    by ``runtime.jax()`` before anything is compiled; never raises (an unusable
    directory leaves the cache off, as JAX itself does)."""
    global _directory
    _listen(jax)
    if jax.config.jax_compilation_cache_dir:  # the program chose its own
        _directory = jax.config.jax_compilation_cache_dir
        return
    raw = os.environ.get("TORCHTPU_CACHE_DIR")
    if raw is not None and raw.strip().lower() in _OFF:
        return
    path = os.path.expanduser(raw) if raw else default_directory()
    try:
        os.makedirs(path, exist_ok=True)
        max_bytes = int(os.environ.get("TORCHTPU_CACHE_MAX_BYTES", _DEFAULT_MAX_BYTES))
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        jax.config.update("jax_compilation_cache_max_size", max_bytes)
    except (OSError, ValueError):
        return
    _directory = path


def _listen(jax) -> None:
    from jax import monitoring

    def on_event(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            M.persistent_cache["hits"] += 1
        elif event == "/jax/compilation_cache/cache_misses":
            M.persistent_cache["misses"] += 1

    def on_duration(event, seconds, **kwargs):
        if event == "/jax/compilation_cache/cache_retrieval_time_sec":
            M.persistent_cache["load_seconds"] += seconds

    monitoring.register_event_listener(on_event)
    monitoring.register_event_duration_secs_listener(on_duration)
