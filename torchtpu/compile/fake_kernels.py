"""Fake-tensor kernels for ``tpu`` inputs where PyTorch's meta kernel is stricter than what
the op accepts on tpu (and on CPU).

Dynamo and AOTAutograd propagate shapes with fake tensors, which run PyTorch's meta
kernels.  ``aten._grouped_mm``'s meta kernel restates the CUDA kernel's checks and refuses
every dtype but bfloat16, while CPU's kernel and torchtpu's lowering compute float32 and
float16 too.  transformers 5.x calls ``torch._grouped_mm`` for its mixture-of-experts
layers whenever the weights are on a device named "tpu", also under ``torch.compile``, so
compiling such a model in float32 failed in Dynamo ("Expected inputs of BF16 type").
Here a fake kernel answers for ``tpu`` inputs of other dtypes: the output shape of
PyTorch's own ``_create_grouped_mm_output_tensor`` in the inputs' dtype (or
``out_dtype``).  Inputs on other devices, and bfloat16 ones, keep PyTorch's meta kernel.

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
    ``NotImplemented``: PyTorch's meta kernel).  Raises PyTorch's RuntimeError for inputs
    of different dtypes or of the wrong rank."""
    if mat_a.device.type != "tpu" or (mat_a.dtype is torch.bfloat16
                                      and mat_b.dtype is torch.bfloat16):
        return NotImplemented
    from torch._meta_registrations import _create_grouped_mm_output_tensor
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    torch._check(mat_a.dtype == mat_b.dtype and mat_a.dtype.is_floating_point,
                 lambda: f"_grouped_mm: expected floating inputs of one dtype, got "
                         f"mat_a.dtype={mat_a.dtype} and mat_b.dtype={mat_b.dtype}")
    torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
                 lambda: f"Multiplicands must be 2D or 3D but got mat_a.dim()={mat_a.dim()} "
                         f"and mat_b.dim()={mat_b.dim()}")
    torch._check((mat_a.dim() == 3 and mat_b.dim() == 3) or offs is not None,
                 lambda: "_grouped_mm: offs is required unless both operands are 3D")
    torch._check(mat_a.size(-1) == mat_b.size(-2),
                 lambda: f"contraction dimension of mat_a and mat_b must match, got "
                         f"{mat_a.size(-1)} and {mat_b.size(-2)}")
    with in_kernel_invocation_manager(fake_mode):
        out = _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype or mat_a.dtype)
        meta = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device="meta")
    return FakeTensor(fake_mode, meta, mat_a.device)


def install(fake_impls) -> None:
    """Register the kernels above in PyTorch's fake-kernel registry ``fake_impls``
    (idempotent)."""
    global _installed
    if _installed or not hasattr(fake_impls, "register_op_impl"):
        return
    _installed = True
    fake_impls.register_op_impl(_is_grouped_mm)(_grouped_mm_fake)
