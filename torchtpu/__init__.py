"""TorchTPU: a native PyTorch backend for TPUs and other XLA devices, through JAX/PJRT.

``import torch`` registers the ``tpu`` device (PyTorch's ``torch.backends`` autoload
entry point calls :func:`_autoload`); ``import torchtpu`` does the same explicitly.
The public surface is listed in :mod:`torchtpu._public`.
"""

_importing = True


def _autoload() -> None:
    """Entry point of PyTorch's ``torch.backends`` group: registers the device.

    When ``import torchtpu`` comes first, it imports torch, whose autoload calls this on
    the partly imported package: then it does nothing and the import below registers."""
    if _importing:
        return
    from torchtpu._device import register

    register()


import torch  # noqa: E402,F401

from torchtpu._device import register as _register  # noqa: E402

try:
    _register()
except ValueError as _e:
    # under `import torch`, PyTorch's autoload wraps this in a generic "Failed to load
    # the backend extension" RuntimeError, printed last: say what is wrong where it is seen
    import sys as _sys

    print(f"torchtpu: {_e}", file=_sys.stderr)
    raise

from torchtpu._public import *  # noqa: E402,F401,F403
from torchtpu._public import __all__  # noqa: E402,F401

__version__ = "0.1.0"
_importing = False
