"""JAX's persistent compilation cache, on by default, for every executable torchtpu compiles.

A second process skips XLA compilation for every signature an earlier process compiled.
DeferAndFuse segments (and whatever else goes through ``jax.jit``) are stored by JAX on disk
keyed by the StableHLO module, the compile options, the device kind and the jax/jaxlib
versions (so a stale entry is never reused after an upgrade).  The eager per-op
executables (``eager.signature_cache``) and ``torch.compile`` graphs' executables
(``compile.graph_cache``) are stored in the same directory under torchtpu's own keys, and
compiled outside JAX's cache (:func:`bypassed`).

Where (read once, when torchtpu first configures JAX):

* ``TORCHTPU_CACHE_DIR=<dir>``: the directory (created if missing).
* ``TORCHTPU_CACHE_DIR=off`` (or ``0``, ``false``, empty): no persistent cache.
* unset: ``$XDG_CACHE_HOME/torchtpu/xla``, else ``~/.cache/torchtpu/xla``.
* If the program set ``jax_compilation_cache_dir`` itself before torchtpu configured JAX,
  that setting is kept.

Every executable is stored however short its compile (JAX's default threshold of 1 s
would skip all per-op executables, whose compiles take 10-300 ms each).  The directory is
capped at ``TORCHTPU_CACHE_MAX_BYTES`` (default 4 GiB): at most once an hour
(``_TRIM_INTERVAL_S``), a process that configures the cache starts a separate,
low-priority process (:mod:`torchtpu._device.cache_trim`) that checks the directory's
size and deletes the least recently used entries (by the file's access or modification
time, whichever is later) down to 80% of the cap.  JAX's own
size cap (``jax_compilation_cache_max_size``) is not used: it takes a lock shared by all
processes and scans the whole directory on every store, which at 30,000 entries (a day
of tests) cost 0.75 s per compiled executable, serialized across processes.  Without it
the cache is JAX's default one (no lock): a process reading an entry while another
writes it gets a warning from JAX and compiles instead.

Counters in ``torchtpu.metrics()["persistent_cache"]``: ``hits`` (executables loaded from
disk instead of compiled), ``misses`` (compiled, then stored) and ``load_seconds`` (time
spent loading the hits).  (JAX also reports a "compile time saved", but it stores compile
times in whole seconds, so for per-op executables it is always 0: not reported.)

Mirrors ``torch._inductor``'s on-by-default FX graph cache and JAX's
``jax_compilation_cache_dir``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from torchtpu import _metrics
from torchtpu._device import cache_trim as _cache_trim

M = _metrics.METRICS

_OFF = ("off", "0", "false", "no", "")
_DEFAULT_MAX_BYTES = 4 << 30
_TRIM_INTERVAL_S = 3600.0
_TRIM_STAMP = ".torchtpu-trimmed"
_trimmer = None  # the last trimming process started (kept referenced until it ends)

_directory: str | None = None
SIGNATURE_DIR = _cache_trim.SIGNATURE_DIR
trim = _cache_trim.trim


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
    except (OSError, ValueError):
        return
    _directory = path
    _start_trim(path, max_bytes)


def _start_trim(path: str, max_bytes: int) -> None:
    """Start :func:`trim` in a separate, low-priority process (``nice`` 19; it imports
    nothing of torchtpu) unless a process started one within the last
    ``_TRIM_INTERVAL_S`` seconds: the stamp file is claimed (its modification time set)
    before the trimmer starts, so processes starting together do not all scan.  Not a
    thread of this process: the scan of a large cache held the GIL for seconds against
    the user's own loop (see :mod:`torchtpu._device.cache_trim`).  Returns the trimming
    process (``subprocess.Popen``), or None when none was started."""
    global _trimmer
    stamp = os.path.join(path, _TRIM_STAMP)
    try:
        if time.time() - os.stat(stamp).st_mtime < _TRIM_INTERVAL_S:
            return None
    except OSError:
        pass
    if not sys.executable:  # an embedded interpreter with no executable to start
        return None
    try:
        with open(stamp, "w"):
            pass
        _trimmer = subprocess.Popen(
            [sys.executable, "-I", _cache_trim.__file__, path, str(int(max_bytes))],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=True, start_new_session=os.name == "posix")
    except OSError:
        return None
    return _trimmer


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
    # every executable built in the process, by kind (metrics()["xla"])
    monitoring.register_event_listener(_metrics.on_jax_event)
    monitoring.register_event_duration_secs_listener(_metrics.on_jax_duration)


@contextlib.contextmanager
def bypassed():
    """Within the block, JAX's persistent cache is neither read nor written: what is
    compiled there is compiled by XLA in this process.  Used where torchtpu stores the
    executable under its own key (``eager.signature_cache``): XLA:CPU cannot serialize an
    executable that JAX loaded from its cache (the copy misses its functions), so a
    signature whose StableHLO JAX already holds (after any torchtpu source change) would
    otherwise never be stored again.  Relies on JAX's private switch
    (``jax._src.compilation_cache._cache_used``, jax 0.10); where that is missing it
    bypasses nothing.  Not thread-safe: another thread compiling meanwhile skips the cache
    too (a slower compile, never a wrong one)."""
    try:
        from jax._src import compilation_cache as cc

        mutex = cc._cache_initialized_mutex
        with mutex:
            saved = (cc._cache_checked, cc._cache_used)
    except (ImportError, AttributeError):
        yield
        return
    if not saved[1] and saved[0]:  # no cache in use: nothing to bypass
        yield
        return
    with mutex:
        cc._cache_checked, cc._cache_used = True, False
    try:
        yield
    finally:
        with mutex:
            cc._cache_checked, cc._cache_used = saved
