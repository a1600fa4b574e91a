"""The ATen -> XLA lowering table.

One table serves every executor (strict eager, debug eager, DeferAndFuse, torch.compile).
A lowering is a pure function written against ``jax.numpy`` / ``jax.lax``; it receives the
ATen op's arguments in schema order with defaults filled in, where

* ``Tensor`` arguments are JAX arrays (tracers), already read through their view;
* ``Scalar`` arguments are :class:`Scalar` objects (a traced value plus its Python type,
  which PyTorch's type promotion needs);
* everything else (ints, int lists, dtypes, bools, strings) is the static Python value.

It returns one array per ATen output.  The executor casts each output to the dtype that
PyTorch's own meta kernel computes for the call and checks the shape, so a lowering can
never return a silently different dtype or shape.

Mutable variants (``add_``, ``add.out``) are never lowered by hand: the executor runs the
functional op and writes the result through the view (see ``torchtpu.eager.executor``).

Register with::

    @lower(aten.exp.default)
    def exp(x): ...

The registry is the table of contents: grep the ATen name to find an op's lowering.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Callable

import torch

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Lowering:
    """One entry of the table.

    Attributes:
        fn: the lowering function.
        random: the op draws random numbers; ``fn`` gets a uint32[4] key-data array
            (see ``torchtpu._device.state.RNGState``) as keyword ``key``.
        dynamic_shape: the output shape depends on tensor values (``nonzero``...): the
            op runs on concrete arrays, outside ``jit``, and is a sync point.
        static_scalars: Scalar arguments are compiled in as constants instead of being
            passed as device scalars (for ops whose lowering needs Python values).
        prepare: optional host-side rewrite of the normalized argument list, run before
            the executable is looked up (e.g. boolean masks -> integer indices, which has
            a data-dependent shape and so is a sync point).  A hook whose attribute
            ``skip_at_defaults`` is a tuple of argument positions does nothing while those
            arguments are their schema defaults' objects; the C++ hot path then skips the
            call (``add``'s alpha check).
        out_dtypes: optional host-side ``(vals, meta_dtypes) -> dtypes`` for ops whose
            CPU kernel gives other output dtypes than PyTorch's meta kernel (which follows
            CUDA): the eager executor allocates and casts the outputs to these.
            ``torch.compile`` graphs keep the meta dtypes (their fake tensors have them).
        precision: the lowering multiplies float32 matrices (matmul, convolution): it
            reads ``torch.get_float32_matmul_precision()`` through
            ``ops._util.matmul_precision``, and the setting is part of its executable's
            cache key (see ``docs/precision.md``).
        meta: optional ``(*args) -> meta output(s)``, called with the normalized
            arguments as meta tensors, for ops whose PyTorch meta kernel refuses calls
            the op accepts on CPU (``_grouped_mm`` in float32): the eager executor uses
            it instead of that kernel.
        layout: for ``dynamic_shape`` ops whose CPU results are not row-major
            (``nonzero``'s are column-major): ``(vals, i, shape) -> order``, the order
            in which result ``i``'s dimensions lie in memory, outermost first (a
            permutation of its dimensions), or None for row-major.
    """

    fn: Callable
    random: bool = False
    dynamic_shape: bool = False
    static_scalars: bool = False
    prepare: Callable | None = None
    out_dtypes: Callable | None = None
    precision: bool = False
    meta: Callable | None = None
    layout: Callable | None = None


LOWERINGS: dict = {}


def lower(*ops, random=False, dynamic_shape=False, static_scalars=False, prepare=None,
          out_dtypes=None, precision=False, meta=None, layout=None):
    """Decorator registering ``fn`` as the lowering of each ATen overload in ``ops``."""

    def deco(fn):
        entry = Lowering(fn, random, dynamic_shape, static_scalars, prepare, out_dtypes,
                         precision, meta, layout)
        for op in ops:
            if op in LOWERINGS:
                raise RuntimeError(f"torchtpu: two lowerings for {op}")
            LOWERINGS[op] = entry
        return fn

    return deco


_FAMILIES = (
    "elementwise",
    "reduction",
    "shape",
    "indexing",
    "linalg",
    "nn",
    "random",
    "factory",
    "special",
    "attention",
    "sdpa",
    "amp",
    "foreach",  # last: composed from the element ops' lowerings
)
_loaded = False


def table() -> dict:
    """The full lowering table (imports every op family on first use)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for fam in _FAMILIES:
            _load_family(fam)
    if _OPTIONAL:  # families of third-party ops, once their library is imported
        for lib in [lib for lib in _OPTIONAL if lib in sys.modules]:
            _load_family(_OPTIONAL.pop(lib))
    return LOWERINGS


# library -> the family lowering its ops (``torch.ops.<library>`` exists only once the
# library is imported; the family is loaded by the first table() call after that)
_OPTIONAL = {"torchvision": "detection"}


def _load_family(fam: str) -> None:
    try:
        importlib.import_module(f"torchtpu.ops.{fam}")
    except Exception as e:  # one broken family must not take the device down
        import warnings

        warnings.warn(f"torchtpu: could not load lowerings torchtpu.ops.{fam}: {e!r}")


def _no_executor(op, args, kwargs):
    raise RuntimeError(f"torchtpu: {op} runs through the eager executor, not imported yet")


# ``run(op, args, kwargs)``: the eager executor's plan for ``op`` on a call; installed by
# ``torchtpu.eager.executor`` when it is imported, so this layer does not import the eager
# layer above it
_RUN_PLAN = _no_executor


def set_plan_runner(fn) -> None:
    """``fn(op, args, kwargs)`` runs ``op``'s eager plan (``eager.executor`` installs it)."""
    global _RUN_PLAN
    _RUN_PLAN = fn


def run_plan(op, args, kwargs):
    """Run ``op`` on ``args``/``kwargs`` (tpu tensors) through the eager executor's plan
    for it, not through the dispatcher: for an op whose eager form is another op (the
    ``out=`` factories' decompositions, ``factory._out_factory``, reached through the
    executor).  RuntimeError if the executor is not loaded."""
    return _RUN_PLAN(op, args, kwargs)


from torchtpu.ops._scalar import Scalar  # noqa: E402  (re-export)

__all__ = ["Lowering", "lower", "table", "run_plan", "Scalar", "aten"]
