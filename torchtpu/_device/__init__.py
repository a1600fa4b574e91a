"""Registration of the ``tpu`` device with PyTorch (PrivateUse1, renamed).

:func:`register` is idempotent and cheap (no JAX import): it renames PrivateUse1 to
``tpu``, generates the ``Tensor.tpu()`` / ``is_tpu`` / ``Module.tpu()`` methods, installs
the Python backend hooks and device guard, registers ``torch.tpu``
(:mod:`torchtpu._device.tpu_module`) and installs the boxed PrivateUse1 fallback kernel
that sends every ATen op to :func:`torchtpu.eager.executor.dispatch`.
"""

from __future__ import annotations

import torch

_registered = False
_libs = []


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """PrivateUse1 hooks: availability for ``torch.accelerator``."""

    def is_available(self) -> bool:
        from torchtpu._device import runtime

        try:
            return runtime.device_count() > 0
        except RuntimeError:
            return False

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _dispatch(keyset, op, *args, **kwargs):
    """First call: import the executor (and JAX), then route every op straight to it."""
    global _dispatch
    from torchtpu.eager import executor

    _dispatch = executor.dispatch
    return executor.dispatch(keyset, op, *args, **kwargs)


def _trampoline(keyset, op, *args, **kwargs):
    return _dispatch(keyset, op, *args, **kwargs)


def register() -> None:
    """Make ``tpu`` a PyTorch device (safe to call more than once)."""
    global _registered
    if _registered:
        return
    _registered = True
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from torchtpu._device import tpu_module

    if torch._C._get_privateuse1_backend_name() == "privateuseone":
        _setup_privateuseone_for_python_backend(
            rename="tpu", backend_module=tpu_module, hook=_Hooks(), device_guard=_Guard()
        )
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_trampoline, dispatch_key="PrivateUse1", with_keyset=True)
    _libs.append(fallback)
    # Autocast on tpu: the same op lists as CUDA are applied by PyTorch's autocast
    # kernels for AutocastPrivateUse1; nothing to register beyond the device module's
    # get_amp_supported_dtype.
