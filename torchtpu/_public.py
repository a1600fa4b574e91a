"""The whole public surface of ``torchtpu`` in one place (everything else is private).

``torch.tpu`` (the device module, shaped like ``torch.cuda``) is in
:mod:`torchtpu._device.tpu_module`.
"""

from torchtpu._device.persistent_cache import directory as _cache_directory
from torchtpu._metrics import explain_syncs, metrics, reset_metrics

__all__ = ["metrics", "reset_metrics", "explain_syncs", "persistent_cache_directory"]
__all__ += ["jax_op", "to_jax", "from_jax"]  # JAX interop (docs/jax_interop.md)


def persistent_cache_directory():
    """The directory of the persistent XLA compilation cache (``str``), or ``None`` when
    it is off (``TORCHTPU_CACHE_DIR=off``).  Configures JAX first if nothing has yet.
    See ``torchtpu._device.persistent_cache``."""
    from torchtpu._device import runtime

    runtime.jax()
    return _cache_directory()


# ----------------------------------------------------------------- JAX interop
# Thin entry points: the modules (JAX, torch._dynamo) load on first use, not at import.


def jax_op(name, fn=None, *, static_argnames=(), allow_cpu=False):
    """Make JAX (or Pallas) function ``fn`` the PyTorch operator ``name`` (``"ns::op"``),
    running on ``tpu`` tensors in every eager mode and in ``torch.compile(backend="tpu")``
    graphs, with autograd through ``jax.vjp``.  Full documentation:
    :func:`torchtpu._jax_op.jax_op` and docs/jax_interop.md."""
    from torchtpu._jax_op import jax_op as _jax_op

    return _jax_op(name, fn, static_argnames=static_argnames, allow_cpu=allow_cpu)


def to_jax(tensor):
    """The JAX array behind ``tpu`` tensor ``tensor`` (zero copy unless it is a view
    other than its whole storage).  See :func:`torchtpu._jax_interop.to_jax`."""
    from torchtpu._jax_interop import to_jax as _to_jax

    return _to_jax(tensor)


def from_jax(array, device=None):
    """A ``tpu`` tensor wrapping JAX array ``array`` (zero copy when it is on a tpu
    device).  See :func:`torchtpu._jax_interop.from_jax`."""
    from torchtpu._jax_interop import from_jax as _from_jax

    return _from_jax(array, device)
