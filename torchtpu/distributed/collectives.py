"""XLA collectives: one jitted ``shard_map`` computation per (collective, reduce op,
local shape, dtype, group).

A group is the tuple of JAX process indices of its ranks, in group-rank order; its mesh
has one axis ``"r"`` over those processes' devices (one device each).  Each process
contributes its local array as the block ``[i]`` of a global array of shape
``(n, *local_shape)`` (``jax.make_array_from_single_device_arrays``), the computation
runs the collective on axis ``"r"`` (``psum``, ``pmax``, ``all_gather``,
``psum_scatter``...), and the process reads back its own block.  On TPU the collectives
run over ICI, on GPU over NCCL, on CPU over gloo (JAX's CPU collectives).
"""

from __future__ import annotations

import functools

import numpy as np

from torchtpu._device import runtime
from torchtpu.distributed import bringup

# reduce ops, by name (torch.distributed.ReduceOp.RedOpType names)
SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR = (
    "SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


@functools.lru_cache(maxsize=None)
def mesh(procs: tuple):
    """The 1-D mesh (axis ``"r"``) over the devices of JAX processes ``procs``."""
    jax = runtime.jax()
    by_proc = bringup.process_devices()
    return jax.sharding.Mesh(np.array([by_proc[p] for p in procs]), ("r",))


def _reduce_stacked(g, op: str, n: int):
    """Reduce the gathered blocks ``g`` (shape ``(n, ...)``) over axis 0 with ``op``."""
    jnp = runtime.jax().numpy
    if op == PRODUCT:
        out = g[0]
        for i in range(1, n):
            out = out * g[i]
        return out
    fn = {BAND: jnp.bitwise_and, BOR: jnp.bitwise_or, BXOR: jnp.bitwise_xor,
          MIN: jnp.minimum, MAX: jnp.maximum}[op]
    out = g[0]
    for i in range(1, n):
        out = fn(out, g[i])
    return out


def _allreduce_block(x, op: str, n: int):
    """Traced, per device: the all-reduce of block ``x`` over axis ``"r"``."""
    jax = runtime.jax()
    lax = jax.lax
    if op in (SUM, AVG):
        if x.dtype == np.bool_:
            # a sum of bools is their OR (as gloo and nccl do)
            return lax.psum(x.astype(np.int32), "r") > 0
        s = lax.psum(x, "r")
        if op == AVG:
            if np.issubdtype(x.dtype, np.integer):
                s = lax.div(s, np.array(n, s.dtype))  # truncating, as NCCL's ncclAvg
            else:
                s = s / np.array(n, s.dtype)
        return s
    if op == MAX and x.dtype != np.bool_:
        return lax.pmax(x, "r")
    if op == MIN and x.dtype != np.bool_:
        return lax.pmin(x, "r")
    if x.dtype == np.bool_:
        op = {MAX: BOR, MIN: BAND, PRODUCT: BAND}.get(op, op)
    return _reduce_stacked(lax.all_gather(x, "r"), op, n)


def allreduce_block(x, op: str, n: int):
    """Traced inside a ``shard_map`` over axis ``"r"`` of ``n`` devices: this device's
    block ``x`` all-reduced with reduce op ``op`` (one of the names above; a sum of bools
    is their OR, AVG of integers truncates as NCCL's ``ncclAvg``)."""
    return _allreduce_block(x, op, n)


def broadcast_block(x, src: int):
    """Traced inside a ``shard_map`` over axis ``"r"``: group rank ``src``'s block ``x``."""
    return runtime.jax().lax.all_gather(x, "r")[src]


def allgather_block(x):
    """Traced inside a ``shard_map`` over axis ``"r"``: the blocks ``x`` (shape
    ``(d0, ...)``) of the group's ranks concatenated on dim 0 in group-rank order,
    ``(n * d0, ...)``."""
    return runtime.jax().lax.all_gather(x, "r", tiled=True)


def reduce_scatter_block(x, op: str, n: int):
    """Traced inside a ``shard_map`` over axis ``"r"`` of ``n`` devices: ``x`` of shape
    ``(n * k, ...)`` reduced over the group with ``op``, and this rank's rows
    ``[i * k, (i + 1) * k)`` (``i``: its group rank) of the result."""
    lax = runtime.jax().lax
    if op in (SUM, AVG) and x.dtype != np.bool_:
        s = lax.psum_scatter(x, "r", scatter_dimension=0, tiled=True)
        if op == AVG:
            if np.issubdtype(x.dtype, np.integer):
                s = lax.div(s, np.array(n, s.dtype))
            else:
                s = s / np.array(n, s.dtype)
        return s
    full = _allreduce_block(x, op, n)
    k = x.shape[0] // n
    return lax.dynamic_slice_in_dim(full, lax.axis_index("r") * k, k, 0)


def _body(kind: str, op: str | None, arg, n: int):
    """The per-device function of collective ``kind`` (traced inside the ``shard_map``)."""
    if kind == "allreduce":
        return lambda x: _allreduce_block(x, op, n)
    if kind == "broadcast":
        return lambda x: broadcast_block(x, arg)
    if kind == "allgather":  # (d0, ...) -> (n * d0, ...)
        return allgather_block
    if kind == "reduce_scatter":  # (n * k, ...) -> (k, ...)
        return lambda x: reduce_scatter_block(x, op, n)
    raise AssertionError(kind)


def _block_shape(kind: str, shape: tuple, n: int) -> tuple:
    """The shape of a rank's result block for an input block of ``shape``."""
    if kind == "allgather":
        return (n * shape[0],) + shape[1:]
    if kind == "reduce_scatter":
        return (shape[0] // n,) + shape[1:]
    return shape


@functools.lru_cache(maxsize=None)
def _program(kind: str, procs: tuple, shape: tuple, dtype, op: str | None, arg):
    """The jitted computation for one collective signature.  It takes and returns global
    arrays sharded on axis 0 over the group: block ``i`` (rows ``i*d0 .. (i+1)*d0``)
    belongs to group rank ``i``, so a process's local array is its block as is (no
    reshape dispatched on either side)."""
    jax = runtime.jax()
    P = jax.sharding.PartitionSpec
    f = jax.shard_map(_body(kind, op, arg, len(procs)), mesh=mesh(procs), in_specs=P("r"),
                      out_specs=P("r"))
    return jax.jit(f)


@functools.lru_cache(maxsize=None)
def _checked_program(kind: str, procs: tuple, shape: tuple, dtype, op: str | None, arg):
    """:func:`_program` with the cross-rank signature check inside: the program also takes
    each rank's int32 signature row (block ``(1, L)``), all-gathers the rows first, and
    runs the data collective only when every row equals rank 0's (``lax.cond``: every
    rank sees the same gathered rows, so all take the same branch; otherwise no data
    collective runs and each rank's result is zeros).  Ranks whose shapes differ run
    different programs, but both start with the same all-gather of the rows and then
    skip the data collective, so neither hangs.  Returns ``(result, rows, bad)``:
    ``rows`` of shape ``(n, L)`` and ``bad`` (bool ``(1,)``: the rows differ) on every
    rank."""
    jax = runtime.jax()
    jnp, lax = jax.numpy, jax.lax
    P = jax.sharding.PartitionSpec
    n = len(procs)
    inner = _body(kind, op, arg, n)
    out_shape = _block_shape(kind, shape, n)

    def body(x, sig):
        rows = lax.all_gather(sig, "r", tiled=True)  # (n, L)
        same = jnp.all(rows == rows[0])
        # (zeros rather than ``x`` on the skipped branch: returning the operand costs XLA
        # one more copy of it on every call, measured)
        res = lax.cond(same, inner, lambda x: jnp.zeros(out_shape, x.dtype), x)
        return res, rows, jnp.logical_not(same).reshape(1)

    f = jax.shard_map(body, mesh=mesh(procs), in_specs=(P("r"), P("r")),
                      out_specs=(P("r"), P("r"), P("r")), check_vma=False)
    return jax.jit(f)


_RUNS: dict = {}  # (kind, procs, shape, dtype, op, arg) -> (program, sharding, global shape)


def run(kind: str, procs: tuple, arr, op: str | None = None, arg=None):
    """Run collective ``kind`` on this process's local JAX array ``arr`` (already on its
    ``tpu`` device, at least 1-D) in the group ``procs``; returns this process's result
    (a JAX array on the same device).

    kinds: ``allreduce`` and ``broadcast`` (``arg``: the source's group rank): result
    shape = input shape; ``allgather``: ``(n * d0, ...)``; ``reduce_scatter``: input
    ``(n * k, ...)``, result ``(k, ...)``.  Per call: one dict lookup, the global array
    around ``arr`` (no copy) and the program's dispatch."""
    f, sharding, gshape, make = _entry(_RUNS, _program, kind, procs, arr, op, arg)
    return f(make(gshape, sharding, [arr])).addressable_data(0)


def _entry(cache: dict, build, kind: str, procs: tuple, arr, op, arg):
    """``(program, sharding, global shape, make_array)`` of collective ``kind`` on
    ``arr``'s shape and dtype, built by ``build`` (:func:`_program`,
    :func:`_checked_program`) once per signature and kept in ``cache``."""
    key = (kind, procs, arr.shape, arr.dtype, op, arg)
    ent = cache.get(key)
    if ent is None:
        jax = runtime.jax()
        shape = tuple(arr.shape)
        f = build(kind, procs, shape, np.dtype(arr.dtype), op, arg)
        sharding = jax.sharding.NamedSharding(mesh(procs), jax.sharding.PartitionSpec("r"))
        ent = cache[key] = (f, sharding, (len(procs) * shape[0],) + shape[1:],
                            jax.make_array_from_single_device_arrays)
    return ent


_CHECKED: dict = {}  # same, for _checked_program


def run_checked(kind: str, procs: tuple, arr, sig, op: str | None = None, arg=None):
    """:func:`run` with the signature check in the same XLA program.

    ``sig``: this rank's signature as a global int32 array of shape ``(n, L)`` (its block
    ``(1, L)`` on this process's device, :func:`signature_array`).  Returns ``(result,
    rows, bad)``: this process's result (when the rows differ no data collective ran:
    see :func:`_checked_program`), the ``(n, L)`` rows of every rank and the
    bool ``(1,)`` flag "the rows differ" (JAX arrays, not waited for)."""
    f, sharding, gshape, make = _entry(_CHECKED, _checked_program, kind, procs, arr, op, arg)
    out, rows, bad = f(make(gshape, sharding, [arr]), sig)
    return out.addressable_data(0), rows.addressable_data(0), bad.addressable_data(0)


def signature_array(procs: tuple, row, device):
    """The global ``(n, L)`` int32 array whose block on this process is ``row`` (a numpy
    int32 vector of length ``L``) on ``device``, for :func:`run_checked`."""
    jax = runtime.jax()
    local = jax.device_put(np.asarray(row, np.int32).reshape(1, -1), device)
    sharding = jax.sharding.NamedSharding(mesh(procs), jax.sharding.PartitionSpec("r"))
    return jax.make_array_from_single_device_arrays((len(procs), local.shape[1]), sharding,
                                                    [local])


def clear_caches() -> None:
    """Forget meshes and programs (the ranks' devices changed: a new default group)."""
    mesh.cache_clear()
    _program.cache_clear()
    _RUNS.clear()
    _checked_program.cache_clear()
    _CHECKED.clear()
