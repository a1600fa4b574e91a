"""Schema facts of an ATen overload and the one way a lowering is called.

Shared by every executor (strict eager, DeferAndFuse, torch.compile's FX interpreter):
:class:`Signature` normalizes a call's arguments to schema order with defaults filled and
classifies each argument (``T``, ``SCALAR``, ``STATIC``...); :func:`call_lowering` calls a
lowering on traced values and fixes its results to PyTorch's meta dtypes and shapes.
"""

from __future__ import annotations

from torchtpu._device import runtime
from torchtpu.ops import _checks
from torchtpu.ops._util import precision_scope

# argument kinds
T, OPT_T, T_LIST, OPT_T_LIST, SCALAR, OPT_SCALAR, GEN, STATIC, SCALAR_LIST = range(9)


def _arg_kind(a) -> int:
    s = str(a.type)
    if s == "Tensor":
        return T
    if s == "Optional[Tensor]":
        return OPT_T
    if s == "List[Tensor]":
        return T_LIST
    if s == "List[Optional[Tensor]]":
        return OPT_T_LIST
    if s == "number" or s == "Scalar":
        return SCALAR
    if s in ("Optional[number]", "Optional[Scalar]"):
        return OPT_SCALAR
    if s == "Optional[Generator]" or s == "Generator":
        return GEN
    if s == "List[number]" or s == "List[Scalar]":
        return SCALAR_LIST  # (``_foreach_*.ScalarList``: per-step values, runtime inputs)
    return STATIC


def _default(a):
    if a.has_default_value():
        return a.default_value
    return None


class Signature:
    """Schema facts of one ``OpOverload`` used on every call (computed once)."""

    def __init__(self, op):
        sch = op._schema
        self.op = op
        self.args = list(sch.arguments)
        self.names = [a.name for a in self.args]
        self.kinds = [_arg_kind(a) for a in self.args]
        self.defaults = [_default(a) for a in self.args]
        self.kwarg_only = [a.kwarg_only for a in self.args]
        self.mutated = [
            i for i, a in enumerate(self.args) if a.alias_info is not None and a.alias_info.is_write
        ]
        self.out_args = [i for i in self.mutated if self.kwarg_only[i]]
        self.nret = len(sch.returns)
        # the mutated arguments a mutable op returns (by alias set: _amp_update_scale_
        # mutates two and returns one, _amp_foreach_non_finite_check_and_unscale_ none)
        self.mutated_returns = [
            next((i for i in self.mutated
                  if self.args[i].alias_info.before_set == r.alias_info.before_set), None)
            if r.alias_info is not None else None
            for r in sch.returns
        ] if self.mutated else []
        if None in self.mutated_returns:
            self.mutated_returns = self.mutated[: self.nret]
        # mutated Tensor[] arguments (in-place list ops: one write per element)
        self.mutated_lists = [i for i in self.mutated if self.kinds[i] in (T_LIST, OPT_T_LIST)]
        # the lists whose tensors' version counters the kernel bumps (``_version``, what
        # autograd checks saved tensors against): PyTorch's autograd layer bumps only the
        # mutated tensors an op returns, and an in-place ``_foreach_*_`` op returns
        # nothing, so CPU's and CUDA's foreach kernels bump their ``self`` list themselves
        # (once per call); the amp list ops bump nothing
        self.bumped_lists = (self.mutated_lists[:1] if self.mutated_lists and not self.nret
                             and sch.name.startswith("aten::_foreach_") else [])
        self.is_view = (
            not self.mutated
            and any(r.alias_info is not None for r in sch.returns)
        )
        self.tensor_idx = [i for i, k in enumerate(self.kinds) if k in (T, OPT_T, T_LIST, OPT_T_LIST)]

    def normalize(self, args, kwargs) -> list:
        vals = list(args)
        n = len(vals)
        if n < len(self.args):
            for i in range(n, len(self.args)):
                name = self.names[i]
                vals.append(kwargs[name] if name in kwargs else self.defaults[i])
        return vals


def flatten(vals) -> list:
    """``vals`` with its list/tuple entries spliced in (Tensor[] arguments and results are
    one write or one output per element)."""
    out = []
    for v in vals:
        if isinstance(v, (list, tuple)):
            out.extend(v)
        else:
            out.append(v)
    return out


def call_lowering(lowering, op, largs, out_meta, key=None, precision=None):
    """Traced: call ``lowering`` (a :class:`torchtpu.ops.Lowering`) of ``op`` on the
    rebuilt arguments ``largs`` (schema order, functional arguments only).

    ``out_meta``: ``(size, stride, dtype)`` per output as PyTorch's meta kernel computes
    it (a ``Tensor[]`` result counts one entry per element; ``None`` for an output that
    is not computed).  ``key``: uint32[4] key data
    for random lowerings.  ``precision``: the float32 matmul precision setting the
    lowering is traced under (``ops._util.matmul_precision``; None: the caller's scope).
    Returns ``(outputs, checks)``: one array per output, cast to
    the meta dtype (raises ``RuntimeError`` if a lowering returns another shape or
    another number of outputs: an internal error, never a silently different or
    truncated result), and the device-side checks
    ``[(flag, exc_type, message)]`` the lowering recorded (``ops._checks``).
    """
    kw = {"key": key} if lowering.random else {}
    with _checks.Tracing() as tr, precision_scope(precision):
        res = lowering.fn(*largs, **kw)
    if not isinstance(res, (tuple, list)):
        res = (res,)
    res = flatten(res)
    if len(res) != len(out_meta):
        # (a lowering returns one entry per output of the meta kernel, including those
        # PyTorch leaves undefined; a Tensor[] result one per element, as out_meta counts)
        raise RuntimeError(
            f"torchtpu internal error: the lowering of {op} returned {len(res)} "
            f"output{'s' if len(res) != 1 else ''} where PyTorch's meta kernel gives "
            f"{len(out_meta)}"
        )
    fixed = []
    for meta, r in zip(out_meta, res):
        if meta is None:  # an output PyTorch does not produce (an optional result)
            fixed.append(None)
            continue
        size, _stride, dt = meta
        want = runtime.to_np_dtype(dt)
        if r.dtype != want:
            r = r.astype(want)
        if tuple(r.shape) != tuple(size):
            raise RuntimeError(
                f"torchtpu internal error: the lowering of {op} returned shape "
                f"{tuple(r.shape)} where PyTorch computes {size}"
            )
        fixed.append(r)
    return fixed, list(tr.checks)
