"""``torch.autocast("tpu", dtype=...)``: the AutocastPrivateUse1 dispatch key.

PyTorch ships autocast kernels for CUDA/CPU/XPU/MPS only, so for PrivateUse1 we register
them: a fallthrough for every op, and for the ops of CUDA's autocast lists a kernel that
casts floating-point ``tpu`` tensor arguments, then re-dispatches below the autocast key:

* ``LOWER``: matmuls and convolutions run in the autocast dtype (bfloat16 by default);
* ``FP32``: ops that need range or precision (softmax, norms, losses, exp/log...) run in
  float32;
* ``PROMOTE``: ops mixing several inputs (addcmul, index_put...) run in the widest dtype.

The lists mirror CUDA's (``aten/src/ATen/autocast_mode.cpp``), so a model gets the same
dtypes under ``autocast("tpu")`` as under ``autocast("cuda")``.
"""

from __future__ import annotations

import torch

LOWER = (
    "conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d "
    "convolution _convolution prelu addmm addmv addr matmul einsum mm mv linalg_vecdot "
    "linear addbmm baddbmm bmm chain_matmul linalg_multi_dot lstm_cell gru_cell "
    "rnn_tanh_cell rnn_relu_cell scaled_dot_product_attention"
).split()
FP32 = (
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow "
    "softplus layer_norm native_layer_norm group_norm frobenius_norm nuclear_norm "
    "cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d "
    "hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss "
    "margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss "
    "multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp "
    "softmax log_softmax cumsum cumprod prod sum linalg_vector_norm norm"
).split()
PROMOTE = "addcdiv addcmul atan2 bilinear cross dot grid_sampler index_put scatter_add tensordot".split()

_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_KEYSET = torch._C.DispatchKeySet(_KEY)
_libs = []


def _cast(v, dtype):
    if isinstance(v, torch.Tensor):
        if v.is_floating_point() and v.device.type == "tpu" and v.dtype is not dtype and v.dtype is not torch.float64:
            return v.to(dtype)
        return v
    if isinstance(v, (list, tuple)):
        return type(v)(_cast(x, dtype) for x in v)
    return v


def _widest(args):
    best = None
    for v in args:
        ts = v if isinstance(v, (list, tuple)) else (v,)
        for t in ts:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                best = t.dtype if best is None else torch.promote_types(best, t.dtype)
    return best


def _kernel(op, policy):
    def kernel(*args, **kwargs):
        if policy == "lower":
            dt = torch.get_autocast_dtype("tpu")
        elif policy == "fp32":
            dt = torch.float32
        else:
            dt = _widest(list(args) + list(kwargs.values()))
        with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
            if dt is not None:
                args = _cast(args, dt)
                kwargs = {k: _cast(v, dt) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    return kernel


def register() -> None:
    """Install the AutocastPrivateUse1 kernels (once)."""
    if _libs:
        return
    fb = torch.library.Library("_", "IMPL")
    fb.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    _libs.extend([fb, lib])
    for names, policy in ((LOWER, "lower"), (FP32, "fp32"), (PROMOTE, "promote")):
        for name in names:
            pkt = getattr(torch.ops.aten, name, None)
            if pkt is None:
                continue
            for ov in pkt.overloads():
                op = getattr(pkt, ov)
                if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
                    continue  # out= and in-place variants keep their dtypes
                full = name if ov == "default" else f"{name}.{ov}"
                lib.impl(full, _kernel(op, policy), "AutocastPrivateUse1")
