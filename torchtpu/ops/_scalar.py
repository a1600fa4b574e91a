"""``Scalar``: a traced PyTorch ``Scalar`` argument that remembers its Python type."""

from __future__ import annotations

import functools

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
