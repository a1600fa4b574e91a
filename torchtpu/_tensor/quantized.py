"""Quantized tensors (``torch.quint8`` / ``qint8`` / ``qint32``..., ``torch.quantize_per_*``)
are not supported on ``tpu``: every such call raises a ``NotImplementedError`` that names
quantization and the ATen op, instead of PyTorch's generic "Could not run ... with
arguments from the 'Quantizedtpu' backend" or a suggestion to enable the CPU fallback
(a CPU-made quantized tensor could not be moved to tpu either).
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
_libs = []

# ops that turn a tpu float tensor into a quantized one (PrivateUse1 dispatch key)
_QUANTIZE_OPS = (
    "quantize_per_tensor",
    "quantize_per_tensor.tensor_qparams",
    "quantize_per_tensor.tensors",
    "quantize_per_tensor_dynamic",
    "quantize_per_channel",
)


def _error(op, args) -> NotImplementedError:
    dtypes = [a for a in args if isinstance(a, torch.dtype)]
    what = f" (dtype {dtypes[0]})" if dtypes else ""
    return NotImplementedError(
        f"torchtpu: quantized tensors are not supported on the tpu device: {op}{what}. "
        "Quantize on the CPU instead (e.g. torch.quantize_per_tensor(x.cpu(), ...))."
    )


def _quantized_fallback(keyset, op, *args, **kwargs):
    raise _error(op, list(args) + list(kwargs.values()))


def _quantize_kernel(name):
    def kernel(*args, **kwargs):
        raise _error(f"aten.{name}", list(args) + list(kwargs.values()))

    return kernel


def install() -> None:
    """Register the QuantizedPrivateUse1 fallback and the quantize_* kernels (once)."""
    if _libs:
        return
    fb = torch.library.Library("_", "IMPL")
    fb.fallback(_quantized_fallback, dispatch_key="QuantizedPrivateUse1", with_keyset=True)
    lib = torch.library.Library("aten", "IMPL")
    for name in _QUANTIZE_OPS:
        lib.impl(name, _quantize_kernel(name), "PrivateUse1")
    _libs.extend([fb, lib])
