"""TorchTPU: a native PyTorch backend for TPUs and other XLA devices, through JAX/PJRT.

``import torch`` registers the ``tpu`` device (PyTorch's ``torch.backends`` autoload
entry point calls :func:`_autoload`); ``import torchtpu`` does the same explicitly.
The public surface is listed in :mod:`torchtpu._public`.
"""



def _autoload() -> None:
    """Entry point of PyTorch's ``torch.backends`` group: registers the device.

    Defined before anything imports torch: ``import torchtpu`` first imports torch, whose
    autoload then looks this function up on the partly imported package."""
    from torchtpu._device import register

    register()


from torchtpu._device import register as _register  # noqa: E402

_register()

from torchtpu._public import *  # noqa: E402,F401,F403
from torchtpu._public import __all__  # noqa: E402,F401

__version__ = "0.1.0"
