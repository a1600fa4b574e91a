"""``torch.distributed`` on ``tpu`` tensors: the ``tpu_dist`` process-group backend.

``import torch`` (PyTorch's backend autoload) calls :func:`register`, which only registers
the backend name with PyTorch (no JAX import): ``dist.init_process_group("tpu_dist")``, or
``dist.init_process_group()`` with no backend when the accelerator is ``tpu``, then builds
a :class:`~torchtpu.distributed.process_group.ProcessGroupTPU`.

Layers (imports point down):

* :mod:`.bringup`: the JAX multi-process runtime (``jax.distributed``) started from the
  process group's rendezvous store.
* :mod:`.collectives`: one jitted XLA computation per collective, shape, dtype and group.
* :mod:`.process_group`: the ``torch.distributed.ProcessGroup`` subclass routing each call
  to XLA (tpu tensors) or to gloo (cpu tensors, and calls XLA cannot express).

See docs/distributed.md.
"""

from __future__ import annotations

BACKEND = "tpu_dist"

_registered = False


def register() -> None:
    """Register ``tpu_dist`` for device ``tpu`` with ``torch.distributed`` (idempotent, cheap).

    Mirrors how PyTorch pairs ``cuda`` with ``nccl``: ``Backend.default_device_backend_map
    ["tpu"] = "tpu_dist"``, so ``init_process_group()`` with no backend picks it when
    ``torch.accelerator.current_accelerator()`` is ``tpu``.  Does nothing when PyTorch was
    built without ``torch.distributed``."""
    global _registered
    if _registered:
        return
    _registered = True
    import torch.distributed as dist

    if not dist.is_available():
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["tpu"])


def _create(opts, backend_options):
    """PyTorch's creator hook (``extended_api=True``): called by ``init_process_group`` /
    ``new_group`` with the group's prefixed store, rank, size, timeout and global ranks."""
    from torchtpu.distributed.process_group import ProcessGroupTPU

    device = _caller_device_id()
    pg = ProcessGroupTPU.create(opts, device)
    if device is not None:
        pg.bound_device_id = device
    return pg


def _caller_device_id():
    """The ``device_id`` that ``init_process_group(device_id=...)`` / ``new_group`` handed
    to PyTorch's ``_new_process_group_helper``, which binds it to the group object it
    made and then replaces that object by the Python ``ProcessGroup`` a creator returns
    (its "TODO ... overwrites the ProcessGroup instance"), dropping the binding.  Read
    from the helper's frame so the binding survives (``split_group`` requires it, as
    with nccl); None when not called from there or no device was given."""
    import sys

    f = sys._getframe(2)
    for _ in range(8):
        if f is None:
            return None
        if f.f_code.co_name == "_new_process_group_helper":
            d = f.f_locals.get("device_id")
            return d if d is not None and getattr(d, "type", None) == "tpu" else None
        f = f.f_back
    return None
