"""The per-op hot path of strict eager: a call whose executable is known runs without the
executor's general machinery.

Why: a strict op's host cost was ~27 us for a 16x16 ``a + b`` against ~5 us for the
compiled JAX executable it runs (``python -m torchtpu.bench overhead``).  Most of it was
the general path, paid again at every call: normalizing the arguments into a ``keying.Call``
object, a view spec per tensor (strides, offsets, windows), building the signature key
item by item, then wrapping each result in a new storage and tensor through PyTorch's
boxed ``set_`` (~2.6 us a tensor).

What: each :class:`~torchtpu.eager.executor.LoweredPlan` keeps a small table from a
*hot key* to the :class:`~torchtpu.eager.executables.Executable` its signature resolved to.
The hot key is built straight from the normalized arguments.  It admits calls whose tpu
tensors' storages hold a concrete JAX array (not uninitialized, not a pending
DeferAndFuse value, not bucket-padded), and holds everything the general path's key is
made of: per tensor its storage slot (aliasing), shape and dtype, and for a tensor that
does not read its whole storage array (a view: another shape, an offset, strides, a
conj/neg bit) also its strides, offset, conj/neg bits and its storage's shape and dtype;
per Python number its type (its value is a runtime input, as on the general path); every
constant argument itself; the device index, the default dtype and (for matmuls) the
float32 matmul precision.  A hot key therefore always names the executable the general
path would pick; the storages' arrays, the numbers and the views' offsets (fixed by the
key: the general path's array of them is kept in the entry) are its inputs in the
general path's order.

A table entry is written by the general path after a call it ran with that executable
(so the first call of a signature, its compile and PyTorch's meta checks, and every
unusual call stay there); it is read before the general path by every later call.  Tables
forget the entries of an executable the executable cache evicts, and are dropped whole
when it is cleared (``executable_limit.LRUCache.on_drop``, :func:`drop`).  In
DEFER_AND_FUSE mode the same tables serve the recording (the entry gives the executable to
record; a pending value is an admitted input).  Not used in DEBUG mode, for random ops or ops with a data-dependent result
shape, nor for calls with CPU scalar tensors.  The C++ form serves STRICT only.

Counted in ``torchtpu.metrics()["hot_path_calls"]`` (each also counts as a cache hit).
``TORCHTPU_HOT_PATH=0`` switches it off (every call takes the general path).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from torchtpu.ops._schema import GEN, OPT_SCALAR, OPT_T, OPT_T_LIST, SCALAR, SCALAR_LIST, T, T_LIST

ENABLED = [os.environ.get("TORCHTPU_HOT_PATH", "1").strip() not in ("0", "")]
# its C++ form (``_native.cpp``'s HotPlan) once the C++ helper is loaded; off: Python
NATIVE = [os.environ.get("TORCHTPU_HOT_PATH_NATIVE", "1").strip() not in ("0", "")]

_SCALAR_NP = {bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}
_I64_MIN, _I64_MAX = -(2 ** 63), 2 ** 63 - 1
_TENSOR, _LIST, _DYN_SCALAR, _CONST_SCALAR, _CONST, _DYN_SCALAR_LIST = range(6)
_DEFAULT = ("default",)  # key item of a Scalar argument left at its schema default
MISS = object()  # the C++ hot path's answer when the general path must run the call
_Tensor = torch.Tensor
_default_dtype = torch.get_default_dtype
_matmul_precision = torch._C._get_float32_matmul_precision
_ARRAY = [None]  # the JAX array class (set_array_class)

TABLE_LIMIT = 4096  # entries per op (a table is cleared when full: views at many offsets)
_TABLES: list = []  # every plan's table, dropped together (see drop)


def set_enabled(on: bool) -> bool:
    """Switch the hot path on or off (``TORCHTPU_HOT_PATH`` sets the start-up value);
    returns the previous setting.  Off, every call takes the general path."""
    prev = ENABLED[0]
    ENABLED[0] = bool(on)
    return prev


def set_native(on: bool) -> bool:
    """Use the C++ form of the hot path (when the C++ helper is loaded) or the Python
    form (``TORCHTPU_HOT_PATH_NATIVE`` sets the start-up value; both build the same hot
    keys and share one table per op); returns the previous setting."""
    prev = NATIVE[0]
    NATIVE[0] = bool(on)
    return prev


def set_array_class() -> None:
    """Learn the class of a concrete JAX array (``jax.Array`` is an abstract base; the
    hot path admits exactly the concrete class).  Without it the hot path stays off."""
    try:
        import jax
        from jax._src.array import ArrayImpl
    except ImportError:  # pragma: no cover - another JAX layout: hot path off
        return
    if issubclass(ArrayImpl, jax.Array):
        _ARRAY[0] = ArrayImpl


def codes_for(plan):
    """Per-argument codes of ``plan`` (a ``LoweredPlan``) for :func:`gather`, or None
    when its calls never take the hot path (random ops, ops with a data-dependent result
    shape).  (A lowering's ``prepare`` step runs before the hot key is built, as before
    the general path's key.)"""
    low = plan.lowering
    if low.dynamic_shape or low.random:
        return None
    codes = []
    for k, d in zip(plan.sig.kinds, plan.sig.defaults):
        if k == T or k == OPT_T:
            codes.append((_TENSOR, None))
        elif k == T_LIST or k == OPT_T_LIST:
            codes.append((_LIST, None))
        elif k == SCALAR or k == OPT_SCALAR:
            codes.append((_CONST_SCALAR if low.static_scalars else _DYN_SCALAR, d))
        elif k == GEN:
            return None
        elif k == SCALAR_LIST and not low.static_scalars:
            codes.append((_DYN_SCALAR_LIST, None))
        else:
            codes.append((_CONST, None))
    return tuple(codes)


def new_table() -> dict:
    """A plan's table (hot key -> entry of :func:`entry`), registered for :func:`drop`."""
    t: dict = {}
    _TABLES.append(t)
    return t


def put(table: dict, key, e) -> None:
    """Write entry ``e`` (``(executable, offsets)``) under hot ``key`` of ``table`` and
    remember it on the executable, so that evicting it forgets this entry (:func:`drop`).
    A table holding :data:`TABLE_LIMIT` entries is cleared first (views at many offsets)."""
    if len(table) >= TABLE_LIMIT:
        table.clear()
    table[key] = e
    refs = e[0].hot_refs
    if len(refs) >= 2 * TABLE_LIMIT:  # entries of cleared tables: keep the live ones
        refs[:] = [(t, k) for t, k in refs if t.get(k, (None,))[0] is e[0]]
    refs.append((table, key))


def drop(executables) -> None:
    """Forget the entries naming any of ``executables`` (the executable cache evicted
    them), or every entry when ``executables`` is None (the cache was cleared): an entry
    must never keep an executable the cache let go.  Entries of other executables stay:
    a process past the cache's bound evicts at every new compile, and dropping every
    table then sent each op's next calls back to the general path."""
    if executables is None:
        for t in _TABLES:
            t.clear()
        return
    for ex in executables:
        refs = getattr(ex, "hot_refs", None)
        if not refs:
            continue
        for t, k in refs:
            if t.get(k, (None,))[0] is ex:
                del t[k]
        refs.clear()


def drop_all() -> None:
    """Forget every entry (:func:`drop` with None)."""
    drop(None)


def _const(v):
    """A constant argument as the general path's key holds it (lists as tuples; -0.0 and
    NaN by their text, as ``keying.float_key``)."""
    cls = v.__class__
    if cls is list:
        return tuple(v)
    if cls is float and (v == 0 or v != v):
        return ("float", repr(v))
    return v


def gather(codes, precision, vals, lazy=None):
    """``(hot key, arrays, storages, dyn)`` of a call with normalized ``vals``, or None
    when the call is not one the hot path takes (see the module docstring).

    ``arrays`` / ``storages``: one per distinct storage, in first-use order (the general
    path's slots); ``dyn``: the Python numbers as 0-d numpy values, in argument order.
    ``lazy``: DeferAndFuse's pending-value class (``storage.Lazy``), admitted as an input
    (a pending value whose segment ran is replaced by its array first, as the general
    path does); None in STRICT.
    """
    key = []
    arrays = []
    sds = []
    dyn = []
    index = None
    array_cls = _ARRAY[0]
    for v, (code, d) in zip(vals, codes):
        if code == _TENSOR or code == _LIST:
            if code == _LIST:
                if v is None:
                    key.append(None)
                    continue
                key.append(len(v))
                group = v
            else:
                group = (v,)
            for x in group:
                if x is None:
                    key.append(None)
                    continue
                cls = x.__class__
                if cls in _SCALAR_NP and code == _TENSOR:
                    if cls is int and not _I64_MIN <= x <= _I64_MAX:
                        return None  # (an unsigned Scalar: keying.gather's uint64)
                    key.append(cls)  # a wrapped number: a runtime input
                    dyn.append(np.asarray(x, _SCALAR_NP[cls]))
                    continue
                if not isinstance(x, _Tensor):
                    return None
                sd = getattr(x.untyped_storage(), "_tpu", None)
                if sd is None:
                    return None  # a CPU scalar tensor, a fake tensor, another device
                a = sd.arr
                if a.__class__ is not array_cls:
                    if a.__class__ is not lazy or lazy is None:
                        return None
                    if a.value is not None:
                        sd.resolve(a.value)
                        a = sd.arr
                dtype = x.dtype
                shape = x.shape
                off = x.storage_offset()
                neg = x.is_neg()
                conj = x.is_conj()
                whole = (dtype is sd.dtype and shape == sd.shape and not off and not neg
                         and not conj and x.is_contiguous())
                if index is None:
                    index = sd.index
                elif sd.index != index:
                    return None  # the general path raises the device mismatch
                j = 0
                for s in sds:
                    if s is sd:
                        break
                    j += 1
                if j == len(sds):
                    sds.append(sd)
                    arrays.append(a)
                if whole:
                    key.append((j, shape, dtype))
                else:  # a view: everything its view spec is made of
                    key.append((j, shape, dtype, x.stride(), off, sd.shape, sd.dtype, neg,
                                conj))
        elif code == _DYN_SCALAR:
            if v is None:
                key.append(None)
            elif v is d:
                key.append(_DEFAULT)
            else:
                cls = v.__class__
                if cls not in _SCALAR_NP or (cls is int and not _I64_MIN <= v <= _I64_MAX):
                    return None
                key.append(cls)
                dyn.append(np.asarray(v, _SCALAR_NP[cls]))
        elif code == _DYN_SCALAR_LIST:  # Python numbers: runtime inputs, in order
            if v.__class__ is not list and v.__class__ is not tuple:
                return None
            kinds = []
            for x in v:
                cls = x.__class__
                if cls not in _SCALAR_NP or (cls is int and not _I64_MIN <= x <= _I64_MAX):
                    return None
                kinds.append(cls)
                dyn.append(np.asarray(x, _SCALAR_NP[cls]))
            key.append(("SL", tuple(kinds)))
        elif code == _CONST_SCALAR:
            if v is None:
                key.append(None)
            elif v.__class__ in _SCALAR_NP:
                key.append((v.__class__, _const(v)))
            else:
                return None  # (a Scalar passed as a 0-d tensor)
        else:
            key.append(_const(v))
    if index is None:
        return None  # a factory-like call: its device comes from an argument
    key.append(index)
    key.append(_default_dtype())
    if precision:
        key.append(_matmul_precision())
    return tuple(key), arrays, sds, dyn


def entry(hot, c, ex):
    """The table entry for executable ``ex``, when the hot gather ``hot`` and the general
    path's ``keying.Call`` ``c`` of one call pass it the same inputs (checked once, before an
    entry is written), else None.  An entry is ``(ex, offsets)``: ``offsets`` is the
    general path's array of view offsets (always its last dynamic input), which the hot
    key fixes (it holds every view's offset), or None."""
    _, arrays, sds, dyn = hot
    if c.padded or len(arrays) != len(c.arrays):
        return None
    offs = c.dyn[-1] if c.offs else None
    if len(dyn) + (offs is not None) != len(c.dyn):
        return None
    if any(a is not b for a, b in zip(arrays, c.arrays)):
        return None
    if any(a is not b for a, b in zip(sds, c.sdatas)):
        return None
    if not all(a.dtype == b.dtype and a.shape == getattr(b, "shape", None)
               for a, b in zip(dyn, c.dyn)):
        return None
    return ex, offs
