"""One AOTAutograd FX graph (ATen ops) -> one ``jax.jit`` executable.

:class:`GraphExecutable` interprets the graph's nodes through the same lowering table
as eager (``torchtpu.ops``), with the same argument normalization, Scalars and output
dtype fixing (``torchtpu.ops._schema``), inside one JAX trace.  Tensor values are modelled
as eager models them: a storage array plus a view spec (``torchtpu._tensor.storage``).
A view node (``view``, ``t``, ``slice``, ``as_strided``...) costs nothing: its value is its
base's storage read through the geometry PyTorch's fake tensor gives it, exactly as eager
reads a view.  A non-view node's result is a new storage, laid out as its fake tensor's
strides say.

Nodes on CPU tensors whose inputs are all on CPU (an optimizer's ``step`` counters) run on
the host with PyTorch's CPU kernels before the executable (one generated ``torch.fx``
function); their values enter it as inputs, packed into one array per dtype.  Floating
point host nodes whose values only the executable reads (the optimizer's bias
corrections) are computed inside it instead.  Input mutations (``copy_`` into a graph
input, e.g. BatchNorm running stats kept in the graph by AOTAutograd, an optimizer's
parameters and moments) are written back to the input's storage after the call, and the
old buffers are donated to the executable (updated in place) when nothing but their
storage holds them; otherwise a copy is donated (:func:`_own`).
Random ops draw one key per node per call from the tpu generator (``state.rng``), passed
as an input, so masks change between calls and ``torch.manual_seed`` replays them.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
import os
import time

import numpy as np
import torch

from torchtpu import _metrics, ops
from torchtpu._device import persistent_cache, runtime, state
from torchtpu._tensor import native
from torchtpu._tensor import storage as _st
from torchtpu.compile import collectives as _coll
from torchtpu.compile import executable_cache
from torchtpu.compile import seq_buckets as _seq
from torchtpu.compile.decompositions import ASSERT_ASYNC
from torchtpu.eager import inflight
from torchtpu.ops._scalar import Scalar, register_pytree
from torchtpu.ops._schema import (
    GEN, OPT_SCALAR, OPT_T, OPT_T_LIST, SCALAR, T, T_LIST, Signature, call_lowering, flatten,
)

M = _metrics.METRICS
aten = torch.ops.aten
_SCALAR_NP = {bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}
# uninitialized memory: any value is right; zeros
_EMPTY = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
          aten.new_empty.default, aten.new_empty_strided.default, aten.empty_permuted.default}
# numbers compiled graphs' names (forward0, backward1, ...)
graph_ids = itertools.count()
_SIGS: dict = {}


def _sig(op) -> Signature:
    s = _SIGS.get(op)
    if s is None:
        s = _SIGS[op] = Signature(op)
    return s


def _fake_tensors(val) -> list:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [v for v in val if isinstance(v, torch.Tensor)]
    return []


def _is_tpu(val) -> bool:
    return isinstance(val, torch.Tensor) and val.device.type == "tpu"


def _is_cpu(val) -> bool:
    ts = _fake_tensors(val)
    return bool(ts) and all(t.device.type == "cpu" for t in ts)



# Ops that read only the geometry and dtype of their tensor argument, never its values:
# with a CPU ``device=`` they run on the host even when that argument is a tpu value
_METADATA_ONLY = {getattr(getattr(aten, op), overload) for op, overload in (
    ("zeros_like", "default"), ("ones_like", "default"), ("full_like", "default"),
    ("empty_like", "default"), ("new_empty_strided", "default"), ("new_empty", "default"),
    ("new_zeros", "default"), ("new_ones", "default"), ("new_full", "default"),
    ("rand_like", "default"), ("randn_like", "default"), ("randint_like", "default"),
    ("randint_like", "low_dtype")) if hasattr(getattr(aten, op), overload)}


def _metadata_input(n, a) -> bool:
    """Whether host node ``n`` reads only the geometry of its tensor input ``a``: ``n``'s
    first argument, for an op in ``_METADATA_ONLY``, and either a graph input or a view
    of one (:func:`_view_chain`: its geometry is read from the value passed at each call,
    symbolic sizes included) or a static-shape tensor."""
    v = a.meta.get("val")
    return (n.target in _METADATA_ONLY and n.args and n.args[0] is a
            and isinstance(v, torch.Tensor)
            and (_view_chain(a) is not None
                 or all(isinstance(d, int) for d in tuple(v.shape) + tuple(v.stride()))))


def _view_chain(a):
    """The view nodes from a graph input to ``a`` (``[]`` for an input itself; ``x.t()``,
    ``x[1:]``...), or None when ``a`` is computed otherwise.  Their geometry at a call is
    that of the same views taken of a stand-in of the input's geometry."""
    chain = []
    while a.op != "placeholder":
        if a.op != "call_function" or not isinstance(a.target, torch._ops.OpOverload) \
                or not _sig(a.target).is_view or not a.args \
                or not isinstance(a.args[0], torch.fx.Node) \
                or any(not isinstance(x.meta.get("val"), (torch.SymInt, int))
                       for x in a.all_input_nodes if x is not a.args[0]):
            return None
        chain.append(a)
        a = a.args[0]
    return chain[::-1]


def _cpu_stand_in(x):
    """An uninitialized CPU tensor of ``x``'s sizes, strides and dtype (what a host node
    that reads only ``x``'s geometry is given in place of the tpu value ``x``)."""
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cpu")


def _storage_elems(fake):
    """Elements of ``fake``'s storage (in its dtype), or None where that is not a plain
    int (symbolic sizes) or the view overlaps itself."""
    try:
        n = fake.untyped_storage().nbytes()
    except Exception:  # noqa: BLE001 (fake tensors without a storage size)
        return None
    if not isinstance(n, int) or n % fake.dtype.itemsize:
        return None
    if any(s == 0 for s, d in zip(fake.stride(), fake.shape) if d > 1):
        return None  # broadcast (overlapping) strides: keep the dense copy
    return n // fake.dtype.itemsize


def _eval_bn_stat(node, graph_name: str):
    """For an inference graph's output that is the saved mean or invstd of an eval-mode
    batch norm (``_native_batch_norm_legit_no_training``, what PyTorch makes of
    ``native_batch_norm(training=False)``): the empty tensor CPU's kernel returns there
    (PyTorch's meta kernel says (C,), the running statistics, which is what a backward
    graph reads, so training graphs keep them).  None for any other output."""
    if not graph_name.startswith("inference") or node.target is not operator.getitem:
        return None
    src, k = node.args[0], node.args[1]
    t = getattr(src, "target", None)
    eval_fn = t is aten._native_batch_norm_legit_functional.default and len(src.args) > 5 \
        and src.args[5] is False  # a functionalized _native_batch_norm_legit(training=False)
    if (t is not aten._native_batch_norm_legit_no_training.default and not eval_fn) \
            or k not in (1, 2):
        return None
    fake = node.meta.get("val")
    if not isinstance(fake, torch.Tensor):
        return None
    return torch.empty((0,), dtype=fake.dtype, device=fake.device)


def _spec(fake, sshape, sdtype):
    """View spec (as ``storage.view_spec``) of fake tensor ``fake`` on a storage array of
    shape ``sshape`` and torch dtype ``sdtype``."""
    size = tuple(fake.shape)
    conj, neg = fake.dtype.is_complex and fake.is_conj(), fake.is_neg()
    if conj or neg:
        # a lazily conjugated / negated view (``x.conj()``, ``torch._neg_view``): its
        # values are conj(storage) / -storage, applied on read and inverted on write
        return (size, fake.dtype, tuple(fake.stride()), int(fake.storage_offset()),
                tuple(sshape), sdtype, conj, neg)
    if (size == tuple(sshape) and fake.dtype is sdtype and fake.storage_offset() == 0
            and fake.is_contiguous()):
        return (size, fake.dtype)
    return (size, fake.dtype, tuple(fake.stride()), int(fake.storage_offset()), tuple(sshape),
            sdtype)


def foreach_element_op(op):
    """The per-tensor overload a ``_foreach_*`` overload applies element by element (see
    :func:`torchtpu.ops.foreach.element_op`)."""
    from torchtpu.ops import foreach

    return foreach.element_op(op)


class _Unsupported(NotImplementedError):
    pass


_SYM_OPS = {aten.sym_size.int: lambda v, d: v.shape[d],
            aten.sym_stride.int: lambda v, d: v.stride()[d],
            aten.sym_numel.default: lambda v: v.numel(),
            aten.sym_storage_offset.default: lambda v: v.storage_offset()}


# side-effect ops PyTorch threads an effect token through (``with_effects``) that a graph
# may hold: run on the host after the executable, on the values it returns for them
_EFFECT_OPS = {aten._linalg_check_errors.default}


def _with_effects():
    return getattr(torch.ops.higher_order, "with_effects", None)


def strip_effects(gm) -> list:
    """Rewrite ``gm`` in place without its ``with_effects`` nodes of :data:`_EFFECT_OPS`
    (PyTorch's effect token around ``_linalg_check_errors(info, api_name, is_matrix=)``,
    which ``linalg.inv``, ``cholesky``, ``solve``... call): the token each returns becomes
    the token it was given (a graph input passed through), and the check becomes a host
    step after the executable.  Returns ``[(value node, op, other args, kwargs)]`` in
    graph order: the executable returns each value node's array, and the call runs
    ``op`` on its CPU copy, raising the error PyTorch's CPU kernel raises (a host sync per
    call, as eager reads ``info``).  The graph is marked (``_torchtpu_effects``) so the
    graph cache does not store it without them."""
    we = _with_effects()
    effects = []
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target in _EFFECT_OPS and not n.users:
            # the same check without a token (a decomposition's, e.g. torch.cholesky's)
            value, *rest = n.args
            effects.append((value, n.target, tuple(rest), dict(n.kwargs)))
            gm.graph.erase_node(n)
            continue
        if we is None or n.op != "call_function" or n.target is not we or len(n.args) < 3 \
                or n.args[1] not in _EFFECT_OPS:
            continue
        token, op, value, *rest = n.args
        effects.append((value, op, tuple(rest), dict(n.kwargs)))
        for u in list(n.users):
            if u.target is operator.getitem and u.args[1] == 0:
                u.replace_all_uses_with(token)
                gm.graph.erase_node(u)
        if n.users:
            raise NotImplementedError(
                f"torchtpu.compile: graph node {n.name} uses the result of {op}")
        gm.graph.erase_node(n)
    if effects:
        gm._torchtpu_effects = True
        gm.recompile()
    return effects


def check_errors_effects(gm) -> list:
    """The host checks of ``gm``'s nodes that ask for them with ``check_errors=True``
    (``ops.linalg.CHECK_ERRORS``: ``linalg_inv_ex``, ``linalg_cholesky_ex``,
    ``linalg_lu_factor_ex``), as :func:`strip_effects` returns them: each node's
    ``info`` output is returned by the executable and PyTorch's
    ``_linalg_check_errors(info, api, is_matrix=)`` runs on its CPU copy after the call,
    raising CPU's error as eager does.  The graph is left as it is."""
    from torchtpu.ops import linalg as _linalg

    out = []
    for n in gm.graph.nodes:
        spec = _linalg.CHECK_ERRORS.get(n.target) if n.op == "call_function" else None
        if spec is None:
            continue
        sig = _sig(n.target)
        vals = sig.normalize(n.args, n.kwargs)
        if not vals[sig.names.index("check_errors")]:
            continue
        api, k = spec
        a = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
        out.append(((n, k), aten._linalg_check_errors.default, (api,),
                    {"is_matrix": a is not None and a.dim() == 2}))
    return out


def _scalar_asserts() -> set:
    out = set()
    for name in ("_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size"):
        pkt = getattr(aten, name, None)
        if pkt is not None:
            out.add(pkt.default)
    return out


# PyTorch's runtime asserts on SymInts (ranges of unbacked sizes read from tensor values,
# torchtpu.compile.staged): checked on the concrete values when the graph is traced
SCALAR_ASSERTS = _scalar_asserts()




def _is_sym_fn(t) -> bool:
    """Size arithmetic on SymInts in a dynamic-shape graph (``operator.mul``,
    ``torch.sym_max``...): evaluated on the concrete sizes of the call."""
    return getattr(t, "__module__", None) in ("_operator", "operator") or \
        getattr(t, "__name__", "").startswith("sym_")


def _is_symbolic(gm) -> bool:
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("val")
            if isinstance(v, torch.SymInt) or isinstance(v, torch.Tensor) and any(
                    not isinstance(d, int) for d in tuple(v.shape) + tuple(v.stride())):
                return True
    return False


class _Unbound(Exception):
    """A size expression with a symbol the call's inputs do not bind."""


def _substituted_metas(gm, placeholders, args):
    """``{node: fake value}`` for a graph with symbolic sizes at the call's concrete
    sizes, or None where that takes :func:`_concrete_metas`.

    Each symbol is bound from the inputs (a placeholder's size, stride or storage offset
    that is a bare symbol, or a SymInt input); every node's fake value is then made at the
    sizes, strides, storage offset and storage size its symbolic value's expressions give
    under those bindings: cheaper than re-propagating fake tensors through every node.  Dynamo
    specializes sizes 0 and 1, so the symbolic formulas hold for every size a graph is
    called with.  None when an input's static size, stride or offset differs from the
    call's (``_geometry_differs``), when a symbol stays unbound (sizes read from tensor
    values), or for values other than tensors, sizes and lists of them (conj/neg views
    included).  The tensors are on the ``meta`` device: what the trace reads of a node's
    value is its geometry and dtype (its device is the graph's)."""
    import sympy

    bind, later = {}, []

    def pair(sym, c) -> bool:
        if isinstance(sym, torch.SymInt):
            e = sympy.sympify(sym.node.expr)
            if isinstance(e, sympy.Symbol):
                return bind.setdefault(e, c) == c
            later.append((e, c))
            return True
        return isinstance(sym, int) and sym == c

    for n, a in zip(placeholders, args):
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt):
            if not isinstance(a, int) or not pair(v, a):
                return None
        elif isinstance(v, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.dim() != v.dim():
                return None
            for sym, c in zip((*v.shape, *v.stride(), v.storage_offset()),
                              (*a.shape, *a.stride(), a.storage_offset())):
                if not pair(sym, c):
                    return None

    def ev(x):
        if isinstance(x, int):
            return x
        if isinstance(x, torch.SymInt):
            e = sympy.sympify(sympy.sympify(x.node.expr).xreplace(bind))
            if not e.is_number:
                raise _Unbound
            return int(e)
        raise _Unbound

    def concrete(v):
        if v is None or isinstance(v, (bool, int, float)):
            return v
        if isinstance(v, torch.SymInt):
            return ev(v)
        if isinstance(v, (list, tuple)):
            return type(v)(concrete(x) for x in v)
        if not isinstance(v, torch.Tensor) or v.is_conj() or v.is_neg() or v.is_sparse:
            raise _Unbound
        size = tuple(ev(d) for d in v.shape)
        stride = tuple(ev(d) for d in v.stride())
        off = ev(v.storage_offset())
        nbytes = ev(v.untyped_storage().nbytes())
        base = torch.empty((nbytes // v.dtype.itemsize,), dtype=v.dtype, device="meta")
        return base.as_strided(size, stride, off)

    try:
        for e, c in later:
            got = sympy.sympify(e.xreplace(bind))
            if not got.is_number or int(got) != c:
                return None
        return {n: concrete(n.meta.get("val")) for n in gm.graph.nodes}
    except _Unbound:
        return None


def _concrete_metas(gm, placeholders, args) -> dict:
    """``{node: fake value}`` for a graph with symbolic sizes, re-propagated with fake
    tensors of the call's concrete inputs (one executable per concrete shape)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    saved = {n: n.meta.get("val") for n in gm.graph.nodes}
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
             for a in args[: len(placeholders)]]
    try:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
        return {n: n.meta.get("val") for n in gm.graph.nodes}
    finally:
        for n, v in saved.items():
            n.meta["val"] = v


def _geometry_differs(placeholders, args) -> bool:
    """A tpu input whose strides or storage offset differ from its placeholder's fake
    tensor (AOTAutograd restrides a backward's tangents at run time to the forward
    outputs' strides, but not their storage offsets: a tangent of ``unbind(x, 1)[1]`` is
    traced at offset 1 and arrives at offset 0).  View nodes read their base's storage
    through the geometry of their fake tensors, so those must then be re-propagated from
    the actual inputs (:func:`_concrete_metas`)."""
    for n, a in zip(placeholders, args):
        v = n.meta.get("val")
        if isinstance(a, torch.Tensor) and isinstance(v, torch.Tensor) and \
                a.device.type == "tpu" and (
                    tuple(a.shape) != tuple(v.shape) or tuple(a.stride()) != tuple(v.stride())
                    or a.storage_offset() != v.storage_offset()):
            return True
    return False


def check_graph(gm) -> None:
    """Raise ``NotImplementedError`` naming the first op of ``gm`` that has no lowering
    (nor a view / uninitialized-memory / host meaning), or whose lowering needs concrete
    values (``dynamic_shape``: ``nonzero``, ``masked_select``...; ``compile.staged`` runs
    those eagerly, so none should reach here), before anything is compiled.  Sizes read
    from tensor values (unbacked SymInts) are fine: they arrive as concrete inputs (one
    executable per concrete value)."""
    table = ops.table()
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        t = n.target
        if not isinstance(t, torch._ops.OpOverload):
            if t is operator.getitem or _is_sym_fn(t):
                continue
            raise NotImplementedError(
                f"torchtpu.compile: graph node {n.name} calls {t}, which has no lowering "
                f"for the tpu device")
        val = n.meta.get("val")
        if _is_cpu(val):
            continue  # runs on the host with PyTorch's CPU kernel
        fe = foreach_element_op(t) if t not in table else None
        if fe is not None and fe in table:
            continue
        if t in _SYM_OPS or t in _coll.LOWERED or t is _coll.WAIT or t in SCALAR_ASSERTS \
                or t in ASSERT_ASYNC:
            continue
        if t in table and table[t].dynamic_shape:
            raise NotImplementedError(
                f"torchtpu: the ATen op '{t}' has a data-dependent output shape and cannot "
                f"run inside a torch.compile graph on the tpu device (node {n.name}): one XLA "
                f"executable has static shapes.  Call it outside the compiled function (or "
                f"after torch._dynamo.graph_break()), where eager runs it")
        if t in table or t in _EMPTY or t is aten.copy_.default or t is aten._unsafe_view.default \
                or t is aten.lift_fresh_copy.default or _sig(t).is_view:
            continue
        raise NotImplementedError(
            f"torchtpu: the ATen op '{t}' is not implemented for the tpu device (in a "
            f"torch.compile graph, node {n.name}); it has no lowering and no decomposition")


def _is_number(v) -> bool:
    return isinstance(v, (bool, int, float, complex))


def argument_checks(gm, host=()):
    """Run the lowering table's host-side argument checks (``prepare`` hooks marked
    :func:`torchtpu.ops._scalar.scalar_check`) on every node of ``gm``, with the nodes'
    fake tensors and the graph's constant Scalars: a constant that does not fit its dtype
    (``fill_(300)`` on int8, ``pow(int8, -1)``) fails as in eager.  Nodes with symbolic
    sizes or Scalars are not checked (the checks read concrete numbers).

    Returns ``(error, overrides)``: the first exception a check raised (``None`` if all
    pass), to be raised by each call of the graph as eager raises at each call, and
    ``{node: {position: value}}`` for the constants a check rewrote (a float 2**63 filled
    into int64 becomes INT64_MIN, as CPU converts it).
    """
    from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                               DynamicOutputShapeException)

    table = ops.table()
    overrides: dict = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n in host or not isinstance(n.target, torch._ops.OpOverload):
            continue
        low = table.get(n.target)
        prep = low.prepare if low is not None else None
        if prep is None or not getattr(prep, "scalar_check", False):
            continue
        sig = _sig(n.target)
        symbolic = []

        def fake(a):
            v = a.meta.get("val")
            if not isinstance(v, torch.Tensor) and not _is_number(v) and v is not None:
                symbolic.append(a)
            elif isinstance(v, torch.Tensor) and any(
                    not isinstance(s, int) for s in v.shape):
                symbolic.append(a)
            return v

        args = torch.fx.node.map_arg(n.args, fake)
        kwargs = torch.fx.node.map_arg(n.kwargs, fake)
        if symbolic:
            continue
        vals = sig.normalize(args, kwargs)
        before = list(vals)
        try:
            after = prep(list(vals))
        except (DataDependentOutputException, DynamicOutputShapeException):
            continue
        except (RuntimeError, NotImplementedError, ValueError, IndexError, TypeError) as e:
            return e, overrides
        changed = {i: v for i, (b, v) in enumerate(zip(before, after))
                   if _is_number(b) and v is not b}
        if changed:
            overrides[n] = changed
    return None, overrides


class GraphExecutable:
    """A compiled ATen FX graph, called with AOTAutograd's boxed convention.

    ``__call__(args)``: ``args`` the graph inputs (tpu tensors, CPU tensors, ints);
    returns the list of outputs (tpu tensors with the strides PyTorch's fake tensors give
    them, sharing storage where the graph's outputs alias).  Raises
    ``NotImplementedError`` at construction for an op without a lowering.
    ``dump_prefix`` (``TORCHTPU_DUMP_DIR``, :mod:`torchtpu.compile.dump`): each executable
    built writes its StableHLO text to ``<dump_prefix>[.exeK].stablehlo.mlir``.
    """

    _boxed_call = True

    def __init__(self, gm, name: str, dump_prefix: str | None = None):
        # effect-token checks (linalg's ``info``) become host steps after the executable
        self.effects = strip_effects(gm) + check_errors_effects(gm)
        check_graph(gm)
        self.gm = gm
        self.name = name
        # TORCHTPU_DUMP_DIR: "<dir>/graph_NNN.<kind>"; each executable's StableHLO goes to
        # <prefix>[.exeK].stablehlo.mlir (torchtpu.compile.dump)
        self.dump_prefix = dump_prefix
        self.nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in self.nodes if n.op == "placeholder"]
        self.get_attrs = [n for n in self.nodes if n.op == "get_attr"]
        self.output = next(n for n in self.nodes if n.op == "output")
        self.inputs = self.placeholders + self.get_attrs
        table = ops.table()
        self.host = set()  # nodes computed on the host (CPU tensors)
        for n in self.nodes:
            if n.op in ("placeholder", "get_attr"):
                # (a get_attr is a constant the graph holds: ``torch.tensor([...])`` built
                # inside the compiled function is a CPU one, lifted by ``lift_fresh_copy``)
                v = n.meta.get("val")
                if v is None and n.op == "get_attr":
                    v = operator.attrgetter(n.target)(gm)
                if _is_cpu(v):
                    self.host.add(n)
            elif n.op == "call_function":
                if n.target is operator.getitem:
                    if n.args[0] in self.host:
                        self.host.add(n)
                elif _is_cpu(n.meta.get("val")):
                    for a in n.all_input_nodes:
                        if a not in self.host and _fake_tensors(a.meta.get("val")) \
                                and not _metadata_input(n, a):
                            raise NotImplementedError(
                                f"torchtpu.compile: node {n.name} ({n.target}) moves a tpu "
                                f"value to the CPU inside a compiled graph")
                    self.host.add(n)
        self.random = [n for n in self.nodes if n.op == "call_function"
                       and n not in self.host and isinstance(n.target, torch._ops.OpOverload)
                       and n.target in table and table[n.target].random]
        for n in self.random:
            sig = _sig(n.target)
            vals = sig.normalize(n.args, n.kwargs)
            if any(k == GEN and v is not None for k, v in zip(sig.kinds, vals)):
                raise NotImplementedError(
                    f"torchtpu.compile: {n.target} with an explicit generator in a compiled "
                    f"graph")
        # layout key -> (written input slots, executable tuple): the per-call lookup
        self.runtime: dict = {}
        self.check_info: list = []
        self.symbolic = _is_symbolic(gm)
        # host-side argument checks of the lowerings (eager runs them at every call)
        self.arg_error, self.overrides = argument_checks(gm, self.host)
        # host nodes only the executable reads (an optimizer's bias corrections, computed
        # from its CPU step counters) are computed in it, from their host inputs: fewer
        # PyTorch CPU ops per call and fewer values to transfer
        self.host -= _device_side(self.nodes, self.host, self.output, table)
        # per-call host work, precomputed: the host nodes in order, and the host values
        # the executable reads
        self.host_calls = [n for n in self.nodes if n.op == "call_function" and n in self.host]
        # (inputs the tracer saw as tpu tensors are not host values: Dynamo guards devices)
        self.host_feed = [n for n in self.nodes
                          if (n in self.host or n.op in ("placeholder", "get_attr"))
                          and _used_on_device(n, self.host) and not _is_tpu(n.meta.get("val"))]
        out_nodes = [o for o in flatten(list(self.output.args[0])) if isinstance(o, torch.fx.Node)]
        self.host_outs = [o for o in out_nodes if o in self.host and o.op == "call_function"]
        self.host_fn = self._build_host_fn()
        self.feed_pos = [self.inputs.index(n) for n in self.host_feed] if self.host_fn is None \
            else None
        # inputs (positions in placeholders + get_attrs) whose storage the graph writes
        inputs = self.inputs
        pos = {n: i for i, n in enumerate(inputs)}
        self.mutated_inputs = sorted({pos[b] for b in (
            _written_input(n, table) for n in self.nodes
            if n.op == "call_function" and n.target is aten.copy_.default and n not in self.host)
            if b is not None})
        self.executables: dict = {}
        # functional collectives on the device: the executable is one SPMD program over
        # their group's devices (torchtpu.compile.collectives)
        coll = _coll.graph_collectives(self.nodes, self.host)
        self.group = None
        self.collectives = [n.target._schema.name.split("::")[1] for n in coll]
        if coll:
            why = _coll.unsupported_reason(coll)
            if why is not None:
                raise NotImplementedError(f"torchtpu.compile: {why}")
            self.group = _coll.group_of(coll)
            self.mutated_inputs = []  # no donation across the SPMD boundary
            M.compile["collectives"] += len(coll)
        # a decoding step over a growing cache: bucketed executables (compile.seq_buckets)
        self.seq_plan = None
        if self.symbolic and not coll and not self.effects and not self.host_calls \
                and not self.mutated_inputs and not self.get_attrs and not self.random:
            self.seq_plan = _seq.analyze(self.nodes, self.placeholders, self.output)
        self._seq_len = None  # the bucketed call's cache length after its appends
        # stitching (STITCH): layout key -> (node, n_new, written, check_info, assemble)
        self.stitched: dict = {}
        # (a dump directory asks for each graph's own StableHLO: not stitched)
        self.stitchable = self.group is None and not self.effects and dump_prefix is None

    # ------------------------------------------------------------------ runtime
    def __call__(self, *args):
        defer, executor, host_reads = _EAGER or _eager_modules()
        if len(args) == 1 and isinstance(args[0], list):  # boxed call (a list of inputs)
            args = args[0]
        if self.arg_error is not None:  # a constant argument that eager also rejects
            e = self.arg_error
            raise type(e)(*e.args)
        stitch = STITCH and self.stitchable and not _UNSTITCHED[0]
        if not stitch and defer.pending_ops():
            # the pending segment is dispatched (asynchronously) so the graph reads
            # concrete inputs; not a host sync
            defer.flush("compiled_graph", sync=False)
        c = M.compile
        c["graph_calls"] += 1
        for name in self.collectives:
            M.collectives[("compiled", name)] += 1
        if self.get_attrs:
            args = list(args) + [getattr(self.gm, n.target) for n in self.get_attrs]
        seq_n = None
        if self.seq_plan is not None:
            plan = self.seq_plan
            seq_n = _seq.cache_length(args, plan)
            if seq_n is not None:  # the caches as capacity tensors, the length at run time
                cap = _seq.capacity(seq_n, plan.k, _seq.entry_bytes(args, plan))
                args = list(args)
                for i, d in plan.caches:
                    args[i] = _seq.capacity_tensor(
                        args[i], d, cap, _seq.capacity_array(args[i], d, seq_n, cap))
                for i in plan.symints:
                    args[i] = cap
                c["seq_bucket_calls"] += 1
        # device inputs: one slot per distinct storage; the key is the inputs' layout
        # (_gather; the C++ helper's graph_gather once it is loaded)
        got = None if _GATHER[0] is None else _GATHER[0](args, stitch, _st.ASYNC, _CPU_KEY)
        if got is None:
            got = self._gather(args, stitch)
        key, arrays, sdatas, storages, index, lazy = got
        del got  # (_own counts the references to the arrays)
        if index is None:
            index = state.current_device
        # host part: CPU nodes with PyTorch's CPU kernels (generated code); copy_ into
        # inputs waits until the executable is dispatched
        late, houts, host_vals = (), (), ()
        if self.host_fn is not None:
            feeds, late, houts = self.host_fn(*args)
            host_vals = self._pack_host(feeds, key)
        elif self.feed_pos:
            host_vals = self._pack_host([args[i] for i in self.feed_pos], key)
        keys = [state.rng(index).next_key_data() for _ in self.random] if self.random else []
        if seq_n is not None:
            key.append(_SEQ_KEY)
            host_vals = list(host_vals) + [np.asarray(seq_n, np.int32)]
            self._seq_len = seq_n + self.seq_plan.k
        # torch.set_float32_matmul_precision: read at each call, part of the key
        key.append(("prec", torch._C._get_float32_matmul_precision()))
        key.append(index)
        key = tuple(key)
        if stitch and seq_n is None:
            st = self.stitched.get(key)
            if st is None:
                st = self.stitched[key] = self._stitch_node(key, args, arrays, host_vals,
                                                            keys, sdatas, index)
            else:
                c["cache_hits"] += 1
            # recorded: runs fused with what is around it (the host part's copies into
            # CPU inputs are host work: done now)
            node, n_new, written, check_info, assemble = st
            if late:
                self._late(args, late)
            if node is None:  # nothing to compute (see _prepare): no node
                c["launch_free_calls"] += 1
                return assemble((), storages, args, houts, index)
            if len(inflight.PENDING_CHECKS) > inflight.CHECK_LIMIT and defer.starts_step(node):
                # the device-side checks queued so far are verified (a sync) at a step
                # boundary, not in the middle of the step's segment
                defer.flush("step_boundary", sync=False)
                host_reads.check_pending()
            outs = defer.record_graph(node, arrays, (*host_vals, *keys), index, written,
                                      [sdatas[j] for j in written], n_new, bool(check_info))
            c["stitched_calls"] += 1
            del arrays
            if check_info:  # (a Lazy flag array: verified at the next sync point)
                inflight.add_check(outs[-1], check_info, f"compiled graph {self.name}")
            return assemble(outs, storages, args, houts, index)
        if lazy or (stitch and defer.pending_ops()):
            # launched on its own (a bucketed decoding step): the pending segment runs
            # first and the graph reads its values
            defer.flush("compiled_graph", sync=False)
            arrays = [a.value if a.__class__ is _Lazy else a for a in arrays]
        # one lookup per call: the written input slots (from the layout) and the executable
        hit = self.runtime.get(key)
        if hit is None:
            hit = self.runtime[key] = self._prepare(key, args, arrays, host_vals, keys, sdatas,
                                                    index)
            written_slots, ex = hit
        else:
            c["cache_hits"] += 1
            written_slots, ex = hit
            if written_slots:
                # donation: the old buffers of the inputs the graph writes (optimizer
                # state, running stats) are donated when nothing but their storage holds
                # them
                inflight.clear_last()  # synchronize() waits on this call's outputs
                _own(arrays, written_slots)
        jitted, n_new, written, check_info, assemble, split = ex
        if jitted is None:
            # nothing to compute (every output is an input or a view of one: the
            # ``detach`` graph after a graph break): no executable to launch
            outs = ()
            c["launch_free_calls"] += 1
        elif split is None:
            outs = jitted(arrays, host_vals, keys)
            c["graph_launches"] += 1
            inflight.dispatched(outs)
        else:
            don_slots, kept_slots = split
            outs = jitted([arrays[j] for j in don_slots], [arrays[j] for j in kept_slots],
                          host_vals, keys)
            c["donated_buffers"] += len(don_slots)
            c["graph_launches"] += 1
            inflight.dispatched(outs)
        del arrays
        if late:
            self._late(args, late)
        if check_info:
            host_reads.report_device_checks(outs[-1], check_info, f"compiled graph {self.name}")
        for j, arr in zip(written, outs[n_new:]):
            sdatas[j].arr = arr
        if self.effects:
            k = n_new + len(written)
            self._run_effects(outs[k:k + len(self.effects)])
        return assemble(outs, storages, args, houts, index)

    def _gather(self, args, stitch):
        """The call's device inputs: ``(key, arrays, sdatas, storages, index, lazy)``.
        One slot per distinct storage (``arrays[j]`` its array, or with ``stitch`` a
        pending DeferAndFuse value of the segment it is recorded into, ``lazy`` then
        True; ``sdatas[j]``/``storages[j]`` its StorageData and storage); ``key`` the
        inputs' layout, one entry per argument: ``("t", slot, view spec)`` for a tpu
        tensor (the view spec as ``storage.view_spec``, inlined), ``("c",)`` for a CPU
        tensor, ``("v", value)`` otherwise; ``index`` the tpu device index (None: no tpu
        input).  The C++ helper's ``graph_gather`` does the same in one call (a change
        here must be made there too).

        Raises:
            RuntimeError: a tensor of another device, or tpu tensors of two devices.
        """
        sdatas, slot_of, arrays, storages, key = [], {}, [], [], []
        index = None
        lazy = False
        Tensor = torch.Tensor
        for a in args:
            if isinstance(a, Tensor) and not a.is_cpu:
                st = a.untyped_storage()
                sd = getattr(st, "_tpu", None)
                if sd is None:
                    raise RuntimeError(
                        f"torchtpu.compile: graph {self.name} got a tensor on {a.device}; "
                        f"expected tpu or cpu tensors")
                if index is None:
                    index = sd.index
                elif sd.index != index:
                    raise RuntimeError(
                        f"Expected all tensors to be on the same device, but found at least "
                        f"two devices, tpu:{index} and tpu:{sd.index}!")
                j = slot_of.get(sd)  # one StorageData per storage
                if j is None:
                    j = slot_of[sd] = len(arrays)
                    # (no local name for the array: _own counts its references)
                    cls = sd.arr.__class__
                    if cls not in _NOT_CONCRETE:
                        arrays.append(sd.arr)
                    elif cls is _Lazy and stitch and sd.arr.node is not _st.ASYNC \
                            and (sd.arr.seg is not None or sd.arr.value is not None):
                        # a pending DeferAndFuse value (an earlier stitched graph's
                        # result): read in the same segment, or its value once run
                        arrays.append(sd.arr if sd.arr.value is None else sd.arr.value)
                        lazy = True
                    else:
                        arrays.append(sd.get(charge=False))
                    sdatas.append(sd)
                    storages.append(st)
                dt = a.dtype
                if a.is_neg() or (dt.is_complex and a.is_conj()):
                    spec = _st.view_spec(a, sd)
                else:
                    size = tuple(a.shape)
                    off = a.storage_offset()
                    spec = (size, dt) if (size == sd.shape and dt is sd.dtype and off == 0
                                          and a.is_contiguous()) \
                        else (size, dt, tuple(a.stride()), off, sd.shape, sd.dtype)
                key.append(("t", j, spec))
            elif isinstance(a, Tensor):
                key.append(_CPU_KEY)
            else:
                key.append(("v", a))
        return key, arrays, sdatas, storages, index, lazy

    def _stitch_node(self, key, args, arrays, host_vals, keys, sdatas, index):
        """The layout ``key``'s pure function as a DeferAndFuse node (see STITCH):
        ``(node, n_new, written, check_info, assemble)``.  Traces
        the graph once (``jax.eval_shape``: its outputs' shapes); nothing is compiled
        here -- the segment holding the call is."""
        jax = runtime.jax()
        from torchtpu.eager import executables

        t0 = time.perf_counter()
        self._args = args
        try:
            env0, host_in, meta, _ = self._trace_inputs(key)
            fn, result = self._make_fn(key, sdatas, len(arrays), meta, env0, host_in)
        finally:
            self._args = None
        nh = len(host_vals)

        def traced(arrs, dyn):
            return fn(arrs, dyn[:nh], dyn[nh:])

        # traced once, here: the segment's program calls the jitted function, whose
        # trace JAX keeps (keyed by the arguments' shapes and dtypes), so the graph's
        # lowerings do not run a second time when the segment is traced (XLA inlines the
        # call); a segment replayed op by op (DeferAndFuse's churn rule) calls it too
        jitted = jax.jit(traced)
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
        out_avals = jax.eval_shape(jitted, avals, [*host_vals, *keys])
        M.compile["lowering_seconds"] += time.perf_counter() - t0
        _, n_new, written, check_info, assemble, _ = self._finish(None, result, None, meta)
        if not n_new and not written and not check_info:
            return None, 0, (), (), assemble
        node = executables.Executable(None, None, (), index)
        node.traced = jitted
        node.out_avals = list(out_avals)
        node.name = f"graph:{self.name}"
        node.jitted = jitted

        def first_call(arrs, dyn):
            t1 = time.perf_counter()
            outs = node.jitted(arrs, dyn)
            M.compile["executables"] += 1
            M.compile["xla_seconds"] += time.perf_counter() - t1
            node.call = node.jitted
            return outs

        node.call = first_call
        node.compiled = True
        return node, n_new, written, check_info, assemble

    def _run_effects(self, values) -> None:
        """The graph's effect-token checks (:func:`strip_effects`), in graph order, on
        the CPU copies of the values the executable returned for them: PyTorch's CPU
        kernel raises its own error (``torch.linalg.LinAlgError`` naming the API and the
        failing matrix, as CPU and eager tpu do).  A host sync (``host_syncs``
        cause ``"effect_check"``)."""
        M.sync("effect_check")
        for (_, op, rest, kwargs), v in zip(self.effects, values):
            op(torch.from_numpy(np.array(v)), *rest, **kwargs)

    def _prepare(self, key, args, arrays, host_vals, keys, sdatas, index):
        """First call with layout ``key``: ``(written input slots, executable tuple)``,
        the executable compiled (or loaded) for it, the written inputs' old buffers made
        safe to donate (:func:`_own`)."""
        written_slots = self._plan(key)
        if written_slots:
            inflight.clear_last()  # synchronize() waits on this call's outputs
            _own(arrays, written_slots)
        ex = self.executables.get(key)
        if ex is None:
            self._args = args
            try:
                ex = self._compile(key, arrays, host_vals, keys, sdatas, index, written_slots)
            finally:
                self._args = None
            self.executables[key] = ex
        else:
            M.compile["cache_hits"] += 1
        compiled, n_new, written, check_info, assemble, split = ex
        if not n_new and not written and not check_info and split is None \
                and self.group is None and not self.effects:
            ex = (None,) + ex[1:]
        return written_slots, ex

    def _late(self, args, late) -> None:
        """The host part's ``copy_`` into CPU inputs (an optimizer's step counters), after
        the executable is dispatched: one ``torch._foreach_copy_`` (PyTorch's CPU kernel
        copies them one by one, as ``copy_``) when every value is a tensor and the inputs
        are distinct tensors that do not require grad, else ``copy_`` one by one."""
        if self.late_foreach:
            dsts = [args[i] for i, _ in late]
            if not any(d.requires_grad for d in dsts):
                torch._foreach_copy_(dsts, [v for _, v in late])
                return
        for i, src in late:
            args[i].copy_(src)

    def _pack_host(self, feeds, key):
        """The host values the executable reads (CPU tensors among ``feeds``), packed into
        one flat numpy array per dtype (one host-to-device transfer each); their shapes
        and dtypes are appended to ``key``."""
        groups: dict = {}
        Tensor = torch.Tensor
        for v in feeds:
            if isinstance(v, Tensor) and v.is_cpu:
                dt = v.dtype
                shape = tuple(v.shape)
                key.append(("h", shape, dt))
                g = groups.get(dt)
                if g is None:
                    groups[dt] = ([v], {shape})
                else:
                    g[0].append(v)
                    g[1].add(shape)
            else:
                key.append(_NOT_FED)
        # values of one shape (an optimizer's step counters): one torch.stack, a new array
        # (the feeds are not copied into the CPU inputs before the executable reads it);
        # never a numpy view of an input itself, which would leave it not resizable
        return [torch.stack(vs).detach().numpy().reshape(-1) if len(vs) > 1 and len(shapes) == 1
                else torch.cat([v.detach().reshape(-1) for v in vs]).numpy()
                for vs, shapes in groups.values()]

    def _plan(self, key):
        """The input slots the graph writes (``copy_`` into an input's storage), from the
        call's input layout ``key``: their old buffers may be donated."""
        slots = set()
        for i in self.mutated_inputs:
            k = key[i]
            if k[0] == "t":
                slots.add(k[1])
        return tuple(sorted(slots))

    def _build_host_fn(self):
        """The host nodes as one generated Python function (``torch.fx`` code):
        ``f(*inputs) -> (feeds, late, outs)``: the values of ``self.host_feed``, the
        ``(input position, value)`` pairs to copy into CPU inputs after the call, and the
        values of the host nodes the graph returns (``self.host_outs``)."""
        self.late_foreach = False
        if not self.host_calls:
            return None
        g = torch.fx.Graph()
        m = {}
        pos = {}
        for i, n in enumerate(self.placeholders + self.get_attrs):
            m[n] = g.placeholder(f"in{i}")
            pos[n] = i
        # a host node that reads only the shape of a tpu value (``zeros_like(x,
        # device="cpu")``) gets an uninitialized CPU tensor of that geometry instead
        stand_ins = {}

        def stand_in(a, chain):
            if a not in stand_ins:
                if chain is None:  # static geometry
                    v = a.meta["val"]
                    stand_ins[a] = g.call_function(
                        torch.empty_strided, (tuple(v.shape), tuple(v.stride())),
                        {"dtype": v.dtype, "device": "cpu"})
                else:  # the input's geometry at this call, then the same views of it
                    cur = g.call_function(_cpu_stand_in, (m[chain[0].args[0] if chain
                                                           else a],))
                    for vn in chain:
                        cur = g.node_copy(vn, lambda x, cur=cur, vn=vn:
                                          cur if x is vn.args[0] else bring(x))
                    stand_ins[a] = cur
            return stand_ins[a]

        def bring(x):
            # a host node's input: already in the host graph, or size arithmetic on the
            # call's sizes (x.numel() of a symbolic-shape input, x[1:].size(0)) copied in
            # on first use, reading the geometry of a view of an input from its stand-in
            if x in m:
                return m[x]
            if x.op == "call_function" and (_is_sym_fn(x.target) or x.target in _SYM_OPS):
                m[x] = g.node_copy(x, bring)
                return m[x]
            chain = _view_chain(x)
            if chain is not None and x not in self.host:
                return stand_in(x, chain)
            raise NotImplementedError(
                f"torchtpu.compile: host node input {x.name} ({x.target}) of graph "
                f"{self.name} is computed on the device")

        late = []
        for n in self.host_calls:
            for a in n.all_input_nodes:
                if a not in self.host and a not in stand_ins and _metadata_input(n, a):
                    stand_in(a, _view_chain(a))
        for n in self.host_calls:
            if n.target is aten.copy_.default and n.args[0].op == "placeholder":
                src = n.args[1]
                late.append((pos[n.args[0]], m[src] if isinstance(src, torch.fx.Node) else src))
                m[n] = m[n.args[0]]
                continue
            m[n] = g.node_copy(n, lambda x: stand_ins[x] if x in stand_ins
                               and x not in self.host else bring(x))
        feeds = tuple(m[n] for n in self.host_feed)
        outs = tuple(m[n] for n in self.host_outs)
        srcs = [n.args[1] for n in self.host_calls
                if n.target is aten.copy_.default and n.args[0].op == "placeholder"]
        dsts = [p for p, _ in late]
        self.late_foreach = len(late) > 1 and len(set(dsts)) == len(dsts) and all(
            isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)
            for a in srcs)
        g.output((feeds, tuple(late), outs))
        return torch.fx.GraphModule(torch.nn.Module(), g).forward

    # ------------------------------------------------------------------ build
    def _trace_inputs(self, key):
        """What tracing the layout ``key`` starts from (``self._args`` the call's
        arguments): the input nodes' values (view specs of tensor slots, or the argument),
        where each fed host node sits in the packed per-dtype host arrays, the fake values
        of every node at this call's shapes, and whether those are the graph's own (its
        traced shapes: the on-disk executable cache may hold the executable)."""
        inputs = self.placeholders + self.get_attrs
        env0 = {}
        for i, n in enumerate(inputs):
            env0[n] = key[i] if key[i][0] == "t" else self._args[i]
        # host values: where each fed node sits in the packed per-dtype arrays
        host_in, offs, gpos = [], {}, {}
        for f, n in enumerate(self.host_feed):
            k = key[len(inputs) + f]
            if k[0] != "h":
                continue
            _, shape, dt = k
            g = gpos.setdefault(dt, len(gpos))
            o = offs.get(dt, 0)
            size = math.prod(shape)
            offs[dt] = o + size
            host_in.append((n, g, o, size, shape))
        register_pytree()
        if self.symbolic or _geometry_differs(self.placeholders, self._args):
            meta = _substituted_metas(self.gm, self.placeholders, self._args) \
                if self.symbolic else None
            if meta is None:
                meta = _concrete_metas(self.gm, self.placeholders, self._args)
            return env0, host_in, meta, False
        return env0, host_in, {n: n.meta.get("val") for n in self.nodes}, True

    def _compile(self, key, arrays, host_vals, keys, sdatas, index, donate=()):
        """Trace, lower and compile the executable for the input layout ``key``;
        ``donate``: the input slots whose buffers it takes (written inputs only)."""
        jax = runtime.jax()
        env0, host_in, meta, exact = self._trace_inputs(key)
        c = M.compile
        store = None
        if exact:
            if self.dump_prefix is None and self.group is None and not self.effects:
                # the on-disk executable cache (torchtpu.compile.executable_cache): a second
                # process loads the executable and skips the JAX trace and lowering
                store = executable_cache.executable_path(self, key, donate)
                rec = executable_cache.load_executable(store, index) if store else None
                if rec is not None:
                    compiled, result, used = rec
                    c["executables"] += 1
                    return self._finish(compiled, result, _split(used, len(arrays)), meta)
        fn, result = self._make_fn(key, sdatas, len(arrays), meta, env0, host_in)
        n_inputs = len(arrays)
        from jax.sharding import SingleDeviceSharding

        sharding = SingleDeviceSharding(runtime.jax_device(index))
        spmd = None
        split = None if self.group is not None else _split(donate, n_inputs)
        if self.group is not None:
            spmd = _SPMD(self.group, index, fn, result)
            jitted = spmd.jitted
            call_args = spmd.global_args(arrays, host_vals, keys)
        elif donate:
            don_slots, kept_slots = split

            def fn_split(don, kept, host_vals, keys):
                arrs = [None] * n_inputs
                for j, x in zip(don_slots, don):
                    arrs[j] = x
                for j, x in zip(kept_slots, kept):
                    arrs[j] = x
                return fn(arrs, host_vals, keys)

            jitted = jax.jit(fn_split, donate_argnums=(0,), out_shardings=sharding)
            call_args = ([arrays[j] for j in don_slots], [arrays[j] for j in kept_slots],
                         host_vals, keys)
        else:
            jitted = jax.jit(fn, out_shardings=sharding)
            call_args = (arrays, host_vals, keys)
        t0 = time.perf_counter()
        lowered = jitted.lower(*call_args)
        t1 = time.perf_counter()
        if donate and not set(donate) <= set(result["written"]):
            # a donated buffer the graph does not write back would be lost: no donation
            c["lowering_seconds"] += t1 - t0
            return self._compile(key, arrays, host_vals, keys, sdatas, index, ())
        if self.dump_prefix is not None:
            from torchtpu.compile import dump

            k = len(self.executables)  # executables of this graph built before this one
            dump.write(f"{self.dump_prefix}{f'.exe{k}' if k else ''}.stablehlo.mlir",
                       lowered.as_text())
            t0 += time.perf_counter() - t1  # the dump is neither lowering nor XLA time
            t1 = time.perf_counter()
        pc_hits = M.persistent_cache["hits"]
        # an executable stored in the graph cache is compiled here, not loaded from JAX's
        # cache (which XLA:CPU could not serialize again)
        with persistent_cache.bypassed() if store is not None else contextlib.nullcontext(), \
                _metrics.compile_kind("graph"):
            compiled = lowered.compile()
        if spmd is not None:
            compiled = spmd.runner(compiled)
        t2 = time.perf_counter()
        if M.persistent_cache["hits"] != pc_hits:
            # loaded from JAX's persistent cache: XLA:CPU cannot serialize such an
            # executable again (the copy misses its functions), so it is not stored
            store = None
        c["lowering_seconds"] += t1 - t0
        c["xla_seconds"] += t2 - t1
        c["executables"] += 1
        M.compiles += 1
        M.compile_seconds += t2 - t0
        if store is not None:
            executable_cache.save_executable(store, compiled, result, donate)
        return self._finish(compiled, result, split, meta)

    def _make_fn(self, key, sdatas, n_inputs, meta, env0, host_in):
        """The executable's pure function ``fn(arrays, host_vals, keys) -> outputs`` for
        the input layout ``key`` (the graph's nodes through their lowerings), and the
        ``result`` dict its trace fills (output storage slots, written inputs, checks)."""
        jax = runtime.jax()
        table = ops.table()
        slot_dtypes = [sd.dtype for sd in sdatas]
        nodes = self.nodes
        host = self.host
        random_pos = {n: i for i, n in enumerate(self.random)}
        result = {}  # filled by the trace: output storage slots, written inputs, checks
        prec = key[-2][1]  # the float32 matmul precision setting (see __call__)
        seq = self.seq_plan if len(key) > 2 and key[-3] == _SEQ_KEY else None  # (seq_buckets)

        def fn(arrays, host_vals, keys):
            jnp = jax.numpy
            storages = list(arrays)  # slot -> array (inputs first, then new storages)
            sdt = list(slot_dtypes)
            env = dict(env0)
            for n, g, o, size, shape in host_in:
                env[n] = ("c", host_vals[g][o:o + size].reshape(shape))
            written = {}
            checks = []
            seq_n = host_vals[-1] if seq is not None else None

            def read(v):
                if isinstance(v, tuple) and v and v[0] == "t":
                    return _st.read_view(storages[v[1]], v[2])
                if isinstance(v, tuple) and v and v[0] == "c":
                    return v[1]
                raise AssertionError(v)

            def new_storage(r, fake):
                size, stride = tuple(fake.shape), tuple(fake.stride())
                p = _st.dense_permutation(size, stride)
                if p == "nondense" or fake.storage_offset() != 0:
                    # a result PyTorch gives as a strided part of a larger storage, or at
                    # an offset in one (``copy`` into a slice keeps the slice's layout;
                    # later view nodes take their strides and offsets in that storage):
                    # the values are written into a storage of that size
                    elems = _storage_elems(fake)
                    if elems is not None:
                        spec = _spec(fake, (elems,), fake.dtype)
                        storages.append(_st.write_view(jnp.zeros((elems,), r.dtype), spec, r))
                        sdt.append(fake.dtype)
                        return ("t", len(storages) - 1, spec)
                    if p == "nondense":
                        p = None
                        fake = torch.empty_strided(size, _st.contiguous_strides(size),
                                                   dtype=fake.dtype, device="meta")
                if p is not None:
                    r = jnp.transpose(r, p)
                storages.append(r)
                sdt.append(fake.dtype)
                j = len(storages) - 1
                return ("t", j, _spec(fake, r.shape, fake.dtype))

            def arg(v, kind, default, static):
                if kind in (T, OPT_T):
                    if v is None:
                        return None
                    if isinstance(v, tuple) and v and v[0] in ("t", "c"):
                        return read(v)
                    if isinstance(v, (bool, int, float, complex)):
                        kd = type(v) if type(v) in _SCALAR_NP else float
                        return Scalar(jnp.asarray(v, _SCALAR_NP[kd]), kd)
                    raise NotImplementedError(f"torchtpu.compile: tensor argument {v!r}")
                if kind in (T_LIST, OPT_T_LIST):
                    return [None if x is None else read(x) for x in v]
                if kind in (SCALAR, OPT_SCALAR):
                    if v is None or static or v is default:
                        return v
                    if isinstance(v, tuple) and v and v[0] in ("t", "c"):
                        raise NotImplementedError(
                            "torchtpu.compile: a tensor passed as a Scalar argument")
                    kd = type(v) if type(v) in _SCALAR_NP else float
                    return Scalar(jnp.asarray(v, _SCALAR_NP[kd]), kd)
                if kind == GEN:
                    return None
                return v

            for n in nodes:
                if n.op != "call_function" or n in host:
                    continue
                t = n.target
                if t is operator.getitem:
                    env[n] = env[n.args[0]][n.args[1]]
                    continue
                a, kw = _map(n.args, env), _map(n.kwargs, env)
                if not isinstance(t, torch._ops.OpOverload):  # SymInt arithmetic
                    env[n] = t(*a, **kw)
                    continue
                if t in _SYM_OPS:
                    env[n] = _SYM_OPS[t](meta[n.args[0]], *a[1:])
                    continue
                if t in ASSERT_ASYNC:
                    from torchtpu.ops import decomp_overrides as _dec

                    fake = meta[n.args[0]]
                    if fake.numel() != 1:
                        raise RuntimeError(_dec.ambiguous_bool(fake.numel()))
                    msg = a[1] if len(a) > 1 else kw.get("assert_msg",
                                                         _dec.ASSERT_ASYNC_MESSAGE)
                    checks.append((read(a[0]).reshape(()) == 0, RuntimeError, msg))
                    env[n] = None
                    continue
                if t in SCALAR_ASSERTS:
                    # a range assert on concrete sizes (constant for this executable)
                    if t is aten._assert_scalar.default and not a[0]:
                        raise RuntimeError(a[1] if len(a) > 1 else kw.get("assert_msg"))
                    env[n] = None
                    continue
                val = meta[n]
                if t is _coll.WAIT:  # XLA orders the collective before its readers
                    env[n] = a[0]
                    continue
                if seq is not None and n in seq.cats:  # an append at the runtime length
                    d, _ = seq.cats[n]
                    parts = [read(x) for x in a[0]]
                    new = parts[1] if len(parts) == 2 else jnp.concatenate(parts[1:], d)
                    r = _seq.append(jax, parts[0], new, d, seq_n)
                    env[n] = new_storage(r, torch.empty(r.shape, dtype=val.dtype,
                                                        device="meta"))
                    continue
                if t in _coll.LOWERED:
                    fakes = list(val) if isinstance(val, (list, tuple)) else [val]
                    def carg(v):
                        if isinstance(v, list):
                            return [carg(x) for x in v]
                        if isinstance(v, tuple) and v and v[0] in ("t", "c"):
                            return read(v)
                        return v

                    cargs = [carg(v) for v in a]
                    res = _coll.lower(t, cargs, fakes, len(self.group))
                    vs = [new_storage(r, f) for r, f in zip(res, fakes)]
                    env[n] = vs if isinstance(val, (list, tuple)) else vs[0]
                    continue
                if t is aten.copy_.default:
                    dst, src = a[0], a[1]
                    j, spec = dst[1], dst[2]
                    r = read(src) if not isinstance(src, (int, float, bool)) else jnp.asarray(src)
                    r = jnp.broadcast_to(r.astype(runtime.to_np_dtype(val.dtype)), tuple(val.shape))
                    storages[j] = _st.write_view(storages[j], spec, r)
                    if j < n_inputs:
                        written[j] = True
                    env[n] = dst
                    continue
                if t in _EMPTY:
                    env[n] = new_storage(jnp.zeros(tuple(val.shape),
                                                   runtime.to_np_dtype(val.dtype)), val)
                    continue
                if t is aten._unsafe_view.default or t is aten.lift_fresh_copy.default:
                    env[n] = new_storage(read(a[0]).reshape(tuple(val.shape)), val)
                    continue
                low = table.get(t)
                sig = _sig(t)
                if low is None and foreach_element_op(t) is not None:
                    # _foreach_*: the element op's lowering, once per list element
                    fe = foreach_element_op(t)
                    flow, fsig = table[fe], _sig(fe)
                    vals = sig.normalize(a, kw)
                    n_el = next(len(v) for v, k in zip(vals, sig.kinds) if k == T_LIST)
                    lists = [k == T_LIST or str(sig.args[i].type) in (
                        "List[Scalar]", "List[number]") for i, k in enumerate(sig.kinds)]
                    vs = []
                    for e in range(n_el):
                        ev = [v[e] if is_list else v for v, is_list in zip(vals, lists)]
                        ev += fsig.defaults[len(ev):]
                        largs = [arg(v, k, d, flow.static_scalars)
                                 for v, k, d in zip(ev, fsig.kinds, fsig.defaults)]
                        f = val[e]
                        res, ch = call_lowering(flow, fe, largs,
                                                [(tuple(f.shape), tuple(f.stride()), f.dtype)],
                                                precision=prec)
                        checks.extend(ch)
                        vs.append(new_storage(res[0], f))
                    env[n] = vs
                    continue
                if low is None and sig.is_view:
                    base = a[0]
                    j = base[1]
                    sshape = storages[j].shape
                    if isinstance(val, torch.Tensor):
                        env[n] = ("t", j, _spec(val, sshape, sdt[j]))
                    else:
                        env[n] = [("t", j, _spec(f, sshape, sdt[j])) for f in val]
                    continue
                vals = sig.normalize(a, kw)
                for i, v in self.overrides.get(n, {}).items():
                    vals[i] = v
                if seq is not None and n in seq.attns:  # the keys past the length: -inf
                    kcap = read(vals[1]).shape[2]
                    vals[3] = ("c", _seq.key_bias(jax, kcap, seq_n + seq.k, read(vals[0]).dtype))
                largs = [arg(v, k, d, low.static_scalars)
                         for v, k, d in zip(vals, sig.kinds, sig.defaults)]
                fakes = val if isinstance(val, (list, tuple)) else [val]
                fakes = flatten(fakes)
                out_meta = [None if f is None or not isinstance(f, torch.Tensor)
                            else (tuple(f.shape), tuple(f.stride()), f.dtype) for f in fakes]
                k = keys[random_pos[n]] if low.random else None
                try:
                    res, ch = call_lowering(low, t, largs, out_meta, k, prec)
                except (TypeError, ValueError) as e:
                    raise RuntimeError(
                        f"torchtpu.compile: lowering {t} failed in graph node {n.name}: {e}"
                    ) from e
                checks.extend(ch)
                vs = [None if r is None else new_storage(r, f) for r, f in zip(res, fakes)]
                if isinstance(val, torch.Tensor):
                    env[n] = vs[0]
                elif isinstance(val, list):
                    env[n] = vs
                else:
                    env[n] = tuple(vs)
            outs = flatten(list(self.output.args[0]))
            out_slots = []
            for o in outs:
                v = env.get(o) if isinstance(o, torch.fx.Node) else None
                if isinstance(v, tuple) and v and v[0] == "t" and v[1] >= n_inputs \
                        and v[1] not in out_slots:
                    out_slots.append(v[1])
            wr = sorted(written)
            result["out_slots"] = out_slots
            result["written"] = wr
            result["checks"] = [(exc, msg) for _, exc, msg in checks]
            result["env"] = {o.name: env.get(o) for o in outs if isinstance(o, torch.fx.Node)}
            result["sdt"] = sdt
            result["shapes"] = [tuple(storages[j].shape) for j in out_slots]
            result["seq"] = seq is not None
            flags = (jnp.stack([jnp.any(b) for b, _, _ in checks]),) if checks else ()
            # the values of the effect-token checks (strip_effects), read on the host after
            eff = tuple(read(env[v]) if isinstance(v, torch.fx.Node)
                        else read(env[v[0]][v[1]]) if isinstance(v, tuple)
                        else jnp.asarray(v) for v, _, _, _ in self.effects)
            return tuple(storages[j] for j in out_slots) + tuple(storages[j] for j in wr) \
                + eff + flags

        return fn, result

    def _finish(self, compiled, result, split, meta):
        """The executable's runtime tuple: the output plan and assembly (how each graph
        output is made from the executable's outputs, inputs and host values)."""
        host = self.host
        out_slots = result["out_slots"]
        slot_pos = {j: i for i, j in enumerate(out_slots)}
        out_env = result["env"]
        sdt = result["sdt"]
        shapes = result["shapes"]
        inputs = self.placeholders + self.get_attrs
        in_pos = {n: i for i, n in enumerate(inputs)}
        host_pos = {n: i for i, n in enumerate(self.host_outs)}
        # how each output is made, precomputed: (0, constant), (1, input position),
        # (2, host output position), (3, new array position, storage shape, storage
        # dtype, size, stride, offset, dtype), (4, input slot, size, stride, offset, dtype)
        plan = []
        bits = []  # (output position, conj, neg) of outputs that are conj/neg views
        for o in self.output.args[0]:
            if not isinstance(o, torch.fx.Node):
                plan.append((0, o))
                continue
            if o in host_pos:
                plan.append((2, host_pos[o]))
                continue
            empty = _eval_bn_stat(o, self.name)
            if empty is not None:
                plan.append((0, empty))
                continue
            if o in host or o.op in ("placeholder", "get_attr"):
                # an input returned as is (a forward's saved inputs): the input tensor
                # itself, as Inductor's code returns it
                plan.append((1, in_pos[o]))
                continue
            v = out_env[o.name]
            fake = meta[o]
            if v is None or isinstance(v, (bool, int, float)):
                # a size (SymInt arithmetic on this executable's concrete sizes)
                plan.append((0, v))
                continue
            if isinstance(v, list):
                raise NotImplementedError("torchtpu.compile: a Tensor[] graph output")
            _, j, spec = v
            if result.get("seq") and o in self.seq_plan.cats:  # a grown cache
                plan.append((5, slot_pos[j], self.seq_plan.cats[o][0], fake.dtype))
                continue
            if len(spec) > 6:
                bits.append((len(plan), spec[6], spec[7]))
            geo = (tuple(fake.shape), tuple(fake.stride()), int(fake.storage_offset()),
                   fake.dtype)
            if j in slot_pos:
                i = slot_pos[j]
                plan.append((3, i, shapes[i], sdt[j]) + geo)
            else:
                plan.append((4, j) + geo)
        n_new = len(out_slots)
        new_storage, tensor_on = _st.new_storage, _st.tensor_on

        def assemble(outs, storages, args, houts, index):
            # the C++ helper, once something loaded it (the first backward() installs its
            # device guard): one call makes a tensor on a storage (~3x cheaper than
            # storage.tensor_on's empty tensor + set_ redispatch); the same tensor
            native = state._native
            mk = tensor_on if native is None else native.make_on_storage
            made = [None] * n_new
            res = []
            for p in plan:
                k = p[0]
                if k == 3:
                    i = p[1]
                    st = made[i]
                    if st is None:
                        st = made[i] = new_storage(p[2], p[3], index, outs[i])
                    res.append(mk(st, p[4], p[5], p[6], p[7]))
                elif k == 4:
                    res.append(mk(storages[p[1]], p[2], p[3], p[4], p[5]))
                elif k == 0:
                    res.append(p[1])
                elif k == 5:
                    res.append(_seq.wrap_output(outs[p[1]], p[2], self._seq_len, p[3], index))
                elif k == 1:
                    res.append(args[p[1]])
                else:
                    res.append(houts[p[1]])
            for pos, conj, neg in bits:  # the view's lazy bits, on the same storage
                t = res[pos]
                if conj:
                    t = t.conj()
                if neg:
                    t = torch._neg_view(t)
                res[pos] = t
            return res

        check_info = result["checks"]
        return (compiled, n_new, result["written"], check_info, assemble, split)


class _SPMD:
    """A graph with collectives as one SPMD program over the group's devices.

    ``fn(arrays, host_vals, keys)`` (the graph on this process's arrays) becomes the body
    of a ``shard_map`` over the group's 1-D mesh (axis ``"r"``); every input and output
    is a global array sharded on dim 0 whose block ``i`` is group rank ``i``'s local
    array (0-d arrays travel as shape ``(1,)``), so a process passes its arrays as they
    are and reads back its own blocks."""

    def __init__(self, group, index, fn, result):
        from torchtpu.distributed import collectives as C

        jax = runtime.jax()
        self.jax = jax
        self.n = len(group)
        self.mesh = C.mesh(group)
        self.dev = runtime.jax_device(index)
        if self.dev not in list(self.mesh.devices.flat):
            raise RuntimeError(
                f"torchtpu.compile: the graph's collectives run over the devices "
                f"{list(self.mesh.devices.flat)} of ranks {list(group)}, but its tensors are "
                f"on {self.dev} (tpu:{index}); this process's tpu_dist device is the one "
                f"its collectives use")
        P = jax.sharding.PartitionSpec
        self.sharding = jax.sharding.NamedSharding(self.mesh, P("r"))
        self.in_scalar = None  # per flat input: 0-d
        self.out_scalar = result  # filled by the trace: "out_scalar"

        def body(arrays, host_vals, keys):
            sc = iter(self.in_scalar)
            unpack = [[x.reshape(()) if next(sc) else x for x in xs]
                      for xs in (arrays, host_vals, keys)]
            outs = fn(*unpack)
            result["out_scalar"] = [o.ndim == 0 for o in outs]
            return tuple(o.reshape((1,)) if o.ndim == 0 else o for o in outs)

        self.jitted = jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=(P("r"),) * 3,
                                            out_specs=P("r")))

    def _global(self, x):
        jax = self.jax
        if not isinstance(x, jax.Array) or x.ndim == 0:
            x = jax.device_put(np.reshape(x, (1,)) if np.ndim(x) == 0 else x, self.dev) \
                if not isinstance(x, jax.Array) else x.reshape((1,))
        return jax.make_array_from_single_device_arrays(
            (self.n * x.shape[0],) + tuple(x.shape[1:]), self.sharding, [x])

    def global_args(self, arrays, host_vals, keys):
        """The call's arguments as global arrays (this process's blocks)."""
        flat = list(arrays) + list(host_vals) + list(keys)
        if self.in_scalar is None:
            self.in_scalar = [np.ndim(x) == 0 for x in flat]
        g = self._global
        return ([g(x) for x in arrays], [g(x) for x in host_vals], [g(x) for x in keys])

    def runner(self, compiled):
        """``run(arrays, host_vals, keys) -> this process's outputs`` calling the compiled
        SPMD executable."""
        scalar = self.out_scalar["out_scalar"]
        global_args = self.global_args

        def run(arrays, host_vals, keys):
            outs = compiled(*global_args(arrays, host_vals, keys))
            return [o.addressable_data(0).reshape(()) if s else o.addressable_data(0)
                    for o, s in zip(outs, scalar)]

        return run


def _split(donate, n_inputs):
    """``(donated slots, kept slots)`` of an executable taking the buffers of ``donate``,
    None when it takes none."""
    if not donate:
        return None
    don = tuple(donate)
    return don, tuple(j for j in range(n_inputs) if j not in set(don))


def _device_side(nodes, host, output, table) -> set:
    """The host nodes (CPU tensors) that may run inside the executable instead: floating
    point ops with a lowering (no views, no mutation, no randomness, static shapes) whose
    values nothing on the host needs (not a graph output, not copied into a CPU input,
    not read by a host node that stays).  Their lowerings give the values PyTorch's CPU
    kernels give to within rounding (``pow`` may differ in the last bit)."""

    def movable(n):
        t = n.target
        if t is operator.getitem:
            return True  # follows its source, below
        if not isinstance(t, torch._ops.OpOverload) or t is aten.copy_.default or t in _EMPTY:
            return False
        sig = _sig(t)
        if sig.mutated or sig.is_view:
            return False
        low = table.get(t)
        if low is None:
            fe = foreach_element_op(t)
            low = table.get(fe) if fe is not None else None
        if low is None or low.random or low.dynamic_shape:
            return False
        vals = list(_fake_tensors(n.meta.get("val")))
        for a in n.all_input_nodes:
            vals += _fake_tensors(a.meta.get("val"))
        return bool(vals) and all(v.dtype.is_floating_point for v in vals)

    calls = [n for n in nodes if n in host and n.op == "call_function"]
    keep = {n for n in calls if not movable(n)}
    keep |= {o for o in flatten(list(output.args[0])) if isinstance(o, torch.fx.Node)
             and o in host}
    for n in reversed(nodes):  # what a kept node reads stays on the host too
        if n in keep:
            keep.update(a for a in n.all_input_nodes if a in host)
    for n in calls:  # an element of a kept list is read on the host
        if n.target is operator.getitem and n.args[0] in keep:
            keep.add(n)
    return {n for n in calls if n not in keep}


_EAGER = None


def _eager_modules():
    """``(torchtpu.eager.defer, torchtpu.eager.executor, torchtpu.eager.host_reads)``,
    imported at the first call (they import this package)."""
    global _EAGER
    from torchtpu.eager import defer, executor, host_reads

    _EAGER = (defer, executor, host_reads)
    if native.LOADED is not None:
        _native_ready(native.LOADED)
    else:
        native.ON_LOAD.append(_native_ready)
    return _EAGER


def _native_ready(mod) -> None:
    """The C++ helper is loaded: graph calls gather their inputs with its
    ``graph_gather`` (which answers None, sending the call to the Python loop, until the
    executor has set its hot path up)."""
    _GATHER[0] = mod.graph_gather


# Stitching (issue 33): a graph call is recorded as one node of the pending DeferAndFuse
# segment (eager.defer.record_graph) instead of launching its executable, in every eager
# mode.  The graphs of a training step -- forward, AOTAutograd's backward (no cut at
# backward() while a segment holds a graph: eager.autograd), the optimizer update --
# and, in DEFER_AND_FUSE mode, the eager ops between them then run as one XLA program,
# compiled once per step structure, its written inputs' old buffers donated when nothing
# else holds them, intermediates no one keeps never materialized.  The segment runs at
# the next sync point, when an eager STRICT op reads one of its values, or when a graph
# already in it is called again (the next step).  TORCHTPU_STITCH_GRAPHS=0: each call
# launches its own executable.
STITCH = os.environ.get("TORCHTPU_STITCH_GRAPHS", "1") != "0"
_UNSTITCHED = [0]  # depth of the open unstitched() blocks (process-wide)


@contextlib.contextmanager
def unstitched():
    """Within the block, each compiled graph call launches its own executable (as with
    ``TORCHTPU_STITCH_GRAPHS=0``) instead of joining the pending segment: for a graph
    that is a whole step by itself (a serving forward) and rewrites large inputs (KV
    caches) under its own device checks.  Stitched, such a graph keeps the old values of
    what it rewrote when a check fails by a select after it, which makes XLA copy every
    rewritten buffer (a 16 MiB cache per layer per step); launched alone, its writes land
    in the donated buffers and a failed check raises at the next sync point, as an eager
    op's does.  Process-wide (not per thread); blocks nest."""
    _UNSTITCHED[0] += 1
    try:
        yield
    finally:
        _UNSTITCHED[0] -= 1


_Lazy = _st.Lazy
_CPU_KEY = ("c",)
# the C++ helper's graph_gather once the helper is loaded and set up (_native_ready)
_GATHER = [None]
# StorageData.arr classes that StorageData.get() must resolve first (uninitialized storage,
# pending DeferAndFuse value)
_NOT_CONCRETE = (type(None), _st.Lazy, _st.Padded, _st.Grown)
_SEQ_KEY = ("seq_buckets",)  # a key entry: the call runs a bucketed executable
_NOT_FED = ("n",)
# sys.getrefcount of an input array held only by its storage: the storage's StorageData,
# the call's list of input arrays and getrefcount's own argument
_REFS_IF_ONLY_STORAGE = 3


def _own(arrays, slots) -> None:
    """Make the input arrays of the written ``slots`` safe to donate: an array held by
    anything but its storage (another storage sharing it, e.g. the small-constant cache
    of host-to-device copies; a DeferAndFuse value; a user's ``to_jax`` result) is
    replaced in ``arrays`` by a copy (one dispatch for all), which the graph then
    consumes; the storage gets the graph's result either way."""
    from torchtpu.eager import defer

    defer.own(arrays, slots, _REFS_IF_ONLY_STORAGE)


def _written_input(n, table):
    """The input (placeholder / get_attr) node whose storage ``copy_`` node ``n`` writes,
    following the view nodes the graph reads through their base's storage (views with no
    lowering), ``getitem`` of a multi-output view, and earlier ``copy_`` results; None
    when ``n`` writes a storage the graph made."""
    d = n.args[0]
    while isinstance(d, torch.fx.Node) and d.op == "call_function":
        t = d.target
        if t is operator.getitem or t is aten.copy_.default or (
                isinstance(t, torch._ops.OpOverload) and t not in table and _sig(t).is_view):
            d = d.args[0]
        else:
            return None
    if isinstance(d, torch.fx.Node) and d.op in ("placeholder", "get_attr"):
        return d
    return None


def _used_on_device(n, host) -> bool:
    return any(u not in host for u in n.users if u.op == "call_function")


def _map(a, env):
    if isinstance(a, torch.fx.Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_map(x, env) for x in a)
    if isinstance(a, dict):
        return {k: _map(v, env) for k, v in a.items()}
    return a
