"""Fake-tensor kernels for ``tpu`` inputs where PyTorch's meta kernel is stricter than what
the op accepts on tpu (and on CPU).

Dynamo and AOTAutograd propagate shapes with fake tensors, which run PyTorch's meta
kernels.  ``aten._grouped_mm``'s meta kernel restates the CUDA kernel's checks and refuses
every dtype but bfloat16, while CPU's kernel and torchtpu's lowering compute float32 and
float16 too.  transformers 5.x calls ``torch._grouped_mm`` for its mixture-of-experts
layers whenever the weights are on a device named "tpu", also under ``torch.compile``, so
compiling such a model in float32 failed in Dynamo ("Expected inputs of BF16 type").
Here a fake kernel answers for ``tpu`` inputs of other dtypes, with the lowering's own
meta function (the output of PyTorch's ``_create_grouped_mm_output_tensor`` in the
inputs' dtype, or ``out_dtype``).  Inputs on other devices, and bfloat16 ones, keep PyTorch's meta kernel.

Registered through ``torch._subclasses.fake_impls.register_op_impl`` (PyTorch's own
registry of special fake kernels, private) when that module is imported
(:mod:`torchtpu.compile.routing`'s import hook); where it is missing, nothing changes.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
_installed = False


def _is_grouped_mm(func) -> bool:
    return func is aten._grouped_mm.default


def _grouped_mm_fake(fake_mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Fake result of ``aten._grouped_mm`` on tpu for non-bfloat16 inputs (else
    ``NotImplemented``: PyTorch's meta kernel): the lowering's own meta function
    (``ops.linalg.grouped_mm_meta``, also used by the eager executor)."""
    if mat_a.device.type != "tpu" or (mat_a.dtype is torch.bfloat16
                                      and mat_b.dtype is torch.bfloat16):
        return NotImplemented
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    from torchtpu.ops.linalg import grouped_mm_meta

    with in_kernel_invocation_manager(fake_mode):
        meta = grouped_mm_meta(mat_a, mat_b, offs, bias, out_dtype)
    return FakeTensor(fake_mode, meta, mat_a.device)


def install(fake_impls) -> None:
    """Register the kernels above in PyTorch's fake-kernel registry ``fake_impls``
    (idempotent)."""
    global _installed
    if _installed or not hasattr(fake_impls, "register_op_impl"):
        return
    _installed = True
    fake_impls.register_op_impl(_is_grouped_mm)(_grouped_mm_fake)
