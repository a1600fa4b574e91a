"""``Scalar``: a traced PyTorch ``Scalar`` argument that remembers its Python type."""

from __future__ import annotations

import functools
import math

import torch

from torchtpu import _compat
from torchtpu._device import runtime

_SAMPLE = {bool: True, int: 1, float: 1.0, complex: 1j}


class Scalar:
    """A Python number passed to an op as ``Scalar``.

    Attributes:
        value: 0-d JAX array (traced) holding the number (bool, int64, float64 or
            complex128).
        kind: the Python type (``bool``, ``int``, ``float``, ``complex``), which decides
            PyTorch type promotion ("wrapped numbers" never widen a tensor's dtype within
            their category).
    """

    __slots__ = ("value", "kind")

    def __init__(self, value, kind):
        self.value = value
        self.kind = kind

    @property
    def sample(self):
        return _SAMPLE[self.kind]

    def astype(self, dtype):
        return self.value.astype(dtype)


@functools.lru_cache(maxsize=None)
def register_pytree():
    """Make :class:`Scalar` a JAX pytree node (once), so it can cross ``jit``."""
    runtime.jax().tree_util.register_pytree_node(
        Scalar, lambda s: ((s.value,), s.kind), lambda kind, ch: Scalar(ch[0], kind)
    )


# ----------------------------------------------------------- checked Scalar conversion

# c10's C++ type names, as CPU's "value cannot be converted to type ... without overflow"
C_TYPE_NAMES = {
    torch.int8: "int8_t", torch.uint8: "uint8_t", torch.int16: "int16_t", torch.int32: "int",
    torch.int64: "int64_t", torch.uint16: "uint16_t", torch.uint32: "uint32_t",
    torch.uint64: "uint64_t", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
    torch.float32: "float", torch.float64: "double",
    torch.complex64: "c10::complex<float>", torch.complex128: "c10::complex<double>",
    torch.float8_e4m3fn: "c10::Float8_e4m3fn", torch.float8_e5m2: "c10::Float8_e5m2",
    torch.float8_e4m3fnuz: "c10::Float8_e4m3fnuz", torch.float8_e5m2fnuz: "c10::Float8_e5m2fnuz",
}
_COMPONENT = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _overflows(v, dtype) -> bool:
    """c10::overflows<To, From>: whether Python number ``v`` does not fit ``dtype``."""
    if dtype.is_complex:
        part = _COMPONENT[dtype]
        if isinstance(v, complex):
            return _overflows(v.real, part) or _overflows(v.imag, part)
        return _overflows(v, part)
    if isinstance(v, complex):
        return v.imag != 0 or _overflows(v.real, dtype)
    if dtype.is_floating_point:
        fi = torch.finfo(dtype)
        if isinstance(v, float):
            if math.isnan(v):
                return False  # every floating type has a NaN
            if math.isinf(v):
                return dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz,
                                 torch.float8_e5m2fnuz)  # no infinity
        return v < fi.min or v > fi.max
    ii = torch.iinfo(dtype)
    if isinstance(v, float):
        if _compat.torch_at_least(2, 14):
            # truncated first: in range down to min, and up to (not including) max + 1
            return math.isnan(v) or v < float(ii.min) or v >= float(ii.max) + 1.0
        return math.isnan(v) or v < float(ii.min) or v > float(ii.max)
    if ii.min == 0 and v < 0:  # unsigned: negative ints wrap (two's complement)
        return -v > ii.max
    return v < ii.min or v > ii.max


_REDUCED_FLOATS = (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
                   torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def check_converts(value, dtype: torch.dtype, numel: int | None = None):
    """Host side: raise as CPU's checked ``Scalar::to<T>()`` does when ``value`` (a Python
    number, or a 0-d CPU tensor) cannot be represented in ``dtype`` — ``fill_(300)`` on
    int8, ``clamp(max=1e6)`` on float16, ``inf`` into float8_e4m3fn.  Bools, bool targets,
    and tensors on tpu (reading them would be a sync) are not checked.

    ``numel``: for fills, the filled element count.  CPU fills a one-element tensor
    through an unchecked path for float16/bfloat16/float8 (``x[0] = 1e6`` on float16
    stores inf), so those are not checked either.

    Returns the value to use: ``value`` itself, except a float equal to 2**63 filled
    into int64, which passes torch 2.13's check (``(double)INT64_MAX`` is 2**63) and
    converts to INT64_MIN on x86 (XLA would saturate to INT64_MAX; from torch 2.14 on it
    overflows), and a complex number with a zero imaginary part for a real dtype (its
    real part).

    Raises:
        RuntimeError: "value cannot be converted to type <C++ type> without overflow".
    """
    v = value
    if isinstance(v, torch.Tensor):
        if v.device.type != "cpu" or v.numel() != 1:
            return value
        v = v.item()
    if isinstance(v, bool) or v is None:
        return value
    if dtype is torch.bool:  # any number converts to bool (nonzero: True)
        return bool(v) if isinstance(v, complex) else value
    if numel == 1 and dtype in _REDUCED_FLOATS:
        if isinstance(v, complex):
            if v.imag != 0:
                raise RuntimeError("value cannot be converted to type double without overflow")
            return v.real
        return value
    name = C_TYPE_NAMES.get(dtype)
    if name is not None and _overflows(v, dtype):
        raise RuntimeError(f"value cannot be converted to type {name} without overflow")
    if dtype is torch.int64 and isinstance(v, float) and v == 2.0 ** 63:
        return -(2 ** 63)
    if isinstance(v, complex) and not dtype.is_complex:
        return v.real  # the imaginary part is 0 here (else _overflows raised)
    return value


def opmath_dtype(dtype: torch.dtype) -> torch.dtype:
    """ATen's ``opmath_type``: float32 for float16/bfloat16/float8, else ``dtype``."""
    return torch.float32 if dtype in _REDUCED_FLOATS else dtype


def scalar_check(prepare):
    """Mark a ``prepare`` hook as a pure argument check: it reads only dtypes, shapes and
    Python-number arguments (never tensor values), so :mod:`torchtpu.compile` also runs it
    when a graph is built, on the nodes' fake tensors and the graph's constant Scalars
    (``fill_(300)`` on int8 raises inside ``torch.compile`` as in eager)."""
    prepare.scalar_check = True
    return prepare


def clamp_integer_bounds(vals, roles, dtype: torch.dtype) -> bool:
    """torch 2.15's integer ``clamp`` (and ``hardtanh``) bounds, in place in ``vals``.

    ``roles``: ``((position, "min" | "max"), ...)`` of the Python-number bounds in
    ``vals``; ``dtype``: the result dtype.  A bound outside the dtype's range on the side
    where it clamps nothing is saturated to the range (``clamp(min=-300)`` on int8 leaves
    the values as they are); a ``min`` above the range or a ``max`` below it raises.
    Returns False (nothing done) before torch 2.15, where CPU's checked conversion
    applies (:func:`check_converts`), and for non-integer dtypes.

    Raises:
        RuntimeError: "Clamp min value 300 is outside the representable range of Char",
            as CPU (the value printed as C++ prints a double).
    """
    if (not _compat.torch_at_least(2, 15) or dtype.is_floating_point or dtype.is_complex
            or dtype is torch.bool):
        return False
    from torchtpu.ops._util import scalar_type_name  # (_util imports this module)

    info = torch.iinfo(dtype)
    for pos, role in roles:
        b = vals[pos]
        if b is None or isinstance(b, (torch.Tensor, bool)):
            continue
        if (role == "min" and b > info.max) or (role == "max" and b < info.min):
            raise RuntimeError(f"Clamp {role} value {float(b):g} is outside the "
                               f"representable range of {scalar_type_name(dtype)}")
        vals[pos] = min(max(b, info.min), info.max)
    return True


def fits(*positions, opmath=False, dtype=None):
    """A lowering's ``prepare`` hook: the Scalar arguments at ``positions`` of the
    normalized argument list must fit the dtype of argument 0 (a tensor), or with
    ``opmath`` its :func:`opmath_dtype` (kernels that read the Scalar as their compute
    type: ``threshold`` and ``leaky_relu`` on float16 take 1e6), or ``dtype(vals)``, as
    CPU's checked ``Scalar::to<T>()`` requires.  Raises ``RuntimeError`` as
    :func:`check_converts`."""

    def prepare(vals):
        dt = None
        for i in positions:
            v = vals[i]
            # hot path (addmm's beta=1, alpha=1): 0 and 1 fit every dtype unchanged
            if v is None or (type(v) in (int, float) and (v == 1 or v == 0)) \
                    or isinstance(v, torch.Tensor):
                continue
            if dt is None:
                dt = dtype(vals) if dtype is not None else vals[0].dtype
                if opmath:
                    dt = opmath_dtype(dt)
            vals[i] = check_converts(v, dt)
        return vals

    return scalar_check(prepare)


def value_of_device_scalar(value, dtype: torch.dtype):
    """A 0-d/one-element tpu tensor used as a Scalar value (``masked_fill(mask, t)``):
    CPU and CUDA read it with ``value.item()`` and convert it with the checked
    ``Scalar::to<T>()``.  The read is a sync point (as on CUDA), so it is done only where
    the conversion can fail: when ``value``'s dtype does not promote into ``dtype``
    (float32 into float16, float into int).  Fake tensors (graph build) are not read.

    Raises:
        RuntimeError: as :func:`check_converts`.
    """
    if (not isinstance(value, torch.Tensor) or value.device.type == "cpu"
            or value.numel() != 1 or dtype is torch.bool or value.dtype is torch.bool
            or torch.promote_types(value.dtype, dtype) == dtype
            or isinstance(value, torch._subclasses.FakeTensor)):
        return
    check_converts(value.item(), dtype)
