"""Zero-copy interop between ``tpu`` tensors and JAX arrays (``torchtpu.to_jax`` /
``torchtpu.from_jax``).

A ``tpu`` tensor's data is a JAX array held by its storage (``torchtpu._tensor.storage``),
so both directions are free when the tensor is its whole storage.  JAX arrays are
immutable, and an in-place op on a tpu tensor *replaces* its storage's array (it never
writes into the old buffer), so the aliasing rules are simple and the same in every
eager mode:

* ``a = to_jax(t)`` then ``t.add_(1)``: ``a`` keeps the values ``t`` had when ``a`` was
  taken.  Later writes to ``t`` (or any view of it) are never seen by ``a``.
* ``t = from_jax(a)`` then ``t.add_(1)``: ``a`` is unchanged; ``t`` holds a new array.
* Neither direction ever lets a write through one side be seen by the other; what is
  shared is the device buffer of the current values, never a mutable location.

The one way to break this: donating the array to a ``jax.jit(..., donate_argnums=...)``
call of your own deletes its buffer, and the tensor that wraps it then fails on its next
read.  Do not donate an array a tensor still uses.  (torchtpu's own DEFER_AND_FUSE mode
donates a storage's old buffer only when nothing else references the array.)
"""

from __future__ import annotations

import torch

from torchtpu._device import runtime
from torchtpu._tensor import storage as _st

__all__ = ["to_jax", "from_jax"]


def to_jax(tensor: torch.Tensor):
    """The JAX array holding the values of ``tpu`` tensor ``tensor``.

    Args:
        tensor: a ``tpu:N`` tensor of any shape and dtype (``int64``, ``float64``,
            ``bfloat16``, ``bool``, complex... all kept: JAX runs with
            ``jax_enable_x64``).  ``requires_grad`` is ignored (the array is data only,
            like ``tensor.detach()``).

    Returns:
        a ``jax.Array`` of ``tensor.shape`` and the matching dtype, committed to the
        PJRT device of ``tpu:N`` (``jax.devices()[N]`` of the torchtpu platform).

        **Zero copy** (the very array the storage holds) when ``tensor`` covers its whole
        storage in the storage's shape and dtype: a result of an op or a factory,
        ``.to("tpu")``, ``from_jax``, a module parameter.  **A new array** (one device
        op copying the elements) for any other view: slices, ``narrow``/``select``,
        transposes and other non-contiguous views, a ``view``/``reshape`` to another
        shape of a contiguous tensor, ``view(dtype)``, an offset view, and tensors with
        PyTorch's lazy conjugate/negative bit.

        Either way the array is a snapshot: JAX arrays are immutable, and a later in-place
        write to ``tensor`` (or any view sharing its storage) gives the storage a new array,
        which the returned one never sees.  An uninitialized tensor (``torch.empty``) reads
        as zeros.  In DEFER_AND_FUSE mode a pending value is computed first (the pending
        segment runs: a sync point, ``metrics()["host_syncs"]["materialize"]``).

    Raises:
        TypeError: ``tensor`` is not a ``torch.Tensor``.
        RuntimeError: ``tensor`` is not on a tpu device (a cpu tensor: use
            ``jnp.asarray(t.numpy())``, or move it with ``.to("tpu")`` first).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"torchtpu.to_jax: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "tpu":
        raise RuntimeError(
            f"torchtpu.to_jax: expected a tpu tensor, got a tensor on {tensor.device} "
            f"(move it with .to('tpu') first)")
    from torchtpu.eager import host_reads

    return host_reads.to_jax(tensor.detach())


def _tpu_index(dev) -> int | None:
    """The ``tpu`` index of PJRT device ``dev``, or None when it is not one of them."""
    for i, d in enumerate(runtime.devices()):
        if d == dev:
            return i
    return None


def from_jax(array, device=None) -> torch.Tensor:
    """A ``tpu`` tensor wrapping JAX array ``array`` (no copy when it is on a tpu device).

    Args:
        array: a concrete ``jax.Array`` (not a tracer) on one device, of any shape and of
            a dtype PyTorch has (``bool``, (u)int8-64, float16, bfloat16, float32,
            float64, complex64/128, the float8 types).  A numpy array is also accepted
            (copied to the device).
        device: optional ``tpu`` device (``"tpu:1"``, ``torch.device``, index).  Default:
            the device ``array`` is on when it is one of torchtpu's devices, else the
            current tpu device.

    Returns:
        a contiguous ``torch.Tensor`` on ``tpu:N`` with ``array``'s shape and dtype
        (``int64``/``float64`` included), ``requires_grad=False``.  **Zero copy** when
        ``array`` is on the PJRT device of ``tpu:N`` (``jax.devices()[N]`` of the
        torchtpu platform, e.g. any array made by JAX on that device, or returned by
        :func:`to_jax`): the tensor's storage holds ``array`` itself, and the device
        index is the array's.  Otherwise (an array on another device or platform, a
        numpy array, or ``device`` naming another tpu index) the array is copied there
        with ``jax.device_put``.

        ``array`` is never modified: an in-place op on the tensor gives its storage a new
        array (see the module docstring for the aliasing rules).

    Raises:
        TypeError: ``array`` is a tracer (inside ``jax.jit``/``grad``), not an array, or
            of a dtype PyTorch lacks.
        NotImplementedError: ``array`` is sharded over several devices.
        RuntimeError: ``device`` is not a tpu device or its index is out of range.
    """
    jax = runtime.jax()
    import numpy as np

    if isinstance(array, jax.core.Tracer):
        raise TypeError(
            "torchtpu.from_jax: got a JAX tracer (inside jax.jit / grad / vmap); only "
            "concrete arrays can become tpu tensors (use torchtpu.jax_op to call JAX "
            "functions on tpu tensors)")
    if isinstance(array, np.ndarray) or np.isscalar(array):
        array = np.asarray(array)
    elif not isinstance(array, jax.Array):
        raise TypeError(f"torchtpu.from_jax: expected a jax.Array, got {type(array).__name__}")
    try:
        dtype = runtime.to_torch_dtype(array.dtype)
    except KeyError:
        raise TypeError(
            f"torchtpu.from_jax: JAX dtype {array.dtype} has no PyTorch equivalent") from None
    index = None
    if device is not None:
        d = torch.device(device) if not isinstance(device, int) else torch.device("tpu", device)
        if d.type != "tpu":
            raise RuntimeError(f"torchtpu.from_jax: device must be a tpu device, got {d}")
        from torchtpu._device import state

        index = d.index if d.index is not None else state.current_device
    if isinstance(array, jax.Array):
        devs = array.devices()
        if len(devs) != 1:
            raise NotImplementedError(
                f"torchtpu.from_jax: the array is sharded over {len(devs)} devices; a tpu "
                f"tensor lives on one device (gather it, or take a shard: "
                f"array.addressable_shards[i].data)")
        own = _tpu_index(next(iter(devs)))
        if index is None:
            index = own
        if own is not None and own == index:
            return _st.wrap(array, index, dtype)
    if index is None:
        from torchtpu._device import state

        index = state.current_device
    arr = jax.device_put(array, runtime.jax_device(index))
    return _st.wrap(arr, index, dtype)
