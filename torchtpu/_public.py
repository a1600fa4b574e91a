"""The whole public surface of ``torchtpu`` in one place (everything else is private).

``torch.tpu`` (the device module, shaped like ``torch.cuda``) is in
:mod:`torchtpu._device.tpu_module`.
"""

from torchtpu._device.persistent_cache import directory as _cache_directory
from torchtpu._metrics import explain_syncs, metrics, reset_metrics

__all__ = ["metrics", "reset_metrics", "explain_syncs", "persistent_cache_directory"]


def persistent_cache_directory():
    """The directory of the persistent XLA compilation cache (``str``), or ``None`` when
    it is off (``TORCHTPU_CACHE_DIR=off``).  Configures JAX first if nothing has yet.
    See ``torchtpu._device.persistent_cache``."""
    from torchtpu._device import runtime

    runtime.jax()
    return _cache_directory()
