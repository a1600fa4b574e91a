"""Functional collectives (``torch.ops._c10d_functional``) inside a compiled graph.

``torch.compile(fn, backend="tpu")`` of a function that calls
``torch.distributed._functional_collectives`` (``all_reduce``, ``all_gather_tensor``,
``reduce_scatter_tensor``, ``wait_tensor``...), or a plain ``dist.all_reduce(t)`` that
Dynamo rewrites to them, gives an ATen graph with ``_c10d_functional.*`` nodes.  Such a
graph becomes one SPMD program over the devices of the collectives' process group: the
executable is a ``shard_map`` over a 1-D mesh (axis ``"r"``, the group's devices in
group-rank order, as eager's :mod:`torchtpu.distributed.collectives`), each process
passes its local tensors as its block of global arrays, the graph's ops run per block,
and each collective node lowers to the XLA collective on axis ``"r"`` (``psum``,
``all_gather``, ``psum_scatter``, ``all_to_all``).  ``wait_tensor`` is the identity: in
one executable XLA orders the collective before its readers.

Graphs this module cannot lower as one program -- collectives over more than one process
group, an ``all_to_all_single`` with uneven splits, point-to-point ops -- are run op by
op by eager instead (:func:`unsupported_reason`), with each collective a ``tpu_dist``
call; ``torchtpu.metrics()["compile"]`` counts both kinds.
"""

from __future__ import annotations

import torch

from torchtpu._device import runtime

try:
    _ns = torch.ops._c10d_functional
    # the functional collectives lowered inside the executable, and the argument holding
    # the group name
    LOWERED = {
        _ns.all_reduce.default: 2,
        _ns.all_reduce_coalesced.default: 2,
        _ns.all_gather_into_tensor.default: 2,
        _ns.all_gather_into_tensor_coalesced.default: 2,
        _ns.reduce_scatter_tensor.default: 3,
        _ns.reduce_scatter_tensor_coalesced.default: 3,
        _ns.all_to_all_single.default: 3,
        _ns.broadcast.default: 2,
    }
    WAIT = _ns.wait_tensor.default
except (AttributeError, RuntimeError):  # PyTorch built without torch.distributed
    _ns, LOWERED, WAIT = None, {}, None
_REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def is_collective(target) -> bool:
    """A ``_c10d_functional`` (or ``_c10d_functional_autograd``) op, lowered or not."""
    return isinstance(target, torch._ops.OpOverload) and target.namespace in (
        "_c10d_functional", "_c10d_functional_autograd")


def _group_ranks(name) -> tuple:
    """The global ranks (= JAX process indices, ``tpu_dist``) of the process group
    called ``name`` in a graph, in group-rank order."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    pg = name if isinstance(name, dist.ProcessGroup) else _resolve_process_group(name)
    return tuple(dist.get_process_group_ranks(pg))


def graph_collectives(nodes, host=()) -> list:
    """The ``_c10d_functional`` nodes of a graph that run on the device (not in
    ``host``), ``wait_tensor`` excluded."""
    return [n for n in nodes if n.op == "call_function" and n not in host
            and is_collective(n.target) and n.target is not WAIT]


def unsupported_reason(nodes) -> str | None:
    """Why the collective nodes ``nodes`` cannot be lowered into one SPMD executable
    (text for the metrics and the log), or None when they can."""
    groups = set()
    for n in nodes:
        t = n.target
        if t not in LOWERED:
            return f"{t} has no lowering inside a compiled graph"
        groups.add(_group_ranks(n.args[LOWERED[t]]))
        if t in (_ns.all_reduce.default, _ns.all_reduce_coalesced.default,
                 _ns.reduce_scatter_tensor.default, _ns.reduce_scatter_tensor_coalesced.default):
            op = str(n.args[1]).upper()
            if op not in _REDUCE_OPS:
                return f"{t} with reduce op {n.args[1]!r}"
        if t is _ns.all_to_all_single.default:
            out_s, in_s = n.args[1], n.args[2]
            if not all(isinstance(s, int) for s in list(out_s) + list(in_s)) or \
                    len(set(out_s) | set(in_s)) > 1:
                return f"{t} with uneven or symbolic splits {list(out_s)}, {list(in_s)}"
    if len(groups) > 1:
        return f"collectives over {len(groups)} process groups {sorted(groups)} in one graph"
    return None


def group_of(nodes) -> tuple:
    """The group (global ranks in group-rank order) of the collective nodes ``nodes``
    (all in one group: :func:`unsupported_reason` is None)."""
    t = nodes[0].target
    return _group_ranks(nodes[0].args[LOWERED[t]])


def lower(target, args, vals, n: int):
    """Traced inside the graph's ``shard_map`` over axis ``"r"`` (``n`` devices): the
    result(s) of collective ``target`` on this device's arrays.

    Args:
        target: a :data:`LOWERED` op.
        args: its arguments, tensors as JAX arrays in their tensor's shape (lists of
            them for the coalesced ops).
        vals: the node's fake output(s) (list), for the result shapes.
    Returns:
        the list of result arrays, one per output tensor.
    """
    from torchtpu.distributed import collectives as C

    jax = runtime.jax()
    if target is _ns.all_reduce.default:
        return [C.allreduce_block(args[0], str(args[1]).upper(), n)]
    if target is _ns.all_reduce_coalesced.default:
        return [C.allreduce_block(x, str(args[1]).upper(), n) for x in args[0]]
    if target in (_ns.all_gather_into_tensor.default,
                  _ns.all_gather_into_tensor_coalesced.default):
        xs = args[0] if target is _ns.all_gather_into_tensor_coalesced.default else [args[0]]
        return [C.allgather_block(x.reshape((1,)) if x.ndim == 0 else x).reshape(tuple(v.shape))
                for x, v in zip(xs, vals)]
    if target in (_ns.reduce_scatter_tensor.default,
                  _ns.reduce_scatter_tensor_coalesced.default):
        xs = args[0] if target is _ns.reduce_scatter_tensor_coalesced.default else [args[0]]
        op = str(args[1]).upper()
        out = []
        for x, v in zip(xs, vals):
            if x.ndim == 0 or x.shape[0] % n:
                x = x.reshape(-1)  # (n * k,), as eager's reduce_scatter_tensor
            out.append(C.reduce_scatter_block(x, op, n).reshape(tuple(v.shape)))
        return out
    if target is _ns.all_to_all_single.default:
        x = args[0]
        return [jax.lax.all_to_all(x, "r", 0, 0, tiled=True).reshape(tuple(vals[0].shape))]
    if target is _ns.broadcast.default:
        return [C.broadcast_block(args[0], int(args[1]))]
    raise AssertionError(target)
