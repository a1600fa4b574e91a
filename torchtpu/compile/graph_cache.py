"""On-disk cache of AOTAutograd's traced graphs for the ``"tpu"`` backend.

A fresh process with a filled persistent cache used to skip only XLA's compile: Dynamo,
AOTAutograd (functionalization, the joint graph's trace, the min-cut partitioner) and our
lowering ran again.  This module lets PyTorch's own ``AOTAutogradCache`` (the cache that
serves Inductor, ``torch._functorch._aot_autograd.autograd_cache``) store the result of
AOTAutograd for our graphs too, in its "bundled" form: the cache entry holds AOTAutograd's
runtime metadata and wrappers plus our compiled forward / backward as
:class:`TpuOutputCode` objects, which serialize their ATen FX graph (with the fake-tensor
metadata our lowering reads) as plain data (nodes in order, fake values as their geometry,
constant tensors as CPU copies).  A second
process whose Dynamo graph has the same cache key (PyTorch's hash of the graph, its
inputs' metadata, the AOT config and the PyTorch version) loads the entry and builds the
:class:`~torchtpu.compile.graph.GraphExecutable` from the stored graph: no AOTAutograd
trace, no partitioner.  Each GraphExecutable's XLA executables are stored beside the
graphs (:mod:`torchtpu.compile.executable_cache`).  Dynamo still traces the
Python code in every process (its guards are built from that trace).

Where: ``<persistent cache directory>/torchtpu-graphs/<version>/{aotautograd,executables}/``, where
``<version>`` hashes the torchtpu sources that decide the traced graph (the decomposition
set, this package) so an entry from other torchtpu code is never reused.  Off when the
persistent cache is off (``TORCHTPU_CACHE_DIR=off``), with ``TORCHTPU_GRAPH_CACHE=0``
(JAX's persistent cache alone then serves a second process), when PyTorch's caches are disabled
(``torch.compiler.config.force_disable_caches``, ``TORCHINDUCTOR_AUTOGRAD_CACHE=0``), for
graphs with symbolic shapes (``dynamic=True``) and while graphs are dumped
(``TORCHTPU_DUMP_DIR``).  A graph PyTorch cannot hash (``BypassAOTAutogradCache``:
an unknown callable in it...) is traced as before.
"""

from __future__ import annotations

import contextlib
import os

import torch

from torchtpu import _metrics
from torchtpu.compile.executable_cache import _bypass, _describe, _getattr

M = _metrics.METRICS

try:  # PyTorch's base class of a backend's cacheable compiled graph
    from torch._inductor.output_code import OutputCode as _OutputCode
except Exception:  # pragma: no cover - another PyTorch: no cache
    _OutputCode = object


class TpuOutputCode(_OutputCode):
    """A compiled ATen graph as AOTAutograd's cache stores it: called like the
    :class:`~torchtpu.compile.graph.GraphExecutable` it holds (boxed: one list of
    inputs); serialized as its FX graph (:func:`_graph_to_data`) and
    rebuilt after loading (``post_compile``)."""

    _boxed_call = True

    def __init__(self, ex, kind: str):
        super().__init__()
        self._boxed_call = True  # an instance attribute: functools.wraps copies it
        self.ex = ex
        self.kind = kind
        self._graph_data = None

    def __call__(self, args):
        return self.ex(args)

    def prepare_for_serialization(self) -> None:
        """Called by AOTAutogradCache on a copy before pickling: the graph as plain data
        (:func:`_graph_to_data`)."""
        if self.ex is None:
            return
        self._graph_data = _graph_to_data(self.ex.gm)
        self.ex = None

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        """Called after a cache hit: rebuild the executable from the stored graph, with
        fake tensors in the fake mode of ``example_inputs``.  (PyTorch's precompile loads
        this object with its executable already in it: counted as a hit too.)"""
        if self.ex is not None:
            M.compile["graphs_compiled"] += 1
            M.compile["graph_cache_hits"] += 1
            return
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import FakeTensorMode

        from torchtpu.compile.graph import graph_ids
        fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode()
        gm = _graph_from_data(self._graph_data, fake_mode)
        self.ex = deferred_executable(gm, f"{self.kind}{next(graph_ids)}", self.kind == "backward")
        self._graph_data = None
        M.compile["graphs_compiled"] += 1
        M.compile["graph_cache_hits"] += 1

    def set_triton_bundle(self, triton_bundle) -> None:
        pass

    @property
    def graph_executable(self):
        return self.ex


class _Unlowerable:
    """Stands for the executable of a backward graph that cannot be lowered: raises the
    construction's ``NotImplementedError`` when called (at the first backward)."""

    def __init__(self, gm, error):
        self.gm = gm
        self.error = error

    def __call__(self, args):
        e = self.error
        raise type(e)(*e.args)


def deferred_executable(gm, name: str, defer_errors: bool):
    """``GraphExecutable(gm, name)``; with ``defer_errors`` an op it cannot lower raises
    when the executable is called instead of now."""
    from torchtpu.compile.staged import build

    if not defer_errors:
        return build(gm, name)
    try:
        return build(gm, name)
    except NotImplementedError as e:
        return _Unlowerable(gm, e)


_NODE = "__torchtpu_node__"


def _graph_to_data(gm) -> dict:
    """An ATen FX graph as picklable plain data: its nodes in order (op, name, target,
    args and kwargs with node references as ``(_NODE, position)``, fake value geometry,
    :func:`_describe`) and its constant tensors (tpu constants as CPU copies plus their
    device).  Raises ``BypassAOTAutogradCache`` for what it cannot describe."""
    if getattr(gm, "_torchtpu_effects", False):
        # its effect-token checks were taken out of the graph (graph.strip_effects)
        raise _bypass("a graph with effect-token checks (linalg info)")
    pos = {}
    nodes = []

    def ref(a):
        if isinstance(a, torch.fx.Node):
            return (_NODE, pos[a])
        if isinstance(a, (list, tuple)):
            return type(a)(ref(x) for x in a)
        if isinstance(a, dict):
            return {k: ref(v) for k, v in a.items()}
        return a

    consts = {}
    with torch.utils._python_dispatch._disable_current_modes():
        for i, n in enumerate(gm.graph.nodes):
            pos[n] = i
            t = n.target
            if isinstance(t, torch._ops.OpOverload):
                t = ("op", t._schema.name, t._overloadname)
            elif isinstance(t, torch._ops.HigherOrderOperator):
                # (auto_functionalized around a mutating custom op...): not plain data
                raise _bypass(f"a graph with the higher-order op {t.name()}")
            elif n.op == "call_function":
                t = ("fn", t)
            nodes.append((n.op, n.name, t, ref(n.args), ref(n.kwargs),
                          _describe(n.meta.get("val"))))
            if n.op == "get_attr" and n.target not in consts:
                v = _getattr(gm, n.target)
                if isinstance(v, torch.Tensor):
                    consts[n.target] = (v.detach().to("cpu"), str(v.device))
                else:
                    raise _bypass(f"a graph attribute of type {type(v).__name__}")
    return {"nodes": nodes, "consts": consts}


def _graph_from_data(data, fake_mode):
    """The GraphModule :func:`_graph_to_data` described, its nodes' ``meta["val"]``
    fake tensors of ``fake_mode``."""
    g = torch.fx.Graph()
    made = []

    def deref(a):
        if isinstance(a, tuple) and len(a) == 2 and a[0] == _NODE:
            return made[a[1]]
        if isinstance(a, (list, tuple)):
            return type(a)(deref(x) for x in a)
        if isinstance(a, dict):
            return {k: deref(v) for k, v in a.items()}
        return a

    for op, name, t, args, kwargs, desc in data["nodes"]:
        if isinstance(t, tuple) and t[0] == "op":
            ns, opname = t[1].split("::")
            t = getattr(getattr(getattr(torch.ops, ns), opname), t[2])
        elif isinstance(t, tuple) and t[0] == "fn":
            t = t[1]
        n = g.create_node(op, t, deref(args), deref(kwargs), name=name)
        n.meta["val"] = _build(desc, fake_mode)
        made.append(n)
    root = torch.nn.Module()
    with torch.utils._python_dispatch._disable_current_modes():
        for target, (v, dev) in data["consts"].items():
            *path, last = target.split(".")
            m = root
            for part in path:
                if not hasattr(m, part):
                    m.add_module(part, torch.nn.Module())
                m = getattr(m, part)
            m.register_buffer(last, v.to(dev) if dev != "cpu" else v)
    return torch.fx.GraphModule(root, g)


def _build(d, fake_mode):
    """The FakeTensor (or list, tuple, number) that :func:`_describe` described."""
    if d is None:
        return None
    k = d[0]
    if k == "t":
        from torch._subclasses.fake_tensor import FakeTensor

        _, shape, stride, offset, dtype, device, rg, nbytes = d
        elem = torch.empty((nbytes // dtype.itemsize,), dtype=dtype, device="meta")
        elem = elem.as_strided(shape, stride, offset)
        t = FakeTensor(fake_mode, elem, torch.device(device))
        if rg:
            t.requires_grad_(True)
        return t
    if k in ("l", "u"):
        xs = [_build(x, fake_mode) for x in d[1]]
        return xs if k == "l" else tuple(xs)
    return d[1]


def usable(gm, example_inputs) -> bool:
    """Whether Dynamo graph ``gm`` with these example inputs may use the cache: static
    shapes only, and no tensor attribute that AOTAutograd would bake in as a constant
    (one that is neither a parameter nor a buffer of the graph module: those AOTAutograd
    lifts to inputs, as Dynamo's optimizer graphs hold parameters and optimizer state):
    PyTorch's AOTAutograd cache key hashes such a tensor's metadata only, not its values,
    so a graph differing only in a constant's values would reuse the stored one.  Nor a
    graph with collectives: it runs as an SPMD program over its process group's devices
    (``torchtpu.compile.collectives``), which a stored graph does not describe."""
    if _OutputCode is object:
        return False
    for n in gm.graph.nodes:
        if n.op == "call_function" and (
                "c10d" in str(n.target)
                or (getattr(n.target, "__module__", None) or "").startswith("torch.distributed")):
            return False
    lifted = None
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            try:
                v = _getattr(gm, n.target)
            except AttributeError:
                return False
            if isinstance(v, torch.Tensor):
                if lifted is None:
                    lifted = {k for k, _ in gm.named_parameters(remove_duplicate=False)}
                    lifted |= {k for k, _ in gm.named_buffers(remove_duplicate=False)}
                if n.target not in lifted:
                    return False
    for x in example_inputs:
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return False
        if isinstance(x, torch.Tensor) and any(
                not isinstance(d, int) for d in tuple(x.shape) + tuple(x.stride())):
            return False
    return True


def _no_registration() -> None:
    pass


@contextlib.contextmanager
def active(path: str):
    """While AOTAutograd runs for our graph: PyTorch's AOTAutogradCache reads and writes
    under ``path`` (it finds its directory through ``TORCHINDUCTOR_CACHE_DIR``), stores
    bundled entries (our :class:`TpuOutputCode` inside), and the backward is compiled
    with the forward (so that its entry is written here, not at the first backward)."""
    import torch._inductor.codecache as codecache

    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    # the cache key of the graph includes Inductor's custom backend passes, which
    # Inductor's hash collects after registering its code generators (~0.7 s once per
    # process, importing Inductor's codegen): none apply to our graphs
    init = getattr(codecache, "init_backend_registration", None)
    if init is not None:
        codecache.init_backend_registration = _no_registration
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch._functorch.config.patch(
                bundled_autograd_cache=True, force_non_lazy_backward_lowering=True))
            import torch._inductor.config as inductor_config

            # AOTAutogradCache requires Inductor's FX graph cache setting to be on
            if hasattr(inductor_config, "fx_graph_cache"):
                stack.enter_context(inductor_config.patch(fx_graph_cache=True))
            yield
    finally:
        if init is not None:
            codecache.init_backend_registration = init
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
