"""torchao: int8 dynamic-activation matmuls on tpu run as an integer dot, as on CPU.

torchao's ``int_scaled_matmul(a, b, scales)`` (int8 ``a`` (M, K), int8 ``b`` (K, N), float
``scales`` (M, 1)) computes, on CPU, ``torch._int_mm(a, b).to(scales.dtype) * scales``
(an exact int32 product).  On any other device it goes to ``safe_int_mm``, which first
checks ``"FakeTensor" in a.__repr__()`` (formats the whole activation: a host read per
matmul), then tries ``out_dtype(aten.mm, int32, ...)`` and, where that raises, multiplies
in float32 (exact only while the sums stay below 2**24, ``K <= 1024`` at the extremes).
The patch: for tpu tensors, CPU's formula, so ``aten._int_mm`` runs as an XLA integer dot
with int32 accumulation (``torchtpu.ops.linalg``) and the values equal CPU's.  Other
devices get torchao's own function.

Version range tested: torchao 0.18.
"""

from __future__ import annotations

import sys

import torch

LO, HI = (0, 18), (0, 19)

_REFERENCES = ("torchao.kernel", "torchao.quantization.quantize_.workflows.int8.int8_tensor")


def install(module):
    """Post-import hook for ``torchao.kernel.intmm``: patch ``int_scaled_matmul``."""
    from importlib.metadata import version

    from torchtpu.integrations import check_version, replaces

    why = check_version("torchao", version("torchao"), LO, HI)
    if why:
        return why
    orig = getattr(module, "int_scaled_matmul", None)
    if orig is None:
        return "skipped: torchao.kernel.intmm has no int_scaled_matmul"
    if getattr(orig, "_torchtpu", False):
        return None

    @replaces(orig, "tpu tensors: ``torch._int_mm(a, b).to(scales1.dtype) * scales1``, "
              "CPU's s8s8 formula (an integer dot, no host read).")
    def int_scaled_matmul(a, b, scales1):
        if a.device.type == "tpu" and b.device.type == "tpu":
            assert a.shape[0] == scales1.size(0) or scales1.numel() == 1
            assert 1 == scales1.size(1)
            return torch._int_mm(a, b).to(scales1.dtype) * scales1
        return orig(a, b, scales1)

    module.int_scaled_matmul = int_scaled_matmul
    for name in _REFERENCES:  # imported before torchtpu: update their references too
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "int_scaled_matmul", None) is orig:
            mod.int_scaled_matmul = int_scaled_matmul
    return None
