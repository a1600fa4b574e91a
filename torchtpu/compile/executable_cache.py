"""On-disk cache of compiled graphs' XLA executables, and the graph cache's directory.

A :class:`~torchtpu.compile.graph.GraphExecutable`'s executables (one per input layout)
are stored with the output plan of their trace, keyed by the graph (code, node geometry,
constants), the input layout and a hash of all torchtpu sources, JAX's and PyTorch's
versions, 64-bit mode, ``XLA_FLAGS`` and the device: a second process loads them
(``jax.experimental.serialize_executable``) instead of tracing the graph through the
lowering table and lowering it to StableHLO.  Such executables are compiled with JAX's
persistent cache bypassed (XLA:CPU cannot serialize an executable JAX loaded from it
again: the copy misses its functions).  Not stored: executables with host callbacks or
effects; those graphs are lowered again and their executables come from JAX's
persistent cache.  The AOTAutograd half of the cache (the
traced graphs themselves) is :mod:`torchtpu.compile.graph_cache`; both live under
:func:`directory`.
"""

from __future__ import annotations

import functools
import hashlib
import os

import torch

from torchtpu import _metrics
from torchtpu._device import executable_store

M = _metrics.METRICS


@functools.lru_cache(maxsize=None)
def version() -> str:
    """Hash of what decides the traced graphs: the decomposition set's ops, the ops with
    a lowering, and the sources of ``torchtpu.compile`` and the decomposition overrides."""
    from torchtpu import ops
    from torchtpu.compile.decompositions import decompositions

    h = hashlib.sha256()
    h.update(torch.__version__.encode())
    h.update(",".join(sorted(str(op) for op in decompositions())).encode())
    h.update(",".join(sorted(str(op) for op in ops.table())).encode())
    here = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(here, f) for f in sorted(os.listdir(here)) if f.endswith(".py")]
    files.append(os.path.join(os.path.dirname(here), "ops", "decomp_overrides.py"))
    for f in files:
        try:
            with open(f, "rb") as fh:
                h.update(fh.read())
        except OSError:
            pass
    return h.hexdigest()[:16]


def directory() -> str | None:
    """The graph cache directory, or None when the cache is off."""
    from torchtpu._device import persistent_cache, runtime

    if os.environ.get("TORCHTPU_GRAPH_CACHE", "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    runtime.jax()  # configures the persistent cache
    base = persistent_cache.directory()
    if base is None:
        return None
    try:
        if torch.compiler.config.force_disable_caches or \
                not torch._functorch.config.enable_autograd_cache:
            return None
    except AttributeError:
        return None
    return os.path.join(base, "torchtpu-graphs", version())


def _describe(v):
    """A node's fake value as plain data: tensors as their geometry and storage size, lists / tuples of
    them, numbers as themselves.  Raises ``BypassAOTAutogradCache`` for anything else
    (a symbolic size...): the graph is then not stored."""
    if isinstance(v, torch.Tensor):
        geo = (tuple(v.shape), tuple(v.stride()), v.storage_offset())
        if not all(isinstance(d, int) for d in geo[0] + geo[1] + (geo[2],)) or \
                v.is_neg() or v.is_conj() or v.layout is not torch.strided:
            raise _bypass(f"a graph value {v.layout} of sizes {v.shape}")
        try:  # the storage's size: results that PyTorch lays out inside a larger storage
            nbytes = int(v.untyped_storage().nbytes())  # (graph.new_storage reads it)
        except Exception:  # noqa: BLE001
            raise _bypass(f"a graph value of sizes {v.shape} without a storage size")
        return ("t",) + geo + (v.dtype, str(v.device), bool(v.requires_grad), nbytes)
    if isinstance(v, (list, tuple)):
        return ("l" if isinstance(v, list) else "u", [_describe(x) for x in v])
    if v is None or type(v) in (bool, int, float, complex):
        return ("v", v)
    raise _bypass(f"a graph value of type {type(v).__name__}")


def _bypass(why: str):
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

    return BypassAOTAutogradCache(f"torchtpu: {why}")


def _getattr(mod, target: str):
    for part in target.split("."):
        mod = getattr(mod, part)
    return mod


# A GraphExecutable's executables (one per input layout) are stored too: a second process
# loads the compiled XLA executable (``jax.experimental.serialize_executable``) and the
# trace's output plan instead of tracing the graph through the lowering table again.


def _graph_identity(ex) -> str:
    """Hash of a GraphExecutable's graph: its code, every node's fake value geometry and
    its constant tensors' values (computed once per graph)."""
    ident = getattr(ex, "_identity", None)
    if ident is None:
        h = hashlib.sha256()
        h.update(ex.gm.code.encode())
        for n in ex.nodes:
            h.update(repr((n.name, _describe(n.meta.get("val")))).encode())
        with torch.utils._python_dispatch._disable_current_modes():
            for n in ex.get_attrs:
                t = _getattr(ex.gm, n.target)
                if isinstance(t, torch.Tensor):
                    h.update(repr((t.dtype, tuple(t.shape), str(t.device))).encode())
                    h.update(t.detach().to("cpu").contiguous().numpy().tobytes())
                else:
                    h.update(repr(t).encode())
        ident = ex._identity = h.hexdigest()
    return ident


def executable_path(ex, key, donate) -> str | None:
    """The file of ``ex``'s executable for input layout ``key`` and donated slots
    ``donate``; None when the cache is off or the graph cannot be identified."""
    try:
        base = directory()
        if base is None:
            return None
        index = key[-1] if isinstance(key[-1], int) else 0
        return executable_store.key_path(
            os.path.join(base, "executables"), _graph_identity(ex),
            repr((key, tuple(donate))), executable_store.environment(index))
    except Exception:  # a value without a stable description: not cached
        return None


def load_executable(path: str, index: int):
    """``(compiled, result, donated slots)`` stored at ``path``, or None (missing,
    unreadable, or built for another JAX / device)."""
    rec = executable_store.load(path, index)
    if rec is None:
        return None
    M.compile["executable_cache_hits"] += 1
    compiled, (result, donate) = rec
    return compiled, result, donate


def save_executable(path: str, compiled, result, donate) -> None:
    """Store ``compiled`` (a JAX ``Compiled`` that XLA compiled in this process, not one
    loaded from JAX's persistent cache: see ``GraphExecutable._compile``) and the
    trace's ``result`` at ``path`` (:func:`torchtpu._device.executable_store.save`:
    atomic, errors ignored, executables with host callbacks or effects not stored)."""
    executable_store.save(path, compiled, (result, tuple(donate)))
