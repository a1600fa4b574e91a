"""The decomposition set AOTAutograd applies to graphs for the ``"tpu"`` backend.

One place for which ATen ops a compiled graph keeps whole (those with a lowering, view
ops, the graph-handled ``_assert_async``) and which it decomposes (PyTorch's Core ATen
decompositions, overridden by the eager ones and the graph-only composites).
"""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

# torch._assert_async(t[, msg]) in a graph: a device-side check (raised at the next sync
# point, as CUDA's device asserts), not eager's host read (``graph.GraphExecutable``)
ASSERT_ASYNC = {aten._assert_async.default, aten._assert_async.msg}


# Ops FakeTensorMode must see whole: a constant (torch.tensor(...) in a graph) is a real
# tensor lifted into the fake world by lift_fresh; its "decomposition" to alias would hand
# the real tensor to a fake kernel.
# kept whole: lift_fresh (a graph constant), as_strided_scatter (an eager stage of the
# graph, torchtpu.compile.staged: its result depends on its input's storage offset)
_KEEP = {"aten::lift_fresh", "aten::lift_fresh_copy", "aten::as_strided_scatter"}


@functools.lru_cache(maxsize=None)
def decompositions() -> dict:
    """The decompositions AOTAutograd applies: torchtpu's decomposition set (the same one
    eager consults, ``ops.decomp_overrides.decompositions()``) over PyTorch's Core ATen
    decompositions (``torch._decomp.core_aten_decompositions()``: ops such as
    ``new_ones`` that eager never receives because PyTorch decomposes them above the
    backend, but that AOTAutograd's trace keeps), minus the ops the lowering table has
    (those stay whole: one lowering instead of its pieces) and minus view ops (see
    :func:`_is_view_op`)."""
    from torch._decomp import core_aten_decompositions

    from torchtpu import ops
    from torchtpu.compile import composites
    from torchtpu.ops import decomp_overrides

    table = ops.table()
    d = dict(core_aten_decompositions())
    d.update(decomp_overrides.decompositions())
    d.update(_random_factories())
    d.update(composites.decompositions())
    return {op: fn for op, fn in d.items()
            if op not in table and getattr(getattr(op, "_schema", None), "name", None) not in _KEEP
            and not _is_view_op(op) and op not in ASSERT_ASYNC}


def _random_factories() -> dict:
    """Graph-only decompositions of the random factories (``randn``, ``rand``, ``randint``
    and their ``_like`` forms), which AOTAutograd keeps whole (eager mode never receives
    them: PyTorch builds them from ``empty`` and an in-place draw above the backend) into
    the functional draws the lowering table has (``normal.float_float``, ``uniform``,
    ``random.to``), drawn from the graph's tpu generator state like every random node."""
    aten = torch.ops.aten

    def _kw(dtype, layout, device, pin_memory, like=None):
        if dtype is None:
            dtype = like.dtype if like is not None else torch.get_default_dtype()
        if device is None:
            device = like.device if like is not None else None
        return dict(dtype=dtype, layout=layout or torch.strided, device=device,
                    pin_memory=bool(pin_memory))

    def randn(size, *, dtype=None, layout=None, device=None, pin_memory=None):
        return aten.normal.float_float(0.0, 1.0, size,
                                       **_kw(dtype, layout, device, pin_memory))

    def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None):
        kw = _kw(dtype, layout, device, pin_memory)
        return aten.uniform.default(aten.empty.memory_format(size, **kw), 0.0, 1.0)

    def _between(empty, low, high):
        # random.to, not random.from: FX's generated code cannot name an overload "from".
        # Drawn as int64 in [0, high - low), shifted, then cast: a range wider than the
        # dtype's (int8 in [-100, 100)) is as valid as on CPU, which checks only that
        # `from` and `to - 1` fit the dtype (its errors, raised here)
        from torchtpu.ops.random import _check_range, check_order

        check_order(low, high)
        _check_range(empty.dtype, low, high - 1)
        if high - low > 2**63 - 1:
            raise NotImplementedError(
                f"torchtpu.compile: randint over [{low}, {high}), a range of 2**63 or more "
                f"values, is not supported inside a compiled graph (eager tpu draws it)")
        i64 = empty.dtype is torch.int64
        r = aten.random.to(empty if i64 else aten.empty_like.default(empty, dtype=torch.int64),
                           high - low)
        if low != 0:
            r = aten.add.Tensor(r, low)
        return r if i64 else aten._to_copy.default(r, dtype=empty.dtype)

    def randint_low(low, high, size, *, dtype=None, layout=None, device=None, pin_memory=None):
        kw = _kw(dtype or torch.int64, layout, device, pin_memory)
        return _between(aten.empty.memory_format(size, **kw), low, high)

    def randint(high, size, *, dtype=None, layout=None, device=None, pin_memory=None):
        return randint_low(0, high, size, dtype=dtype, layout=layout, device=device,
                           pin_memory=pin_memory)

    def _empty_like(x, dtype, layout, device, pin_memory, memory_format):
        # empty_like, not empty(x.shape): the result keeps x's strides
        # (memory_format=torch.preserve_format), as eager's *_like factories do
        return aten.empty_like.default(
            x, **_kw(dtype, layout, device, pin_memory, x),
            memory_format=memory_format or torch.preserve_format)

    def randn_like(x, *, dtype=None, layout=None, device=None, pin_memory=None,
                   memory_format=None):
        return aten.normal_functional.default(
            _empty_like(x, dtype, layout, device, pin_memory, memory_format), 0.0, 1.0)

    def rand_like(x, *, dtype=None, layout=None, device=None, pin_memory=None,
                  memory_format=None):
        return aten.uniform.default(
            _empty_like(x, dtype, layout, device, pin_memory, memory_format), 0.0, 1.0)

    def randint_like_low(x, low, high, *, dtype=None, layout=None, device=None,
                         pin_memory=None, memory_format=None):
        return _between(_empty_like(x, dtype or x.dtype, layout, device, pin_memory,
                                    memory_format), low, high)

    def randint_like(x, high, *, dtype=None, layout=None, device=None, pin_memory=None,
                     memory_format=None):
        return randint_like_low(x, 0, high, dtype=dtype, layout=layout, device=device,
                                pin_memory=pin_memory, memory_format=memory_format)

    out = {aten.randn.default: randn, aten.rand.default: rand,
           aten.randint.default: randint, aten.randint.low: randint_low,
           aten.randn_like.default: randn_like, aten.rand_like.default: rand_like,
           aten.randint_like.default: randint_like}
    low_like = getattr(aten.randint_like, "low_dtype", None)
    if low_like is not None:
        out[low_like] = randint_like_low
    return out


def _is_view_op(op) -> bool:
    """View ops stay whole: the graph reads them through their fake tensors' geometry,
    re-derived from the actual inputs when those differ (``graph._geometry_differs``).
    Their decompositions bake the traced input's geometry in as constants
    (``slice.Tensor`` -> ``as_strided(x, ..., x.storage_offset() + start)``), and Dynamo
    does not guard on storage offsets: ``f(x[1])`` after ``f(x[0])`` read row 0."""
    from torchtpu.ops._schema import Signature

    try:
        return isinstance(op, torch._ops.OpOverload) and Signature(op).is_view
    except Exception:
        return False
