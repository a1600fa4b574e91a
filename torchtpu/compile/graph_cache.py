"""On-disk cache of AOTAutograd's traced graphs for the ``"tpu"`` backend.

A fresh process with a filled persistent cache used to skip only XLA's compile: Dynamo,
AOTAutograd (functionalization, the joint graph's trace, the min-cut partitioner) and our
lowering ran again.  This module lets PyTorch's own ``AOTAutogradCache`` (the cache that
serves Inductor, ``torch._functorch._aot_autograd.autograd_cache``) store the result of
AOTAutograd for our graphs too, in its "bundled" form: the cache entry holds AOTAutograd's
runtime metadata and wrappers plus our compiled forward / backward as
:class:`TpuOutputCode` objects, which serialize their ATen FX graph (with the fake-tensor
metadata our lowering reads) through ``torch.fx._graph_pickler.GraphPickler``.  A second
process whose Dynamo graph has the same cache key (PyTorch's hash of the graph, its
inputs' metadata, the AOT config and the PyTorch version) loads the entry and builds the
:class:`~torchtpu.compile.graph.GraphExecutable` from the stored graph: no AOTAutograd
trace, no partitioner.  Its executables then come from JAX's persistent cache.

Where: ``<persistent cache directory>/torchtpu-graphs/<version>/aotautograd/...``, where
``<version>`` hashes the torchtpu sources that decide the traced graph (the decomposition
set, this package) so an entry from other torchtpu code is never reused.  Off when the
persistent cache is off (``TORCHTPU_CACHE_DIR=off``), when PyTorch's caches are disabled
(``torch.compiler.config.force_disable_caches``, ``TORCHINDUCTOR_AUTOGRAD_CACHE=0``), for
graphs with symbolic shapes (``dynamic=True``) and while graphs are dumped
(``TORCHTPU_DUMP_DIR``).  A graph PyTorch cannot hash (``BypassAOTAutogradCache``:
an unknown callable in it...) is traced as before.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os

import torch

from torchtpu import _metrics

M = _metrics.METRICS

try:  # PyTorch's base class of a backend's cacheable compiled graph
    from torch._inductor.output_code import OutputCode as _OutputCode
except Exception:  # pragma: no cover - another PyTorch: no cache
    _OutputCode = object


class TpuOutputCode(_OutputCode):
    """A compiled ATen graph as AOTAutograd's cache stores it: called like the
    :class:`~torchtpu.compile.graph.GraphExecutable` it holds (boxed: one list of
    inputs); serialized as its FX graph (``GraphPickler``, node metadata included) and
    rebuilt after loading (``post_compile``)."""

    _boxed_call = True

    def __init__(self, ex, kind: str):
        super().__init__()
        self._boxed_call = True  # an instance attribute: functools.wraps copies it
        self.ex = ex
        self.kind = kind
        self._graph_bytes = None

    def __call__(self, args):
        return self.ex(args)

    def prepare_for_serialization(self) -> None:
        """Called by AOTAutogradCache on a copy before pickling: the graph as bytes."""
        from torch.fx._graph_pickler import GraphPickler, Options

        if self.ex is None:
            return
        gm = self.ex.gm
        # constant tensors on tpu (get_attr nodes: a torch.tensor(...) in the model) are
        # stored as CPU copies and moved back after loading; each node's fake value is
        # stored as its geometry (what the lowering reads), rebuilt as a FakeTensor
        saved, metas, self._device_consts = {}, {}, {}
        try:
            with torch.utils._python_dispatch._disable_current_modes():
                for n in gm.graph.nodes:
                    metas[n] = n.meta
                    n.meta = {"tpu_val": _describe(n.meta.get("val"))}
                    if n.op != "get_attr" or n.target in saved:
                        continue
                    t = _getattr(gm, n.target)
                    if isinstance(t, torch.Tensor) and t.device.type != "cpu":
                        saved[n.target] = t
                        self._device_consts[n.target] = str(t.device)
                        _setattr(gm, n.target, t.detach().to("cpu"))
            self._graph_bytes = GraphPickler.dumps(
                gm, options=Options(ops_filter=None, node_metadata_key_filter=None))
        finally:
            for n, m in metas.items():
                n.meta = m
            for name, t in saved.items():
                _setattr(gm, name, t)
        self.ex = None

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        """Called after a cache hit: rebuild the executable from the stored graph, with
        fake tensors in the fake mode of ``example_inputs``."""
        if self.ex is not None:
            return
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler

        from torchtpu.compile.backend import _ids
        from torchtpu.compile.graph import GraphExecutable
        from torchtpu.ops import nn

        nn.register_private_lowerings()

        fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode()
        gm = GraphPickler.loads(self._graph_bytes, fake_mode)
        with torch.utils._python_dispatch._disable_current_modes():
            for n in gm.graph.nodes:
                n.meta["val"] = _build(n.meta.pop("tpu_val", None), fake_mode)
            for name, dev in (getattr(self, "_device_consts", None) or {}).items():
                _setattr(gm, name, _getattr(gm, name).to(dev))
        gm.recompile()
        self.ex = GraphExecutable(gm, f"{self.kind}{next(_ids)}")
        self._graph_bytes = None
        M.compile["graphs_compiled"] += 1
        M.compile["graph_cache_hits"] += 1

    def set_triton_bundle(self, triton_bundle) -> None:
        pass

    @property
    def graph_executable(self):
        return self.ex


def _describe(v):
    """A node's fake value as plain data: tensors as their geometry, lists / tuples of
    them, numbers as themselves.  Raises ``BypassAOTAutogradCache`` for anything else
    (a symbolic size...): the graph is then not stored."""
    if isinstance(v, torch.Tensor):
        geo = (tuple(v.shape), tuple(v.stride()), v.storage_offset())
        if not all(isinstance(d, int) for d in geo[0] + geo[1] + (geo[2],)) or \
                v.is_neg() or v.is_conj() or v.layout is not torch.strided:
            raise _bypass(f"a graph value {v.layout} of sizes {v.shape}")
        return ("t",) + geo + (v.dtype, str(v.device), bool(v.requires_grad))
    if isinstance(v, (list, tuple)):
        return ("l" if isinstance(v, list) else "u", [_describe(x) for x in v])
    if v is None or type(v) in (bool, int, float, complex):
        return ("v", v)
    raise _bypass(f"a graph value of type {type(v).__name__}")


def _bypass(why: str):
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

    return BypassAOTAutogradCache(f"torchtpu: {why}")


def _build(d, fake_mode):
    """The FakeTensor (or list, tuple, number) that :func:`_describe` described."""
    if d is None:
        return None
    k = d[0]
    if k == "t":
        from torch._subclasses.fake_tensor import FakeTensor

        _, shape, stride, offset, dtype, device, rg = d
        elem = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        if offset:
            elem = elem.as_strided(shape, stride, offset)
        t = FakeTensor(fake_mode, elem, torch.device(device))
        if rg:
            t.requires_grad_(True)
        return t
    if k in ("l", "u"):
        xs = [_build(x, fake_mode) for x in d[1]]
        return xs if k == "l" else tuple(xs)
    return d[1]


def _getattr(mod, target: str):
    for part in target.split("."):
        mod = getattr(mod, part)
    return mod


def _setattr(mod, target: str, value) -> None:
    *path, last = target.split(".")
    for part in path:
        mod = getattr(mod, part)
    if isinstance(value, torch.Tensor) and last in getattr(mod, "_buffers", {}):
        mod._buffers[last] = value
    else:
        setattr(mod, last, value)


@functools.lru_cache(maxsize=None)
def version() -> str:
    """Hash of what decides the traced graphs: the decomposition set's ops, the ops with
    a lowering, and the sources of ``torchtpu.compile`` and the decomposition overrides."""
    from torchtpu import ops
    from torchtpu.compile.backend import decompositions

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


def usable(example_inputs) -> bool:
    """Whether a Dynamo graph with these example inputs may use the cache (static
    shapes only)."""
    if _OutputCode is object:
        return False
    for x in example_inputs:
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return False
        if isinstance(x, torch.Tensor) and any(
                not isinstance(d, int) for d in tuple(x.shape) + tuple(x.stride())):
            return False
    return True


@contextlib.contextmanager
def active(path: str):
    """While AOTAutograd runs for our graph: PyTorch's AOTAutogradCache reads and writes
    under ``path`` (it finds its directory through ``TORCHINDUCTOR_CACHE_DIR``), stores
    bundled entries (our :class:`TpuOutputCode` inside), and the backward is compiled
    with the forward (so that its entry is written here, not at the first backward)."""
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    try:
        with torch._functorch.config.patch(bundled_autograd_cache=True,
                                           force_non_lazy_backward_lowering=True), \
                torch._inductor.config.patch(fx_graph_cache=True):
            yield
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
