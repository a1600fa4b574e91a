"""Bucketed executables for compiled graphs over a growing sequence (a KV cache).

A decoding step compiled with ``torch.compile`` (HF ``generate()`` with the default
``DynamicCache`` under ``torch.compile(model.forward, backend="tpu")``) is a graph whose
only symbolic sizes are the cache's length ``s``: the cache tensors come in
``[..., s, ...]``, each is extended by ``torch.cat([cache, new], dim)`` to ``s + k``, the
attention reads the extended keys and values, and the graph returns them.  Compiled per
concrete length, every decoded token is a new XLA executable.

This module recognizes that pattern (:func:`analyze`) and runs such a graph on a
*capacity* ``C`` (a power of two, at least 16, and 128 while the caches are small: see
:func:`capacity`) instead of the length: the cache inputs are
passed as ``C``-long arrays with zeros past their length ``n`` (``storage.Grown``, the
representation of ``eager.growth`` and ``eager.padded``), ``n`` is a runtime value of the
executable, the ``cat`` writes the new entries at offset ``n``
(``lax.dynamic_update_slice``, :func:`append`) and the attention gets a ``-inf`` bias on
the keys past ``n + k`` (:func:`key_bias`).  The graph's outputs are the extended caches,
again ``C``-long with zeros past ``n + k``: the next step passes them back as they are.
One executable serves every length up to ``C``; a cache that outgrows ``C`` is moved to
``2C`` on the device (:func:`capacity_array`), so a sequence of ``L`` tokens compiles
about ``log2(L / 128)`` executables (one up to 128).

Values are those of the exact executable: the padded keys get probability 0 (their
scores are ``-inf`` before the softmax) and the new entries land where ``cat`` puts them.

The pattern, checked on the graph (anything else compiles per concrete length, as
before): every symbolic size in the graph is a cache input's length along one dim, a
``cat`` of such an input (first) with static tensors along that dim, or nothing else;
the ``cat`` results are read only by ``torchtpu_attn::flash_fwd`` as keys or values
(no bias, not causal: a decoding step's query attends to every key) and by the graph's
output; SymInt inputs are not read by any node; the graph writes no input.

``TORCHTPU_SEQ_BUCKETS=0`` (or :func:`set_enabled`) turns this off for graphs compiled
after it: every length compiles its own executable, as before.

Counters (``torchtpu.metrics()["compile"]``): ``seq_bucket_calls`` (calls that ran a
bucketed executable), ``seq_bucket_moves`` (cache inputs moved to a new capacity on the
device).
"""

from __future__ import annotations

import os

import torch

from torchtpu import _metrics
from torchtpu._device import runtime
from torchtpu._tensor import storage as _st
from torchtpu.eager import growth as _growth

aten = torch.ops.aten
M = _metrics.METRICS

MIN_CAPACITY = 16

_ENABLED = [os.environ.get("TORCHTPU_SEQ_BUCKETS", "1") != "0"]


def set_enabled(enabled: bool) -> None:
    """Turn bucketed decoding-step executables on or off for graphs compiled from now on
    (``TORCHTPU_SEQ_BUCKETS=0`` at start-up: off)."""
    _ENABLED[0] = bool(enabled)


def enabled() -> bool:
    """Whether graphs compiled now get bucketed executables where they match."""
    return _ENABLED[0]


def _flash_fwd():
    from torchtpu.ops import sdpa  # noqa: F401  (defines torchtpu_attn::flash_fwd)

    return torch.ops.torchtpu_attn.flash_fwd.default


def _free(v) -> set:
    """The size symbols fake value ``v`` (a tensor, a SymInt, a list of them) depends on."""
    if isinstance(v, torch.Tensor):
        items = (*v.shape, *v.stride(), v.storage_offset())
    elif isinstance(v, (list, tuple)):
        return set().union(*(_free(x) for x in v)) if v else set()
    elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return set(_sym_expr(v).free_symbols)
    else:
        return set()
    out = set()
    for x in items:
        if isinstance(x, torch.SymInt):
            out |= _sym_expr(x).free_symbols
    return out


class Plan:
    """How a graph runs bucketed.

    Attributes:
        caches: ``[(input position, dim)]``: the cache inputs and their growing dim.
        symints: input positions of SymInt inputs that are a cache length (given the
            capacity at trace time; no node reads them).
        cats: ``{cat node: (dim, k)}``: the appends, ``k`` the static entries added.
        attns: the ``flash_fwd`` nodes that read the appended keys and values.
        k: the entries one call appends (the same for every ``cat``).

    Symbols other than the cache lengths (``dynamic=True`` makes every size symbolic)
    keep their concrete values, as in the exact executables.
    """

    __slots__ = ("caches", "symints", "cats", "attns", "k")


def analyze(nodes, placeholders, output_node) -> Plan | None:
    """The :class:`Plan` of a graph (its ``nodes``, ``placeholders`` and output node),
    or None when it is not the growing-cache pattern of the module docstring (or when
    :func:`enabled` is False)."""
    if not _ENABLED[0]:
        return None
    sympy = _sympy()
    flash = _flash_fwd()
    is_ph = set(placeholders)
    # the appends: cat([cache input, static-length tensors...], d), the cache's length
    # along d a bare symbol
    cache_dim, syms, cats = {}, set(), {}
    for n in nodes:
        if n.op != "call_function" or n.target is not aten.cat.default:
            continue
        tensors = n.args[0]
        src = tensors[0]
        if src not in is_ph or not isinstance(src.meta.get("val"), torch.Tensor):
            continue
        sv = src.meta["val"]
        d = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % max(sv.dim(), 1)
        size = sv.shape[d]
        if not isinstance(size, torch.SymInt) or not isinstance(_sym_expr(size), sympy.Symbol):
            continue
        rest = [t.meta.get("val") if isinstance(t, torch.fx.Node) else None
                for t in tensors[1:]]
        if not rest or not all(isinstance(r, torch.Tensor) and isinstance(r.shape[d], int)
                               for r in rest):
            return None
        dt = n.meta["val"].dtype
        if sv.dtype != dt or any(r.dtype != dt for r in rest):
            return None  # cat promotes: the append would write into the cache's dtype
        if cache_dim.setdefault(src, d) != d:
            return None
        syms.add(_sym_expr(size))
        cats[n] = (d, sum(r.shape[d] for r in rest))
    if not cats:
        return None
    plan = Plan()
    plan.caches, plan.symints, plan.cats, plan.attns = [], [], cats, set()
    for i, n in enumerate(placeholders):
        v = n.meta.get("val")
        f = _free(v) & syms
        if not f:
            continue
        if isinstance(v, torch.SymInt):
            if n.users or not isinstance(_sym_expr(v), sympy.Symbol):
                return None
            plan.symints.append(i)
        elif n in cache_dim:
            d = cache_dim[n]
            if any(_free(x) & syms for j, x in enumerate(v.shape) if j != d):
                return None
            plan.caches.append((i, d))
        else:
            return None  # another input whose size is a cache length
    for n in nodes:
        if n.op in ("placeholder", "output") or n in cats:
            if n in cats and any(_free(t.meta.get("val")) & syms for t in n.args[0][1:]):
                return None
            continue
        if n.op == "call_function" and n.target is flash and any(
                a in cats for a in n.all_input_nodes):
            q, kk, vv = n.args[:3]
            bias = n.args[3] if len(n.args) > 3 else None
            causal = n.args[4] if len(n.args) > 4 else False
            if kk not in cats or vv not in cats or q in cats or q in cache_dim \
                    or bias is not None or causal or cats[kk][0] != 2 or cats[vv][0] != 2 \
                    or _free(q.meta.get("val")) & syms or _free(n.meta.get("val")) & syms:
                return None
            plan.attns.add(n)
            continue
        if any(a in cats or a in cache_dim for a in n.all_input_nodes):
            return None  # a cache or an appended cache read by another op
        if _free(n.meta.get("val")) & syms:
            return None  # another size made from a cache length
    ks = {k for _, k in cats.values()}
    if len(ks) != 1:
        return None
    plan.k = ks.pop()
    return plan


def _sympy():
    import sympy

    return sympy


def _sym_expr(s):
    return _sympy().sympify(s.node.expr)


def capacity(n: int, k: int, unit: int = 0) -> int:
    """The capacity for caches of length ``n`` that a call extends by ``k``, whose
    largest entry (one position along the growing dim) is ``unit`` bytes: the smallest
    power of two >= ``n + k``, >= :data:`MIN_CAPACITY` and >= eager growth's least
    capacity for such entries (``eager.growth.min_capacity``: 128 while small, so a short
    generation compiles one bucketed executable, not one per doubling, and a cache
    grown by eager ``cat`` is passed on without a move)."""
    c = max(MIN_CAPACITY, _growth.min_capacity(unit))
    while c < n + k:
        c *= 2
    return c


def entry_bytes(args, plan) -> int:
    """The largest number of bytes per position along the growing dim among the call's
    cache inputs (``plan.caches``)."""
    unit = 0
    for i, d in plan.caches:
        a = args[i]
        per = a.dtype.itemsize
        for j, s in enumerate(a.shape):
            if j != d:
                per *= s
        unit = max(unit, per)
    return unit


def cache_length(args, plan) -> int | None:
    """The common length of the call's cache inputs, or None when they differ or one is
    not a whole contiguous tpu tensor (the call then runs the exact executable)."""
    n = None
    for i, d in plan.caches:
        a = args[i]
        if not isinstance(a, torch.Tensor) or a.is_cpu or not a.is_contiguous() \
                or a.storage_offset() or a.is_neg() or a.is_conj():
            return None
        sd = getattr(a.untyped_storage(), "_tpu", None)
        if sd is None or sd.dtype is not a.dtype or tuple(sd.shape) != tuple(a.shape):
            return None
        if n is None:
            n = a.shape[d]
        elif a.shape[d] != n:
            return None
    return n


def capacity_array(a, d: int, n: int, cap: int):
    """Tensor ``a`` (length ``n`` along ``d``) as a JAX array ``cap`` long along ``d``,
    zeros past ``n``: a ``Grown`` storage's own array when its capacity is ``cap``, else
    made on the device (``seq_bucket_moves``)."""
    sd = a.untyped_storage()._tpu
    g = sd.arr
    if g.__class__ is _st.Grown and g.dim == d and g.n == n and g.arr.shape[d] == cap:
        return g.arr
    M.compile["seq_bucket_moves"] += 1
    jnp = runtime.jax().numpy
    exact = g.arr if g.__class__ is _st.Grown and g.dim == d and g.n == n else sd.get()
    if exact.shape[d] != n:
        exact = runtime.jax().lax.slice_in_dim(exact, 0, n, axis=d)
    pad = [(0, 0)] * exact.ndim
    pad[d] = (0, cap - n)
    return jnp.pad(exact, pad)


def capacity_tensor(a, d: int, cap: int, arr):
    """A tpu tensor over ``arr`` (``a``'s dtype and device, ``cap`` long along ``d``):
    what the graph's trace and key see for cache input ``a``."""
    shape = tuple(arr.shape)
    st = _st.new_storage(shape, a.dtype, a.untyped_storage()._tpu.index, arr)
    return _st.tensor_on(st, shape, _st.contiguous_strides(shape), 0, a.dtype)


def append(jax, cache, new, d: int, n):
    """``cat([cache, new], d)`` on a capacity array: ``new`` written at offset ``n``
    (a traced scalar) along ``d``; the capacity stays ``cache.shape[d]``."""
    start = [0] * cache.ndim
    start[d] = n
    return jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype),
                                        tuple(jax.numpy.asarray(s, "int32") for s in start))


def key_bias(jax, cap: int, valid, dtype):
    """An additive bias over ``cap`` keys: 0 below ``valid`` (a traced scalar), ``-inf``
    from it on (float64 for float64 attention, else float32)."""
    jnp = jax.numpy
    bt = jnp.float64 if dtype == jnp.float64 else jnp.float32
    return jnp.where(jnp.arange(cap) < valid, jnp.asarray(0, bt), jnp.asarray(-jnp.inf, bt))


def wrap_output(arr, d: int, length: int, dtype, index: int):
    """A graph output: the capacity array ``arr`` as a tensor of ``length`` along ``d``
    on a ``Grown`` storage (zeros past ``length``)."""
    shape = list(arr.shape)
    shape[d] = length
    shape = tuple(shape)
    st = _st.new_storage(shape, dtype, index, _st.Grown(arr, d, length))
    return _st.tensor_on(st, shape, _st.contiguous_strides(shape), 0, dtype)
