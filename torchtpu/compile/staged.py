"""ATen graphs with data-dependent nodes: XLA executables between eager sync points.

With ``torch._dynamo.config.capture_scalar_outputs`` / ``capture_dynamic_output_shape_ops``
Dynamo keeps ``x.item()``, ``nonzero``, ``masked_select``, ``unique``, boolean-mask indexing
and ``repeat_interleave(tensor)`` inside the graph: their results have *unbacked* sizes or
values (``u0``), known only once the op has run.  One XLA executable has static shapes, so
such a graph is cut at those nodes (:class:`StagedGraph`):

* a **sync node** -- a node that binds unbacked symbols (``meta["unbacked_bindings"]``) or
  whose lowering needs concrete values (``Lowering.dynamic_shape``) -- runs in eager
  mode, op by op, in whatever eager mode is set: a host sync, as in eager;
* each stretch of nodes between sync nodes is a
  :class:`~torchtpu.compile.graph.GraphExecutable`; the unbacked sizes and values it reads
  arrive as concrete inputs, so it is compiled once per distinct concrete value
  (the same as ``dynamic=True`` graphs: one executable per concrete shape), and reused;
* ``as_strided_scatter`` is a sync node too: its result depends on its input's storage
  offset, which Dynamo's guards do not check (a graph traced for ``x[0:12]`` is reused for
  ``x[5:17]``), so it runs eagerly on the actual tensors;
* ``index_put`` with a boolean mask whose value's size must equal the mask's count of
  True elements (``x[m] = y[m]``) is a sync node too: CPU's "shape mismatch" check needs
  that count, which eager reads as well (``x[m] = 0`` stays compiled);
* a **custom op** (``torch.library``, a namespace other than ``aten``/``prims``) without a
  lowering runs in eager mode the same way, through its own implementation for the
  device (as Inductor calls such an op as a fallback kernel), including one that mutates
  its arguments (PyTorch's ``auto_functionalized`` wrapper around it);
* scalar bookkeeping (SymInt arithmetic, ``sym_size``, PyTorch's runtime range asserts
  ``_assert_scalar`` / ``sym_constrain_range*``) joins whichever stretch it falls in; the
  asserts are checked on the concrete values.

Graphs without sync nodes are not cut (:func:`build`).  The cut graph is never stored in
the graph cache (its values have symbolic sizes).  ``metrics()["compile"]``:
``staged_graphs`` (graphs cut), ``eager_stages`` (sync stages run).
"""

from __future__ import annotations

import operator

import torch

from torchtpu import _metrics, ops
from torchtpu.compile import collectives as _coll
from torchtpu.compile.graph import _SYM_OPS, SCALAR_ASSERTS, GraphExecutable, _is_sym_fn

M = _metrics.METRICS
# namespaces whose ops the graph compiler handles itself (functional collectives are
# lowered into the executable, torchtpu.compile.collectives)
_KNOWN_NAMESPACES = ("aten", "prims", "_c10d_functional", "c10d_functional")
_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default  # Tensor.item()
# its result depends on its input's storage offset, which Dynamo does not guard (a graph
# traced for x[0:12] is reused for x[5:17]): it runs eagerly, on the actual tensors
_AS_STRIDED_SCATTER = torch.ops.aten.as_strided_scatter.default


def is_sync_node(n, table=None) -> bool:
    """Whether graph node ``n`` must run in eager mode: it binds unbacked symbols (its
    output's size or value is read from tensor values) or its lowering needs concrete
    values (``dynamic_shape``: ``nonzero``, ``bincount``, ``histogram``...)."""
    if n.op != "call_function":
        return False
    t = n.target
    if n.meta.get("unbacked_bindings") or t is _LOCAL_SCALAR or t in _AUTO_FUNCTIONALIZED \
            or t is _AS_STRIDED_SCATTER:
        return True
    if isinstance(t, torch._ops.OpOverload):
        table = ops.table() if table is None else table
        low = table.get(t)
        if low is None and t.namespace not in _KNOWN_NAMESPACES and t not in _coll.LOWERED \
                and t is not _coll.WAIT:
            # a custom op (torch.library) without a lowering: opaque Python code, run
            # eagerly through its own implementation for the device
            return True
        if t in _MASKED_PUTS and _mask_count_decides(n):
            # x[mask] = values: CPU's shape check needs the mask's count (eager reads it)
            return True
        if low is not None and low.dynamic_shape:
            v = n.meta.get("val")
            # (a CPU node runs on the host inside the executable's host part anyway)
            return not (isinstance(v, torch.Tensor) and v.device.type == "cpu")
    return False


# a custom op that mutates its arguments, functionalized by PyTorch (the op on clones of
# the mutated bases, which it returns): run eagerly like any custom op without a lowering
_AUTO_FUNCTIONALIZED = {getattr(torch.ops.higher_order, n) for n in
                        ("auto_functionalized", "auto_functionalized_v2")
                        if hasattr(torch.ops.higher_order, n)}
_MASKED_PUTS = {torch.ops.aten.index_put.default, torch.ops.aten._index_put_impl.default}


def _mask_count_decides(n) -> bool:
    """``index_put`` node ``n`` with a boolean mask whose value is right or wrong depending
    on the mask's count (``ops.indexing.mask_count_decides``, on its fake tensors); True
    too when that cannot be decided on the fake tensors (eager is always right)."""
    from torchtpu.ops.indexing import mask_count_decides

    def fake(a):
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    x, indices, values = (list(n.args) + [None] * 3)[:3]
    if not isinstance(indices, (list, tuple)):
        return False
    try:
        return mask_count_decides(fake(x), [fake(i) for i in indices], fake(values))
    except Exception:  # noqa: BLE001
        # sizes it cannot compare (unbacked or symbolic ones): the count may decide, so
        # the node runs eagerly, where the check is made on the actual count (compiled,
        # a wrong count would write without CPU's "shape mismatch" error)
        return True


def _flexible(n) -> bool:
    """Scalar bookkeeping that may run in either kind of stage."""
    t = n.target
    return t in SCALAR_ASSERTS or t in _SYM_OPS or (
        not isinstance(t, torch._ops.OpOverload) and t is not operator.getitem and _is_sym_fn(t))


def needs_staging(gm) -> bool:
    table = ops.table()
    return any(is_sync_node(n, table) for n in gm.graph.nodes)


def build(gm, name: str, dump_prefix: str | None = None):
    """The executable for AOTAutograd graph ``gm``: a :class:`StagedGraph` when it holds
    sync nodes, else one :class:`~torchtpu.compile.graph.GraphExecutable`."""
    if needs_staging(gm):
        return StagedGraph(gm, name, dump_prefix)
    # (sizes read from tensor values may still arrive as inputs -- a backward graph of a
    # forward that had sync nodes --: compiled per concrete value, like a stretch)
    return GraphExecutable(gm, name, dump_prefix=dump_prefix)


class _Stage(torch.nn.Module):
    """A compiled stretch of the cut graph, called by the top-level graph like the
    submodule it replaces (positional inputs; one value, or a tuple)."""

    def __init__(self, ex, single: bool):
        super().__init__()
        self.ex = ex
        self.single = single

    def forward(self, *args):
        out = self.ex(list(args))
        return out[0] if self.single else tuple(out)


class StagedGraph:
    """AOTAutograd graph ``gm`` cut at its sync nodes (see the module docstring), called
    with AOTAutograd's boxed convention: ``__call__(args)`` with ``args`` the graph's
    inputs (a list), returns the list of outputs.  Raises ``NotImplementedError`` at
    construction for an op with no lowering in a compiled stretch, as
    :class:`~torchtpu.compile.graph.GraphExecutable` does."""

    _boxed_call = True

    def __init__(self, gm, name: str, dump_prefix: str | None = None):
        from torch.fx.passes.split_module import split_module

        self.gm = gm
        self.name = name
        table = ops.table()
        part, kinds = {}, []
        srcs_eager = set()
        for n in gm.graph.nodes:
            if n.op in ("placeholder", "output", "get_attr"):
                continue
            if is_sync_node(n, table) or (n.target is operator.getitem
                                          and n.args[0] in srcs_eager):
                kind = "eager"
                srcs_eager.add(n)
            elif _flexible(n) and kinds:
                part[n] = len(kinds) - 1
                continue
            else:
                kind = "compiled"
            if not kinds or kinds[-1] != kind:
                kinds.append(kind)
            part[n] = len(kinds) - 1
        split = split_module(gm, None, lambda n: part[n], keep_original_order=True)
        self.stages = {"eager": 0, "compiled": 0}
        for p, kind in enumerate(kinds):
            attr = f"submod_{p}"
            sub = getattr(split, attr, None)
            if sub is None:
                continue
            self.stages[kind] += 1
            if kind == "eager":
                continue
            out = next(n for n in sub.graph.nodes if n.op == "output")
            single = not isinstance(out.args[0], (tuple, list))
            if single:
                out.args = ((out.args[0],),)
                sub.recompile()
            prefix = f"{dump_prefix}.stage{p}" if dump_prefix is not None else None
            ex = GraphExecutable(sub, f"{name}.stage{p}", dump_prefix=prefix)
            setattr(split, attr, _Stage(ex, single))
        self.split = split
        M.compile["staged_graphs"] += 1

    def __call__(self, args):
        if len(args) == 1 and isinstance(args[0], list):
            args = args[0]
        M.compile["eager_stages"] += self.stages["eager"]
        out = self.split(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]
