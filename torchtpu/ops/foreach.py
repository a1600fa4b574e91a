"""``_foreach_*`` ops: one lowering (one executable, one recorded DeferAndFuse node) for a
whole tensor list.

Optimizers call them (``torch.optim``'s default ``foreach`` implementations: AdamW's
step is about ten ``_foreach_*`` calls over every parameter).  PyTorch's own kernel for
an out-of-tree device is the "slow" one, which loops over the list and runs the element
op once per tensor: one executable call (strict) or one recorded op (DEFER_AND_FUSE) per
parameter and update.  Here each ``_foreach_*`` overload whose element op has a lowering
gets a lowering composed from it: the element lowering applied to each list position,
the same traced code the slow kernel runs per tensor, so the values are the element
op's, bit for bit.

Which overloads (:func:`composed`): the functional ones (``_foreach_mul.Scalar``); the
in-place ones (``_foreach_mul_.Scalar``) reach them through the executor's mutable path
(``eager.executor``: the functional lowering, written back through each element's view).
A ``Scalar[]`` argument (``ScalarList`` overloads: AdamW's per-parameter bias
corrections, new values every step) is a runtime input, one device scalar per number,
as a ``Scalar`` argument is (``ops._schema.SCALAR_LIST``), so a new step's values
compile nothing.  Not composed: ``_foreach_copy`` (its source may be on another
device), and element ops
that draw random numbers, have a data-dependent shape, or fix dtypes on the host
(``out_dtypes``/``meta``).  Those keep PyTorch's per-element kernel.

An in-place call whose lists alias each other in a way that makes the element order
matter (the same tensor twice, an element read by a later element after an earlier one
wrote it, a partial overlap) runs the per-element kernel instead: see
``torchtpu._tensor.overlap.foreach_in_order``.

Element prepare hooks (host-side checks such as ``alpha`` fitting the dtype) run once
per element.  A hook that converts a shared argument differently for two elements (a
number that a mixed-dtype list reads two ways) raises NotImplementedError naming the op.
"""

from __future__ import annotations

import torch

from torchtpu.ops import LOWERINGS, Lowering, aten

_ELEMENT: dict = {}  # foreach overload -> element overload (or None)
_NOT_COMPOSED = frozenset({"_foreach_copy"})


def _plain_type(t: str) -> str:
    return {"List[Tensor]": "Tensor", "List[number]": "number",
            "List[Scalar]": "Scalar"}.get(t, t)


def element_op(op):
    """The per-tensor overload a functional ``_foreach_*`` overload applies element by
    element (``_foreach_mul.List`` -> ``mul.Tensor``, ``_foreach_pow.ScalarAndTensor``
    -> ``pow.Scalar``), matched on argument types with lists made single (the element
    overload's extra arguments must have defaults); None if none, or for a mutable
    overload."""
    if op in _ELEMENT:
        return _ELEMENT[op]
    found = None
    name = op._schema.name.split("::")[1]
    mutable = any(a.alias_info is not None and a.alias_info.is_write
                  for a in op._schema.arguments)
    if name.startswith("_foreach_") and not mutable:
        pkt = getattr(aten, name[len("_foreach_"):], None)
        want = [_plain_type(str(a.type)) for a in op._schema.arguments]
        for ov in (pkt.overloads() if pkt is not None else ()):
            cand = getattr(pkt, ov)
            cargs = cand._schema.arguments
            if any(a.alias_info is not None for a in cargs) or len(cargs) < len(want):
                continue
            if [str(a.type) for a in cargs[: len(want)]] == want and all(
                    a.has_default_value() for a in cargs[len(want):]):
                found = cand
                break
    _ELEMENT[op] = found
    return found


def _same(a, b) -> bool:
    if a is b:
        return True
    if type(a) is not type(b) or isinstance(a, torch.Tensor):
        return False
    try:
        return bool(a == b) or (a != a and b != b)
    except Exception:  # noqa: BLE001 - values that do not compare: not the same
        return False


def composed(op, el, low: Lowering) -> Lowering:
    """The lowering of the functional foreach overload ``op`` built from its element
    overload ``el``'s lowering ``low``: ``fn(*args)`` returns one array per list
    element (``Tensor[]``)."""
    schema_args = op._schema.arguments
    # per argument: whether element e reads its e-th entry (Tensor[], Scalar[])
    is_list = [str(a.type) in ("List[Tensor]", "List[number]", "List[Scalar]")
               for a in schema_args]
    first = [str(a.type) for a in schema_args].index("List[Tensor]")
    tail = [a.default_value for a in el._schema.arguments[len(schema_args):]]
    el_fn = low.fn

    def fn(*args):
        out = []
        for e in range(len(args[first])):
            out.append(el_fn(*[a[e] if lst else a for a, lst in zip(args, is_list)], *tail))
        return out

    prepare = None
    if low.prepare is not None:
        el_prepare = low.prepare

        def prepare(vals):
            n = len(vals)
            m = len(vals[first])
            if any(lst and v is not None and len(v) != m for v, lst in zip(vals, is_list)):
                return vals  # lists of other lengths: PyTorch's checks raise its error
            res = [list(v) if lst else v for v, lst in zip(vals, is_list)]
            shared = None
            for e in range(len(vals[first])):
                ev = el_prepare([v[e] if lst else v for v, lst in zip(vals, is_list)]
                                + list(tail))
                mine = []
                for i in range(n):
                    if is_list[i]:
                        res[i][e] = ev[i]
                    else:
                        mine.append(ev[i])
                if shared is None:
                    shared = mine
                elif not all(_same(a, b) for a, b in zip(shared, mine)):
                    raise NotImplementedError(
                        f"torchtpu: {op} with an argument that its elements' dtypes read "
                        f"in different ways (a mixed-dtype list); call the element op "
                        f"{el} per tensor instead")
            if shared is not None:
                it = iter(shared)
                res = [v if lst else next(it) for v, lst in zip(res, is_list)]
            return res

        if getattr(el_prepare, "scalar_check", False):
            prepare.scalar_check = True
    fn.__name__ = fn.__qualname__ = f"foreach_{el._schema.name.split('::')[1]}"
    fn.__doc__ = f"{op}: {el}'s lowering applied to each list element."
    return Lowering(fn, static_scalars=low.static_scalars, prepare=prepare,
                    precision=low.precision)


def _register() -> None:
    for s in torch._C._jit_get_all_schemas():
        name = s.name
        if not name.startswith("aten::_foreach_") or name.endswith("_"):
            continue
        base = name.split("::")[1]
        ovname = s.overload_name or "default"
        if base in _NOT_COMPOSED or "out" in ovname:
            continue
        op = getattr(getattr(aten, base), ovname)
        if op in LOWERINGS or not any(str(a.type) == "List[Tensor]" for a in op._schema.arguments):
            continue
        el = element_op(op)
        low = LOWERINGS.get(el) if el is not None else None
        if (low is None or low.random or low.dynamic_shape or low.out_dtypes is not None
                or low.meta is not None or low.layout is not None):
            continue
        LOWERINGS[op] = composed(op, el, low)


_register()
