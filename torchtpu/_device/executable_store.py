"""Compiled XLA executables stored on disk under torchtpu's own keys.

JAX's persistent cache (:mod:`torchtpu._device.persistent_cache`) keys an executable by
its StableHLO, so a process must still trace and lower a function before it can find the
stored executable: about 20 ms of the ~27 ms a per-op executable costs a warm process on
the CPU platform (jax 0.10.2).  Callers that can name what they compile with a stable key
of their own (the eager executor's op signature, a compiled graph's identity and input
layout) store the executable here under that key and load it next time without tracing,
with ``jax.experimental.serialize_executable``.

What else decides an executable goes into every key here: :func:`source_version` (a hash
of all torchtpu sources, PyTorch's and JAX's versions) and :func:`environment` (JAX's
64-bit mode, ``XLA_FLAGS``, the ``TORCHTPU_*`` variables that change programs, the
device's platform and kind).

Not storable: an executable that JAX loaded from its own persistent cache (XLA:CPU cannot
serialize such an executable again: the copy misses its functions; callers compile what
they store inside ``persistent_cache.bypassed()``) and executables with host callbacks or
effects (callers fall back to JAX's cache for those).
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile

import torch


@functools.lru_cache(maxsize=None)
def source_version() -> str:
    """Hash (16 hex digits) of every torchtpu source file (the lowering table decides the
    executables) and PyTorch's and JAX's versions."""
    import jax

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    h.update(f"{torch.__version__} {jax.__version__}".encode())
    for d, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".py"):
                h.update(f.encode())
                try:
                    with open(os.path.join(d, f), "rb") as fh:
                        h.update(fh.read())
                except OSError:
                    pass
    return h.hexdigest()[:16]


# torchtpu's environment variables that change what a lowering emits (any new one must be
# listed here); the others (cache directories, modes, file paths) do not enter the keys,
# or a run that names a temporary file would never find its executables again.
PROGRAM_VARIABLES = ("TORCHTPU_SDPA_BLOCK_Q", "TORCHTPU_SDPA_BLOCK_K",
                     "TORCHTPU_ELEMENTWISE_OPTIONS")


@functools.lru_cache(maxsize=None)
def environment(index: int) -> str:
    """What else decides an executable for ``tpu:index``: JAX's 64-bit mode,
    ``XLA_FLAGS``, :data:`PROGRAM_VARIABLES`, the device's platform and kind (read once
    per process)."""
    import jax

    from torchtpu._device import runtime

    dev = runtime.jax_device(index)
    env = [(k, os.environ.get(k)) for k in PROGRAM_VARIABLES]
    return repr((bool(jax.config.jax_enable_x64), os.environ.get("XLA_FLAGS"), env,
                 dev.platform, getattr(dev, "device_kind", "")))


def key_path(directory: str, *parts: str) -> str:
    """The file under ``directory`` for the key made of ``parts`` (strings) with the
    source version: a 40-digit hash, so any change of a part is a different file."""
    h = hashlib.sha256(source_version().encode())
    for p in parts:
        h.update(b"\0")
        h.update(p.encode())
    return os.path.join(directory, h.hexdigest()[:40])


def storable(compiled) -> bool:
    """Whether ``compiled`` (a JAX ``Compiled``) can be serialized for another process:
    it has no host callbacks or effects."""
    unloaded = getattr(getattr(compiled, "_executable", None), "_unloaded_executable", None)
    return unloaded is not None and not (
        getattr(unloaded, "host_callbacks", None) or getattr(unloaded, "ordered_effects", None)
        or getattr(unloaded, "unordered_effects", None))


def save(path: str, compiled, extra) -> bool:
    """Store ``compiled`` (a JAX ``Compiled`` that XLA compiled in this process) with the
    picklable ``extra`` at ``path``, atomically (write, then rename).  Returns whether it
    was stored; never raises (the store is an optimization)."""
    tmp = None
    try:
        if not storable(compiled):
            return False
        from jax.experimental import serialize_executable as se

        data = pickle.dumps({"exe": se.serialize(compiled), "extra": extra},
                            protocol=pickle.HIGHEST_PROTOCOL)
        d = os.path.dirname(path)
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except Exception:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


@functools.lru_cache(maxsize=None)
def _link_custom_call_libraries() -> None:
    """Make the native libraries behind JAX's CPU custom calls ready before an
    executable is loaded without being lowered in this process.  JAX fills in its LAPACK
    function pointers (``getrf``, ``trsm``, ``potrf``...) only when it *lowers* a linear
    algebra op (``jaxlib.lapack.prepare_lapack_call``); an executable loaded from disk in
    a process that never lowered one called a null pointer: a segmentation fault in
    ``linalg.inv``, ``solve``, ``cholesky``... of a warm process (JAX's own persistent
    cache is safe: it lowers before it looks up).  Cheap, once per process; any failure
    leaves things as they were."""
    try:
        from jax._src.lax import linalg as _linalg

        _linalg.initialize_lapack()
    except Exception:  # noqa: BLE001 (another JAX: nothing to prepare)
        pass


def load(path: str, index: int):
    """``(compiled, extra)`` stored at ``path`` for ``tpu:index``, or None (missing,
    unreadable, or built for another JAX / device); never raises."""
    try:
        with open(path, "rb") as f:
            rec = pickle.load(f)
        from jax.experimental import serialize_executable as se

        _link_custom_call_libraries()

        from torchtpu._device import runtime

        compiled = se.deserialize_and_load(*rec["exe"],
                                           execution_devices=[runtime.jax_device(index)])
    except Exception:
        return None
    return compiled, rec["extra"]
