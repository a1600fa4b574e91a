"""The whole public surface of ``torchtpu`` in one place (everything else is private).

``torch.tpu`` (the device module, shaped like ``torch.cuda``) is in
:mod:`torchtpu._device.tpu_module`.
"""

from torchtpu._metrics import explain_syncs, metrics, reset_metrics

__all__ = ["metrics", "reset_metrics", "explain_syncs"]
