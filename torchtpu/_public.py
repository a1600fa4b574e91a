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
    """Make JAX (or Pallas) function ``fn`` the PyTorch operator ``name`` (``"ns::op"``).

    ``op = jax_op("mylib::rmsnorm", fn, static_argnames=("eps",)); y = op(x, w, eps=1e-6)``
    (or ``@jax_op("mylib::f")`` as a decorator).  Positional parameters of ``fn`` are
    arrays (tensors when called), ``static_argnames`` are hashable Python values.  Results:
    ``fn``'s output structure with new tensors on the inputs' ``tpu:N``, shapes and dtypes
    from ``jax.eval_shape`` (int64/float64 kept).  Runs in every eager mode (fused into
    DEFER_AND_FUSE segments) and as one node of ``torch.compile(backend="tpu")`` graphs;
    autograd through ``jax.vjp`` (``fn``'s ``jax.custom_vjp`` when it has one) to real
    floating inputs.  Raises ``RuntimeError`` for cpu tensors (naming the op) unless
    ``allow_cpu=True`` (then JAX's CPU device runs it), ``ValueError``/``TypeError`` for a
    bad name or signature, ``NotImplementedError`` for backward through complex values.
    Full documentation: :func:`torchtpu._jax_op.jax_op` and docs/jax_interop.md."""
    from torchtpu._jax_op import jax_op as _jax_op

    return _jax_op(name, fn, static_argnames=static_argnames, allow_cpu=allow_cpu)


def to_jax(tensor):
    """The JAX array behind ``tpu`` tensor ``tensor``: same shape and dtype, on the PJRT
    device of its ``tpu:N``.  Zero copy when the tensor is its whole storage (an op's
    result, ``.to("tpu")``, ``from_jax``); a new array for other views (slices, offsets,
    transposes, reshapes, ``view(dtype)``).  A snapshot: later in-place writes to the
    tensor are never seen by the array.  Raises ``RuntimeError`` for a non-tpu tensor.
    See :func:`torchtpu._jax_interop.to_jax` and docs/jax_interop.md."""
    from torchtpu._jax_interop import to_jax as _to_jax

    return _to_jax(tensor)


def from_jax(array, device=None):
    """A contiguous ``tpu`` tensor wrapping JAX array ``array`` (same shape and dtype).
    Zero copy, on the array's ``tpu:N``, when it is on one of torchtpu's PJRT devices;
    otherwise (another device, numpy, ``device=`` another index) copied there.  The array
    never changes: in-place writes to the tensor give it a new array.  Raises
    ``TypeError`` for a tracer or non-array, ``NotImplementedError`` for a sharded array.
    See :func:`torchtpu._jax_interop.from_jax` and docs/jax_interop.md."""
    from torchtpu._jax_interop import from_jax as _from_jax

    return _from_jax(array, device)
