"""Fused attention ops of PyTorch's inference fast paths, as decompositions.

``nn.MultiheadAttention`` in eval mode (no grad, batch_first, self-attention) calls
``aten._native_multi_head_attention`` on CPU, CUDA *and* PrivateUse1 devices, so on tpu
too (torchvision's ViT); ``nn.TransformerEncoderLayer`` likewise calls
``aten._transformer_encoder_layer_fwd``.  PyTorch has no decomposition for either; these
follow CPU's kernels step by step with ordinary ops, which are lowered.

* multi-head attention: the in-projection (one product for self-attention), ``q`` plus
  bias scaled by ``1/sqrt(head_dim)``, ``softmax(q k^T)`` with the mask applied (a fully
  masked row is NaN, as on CPU), the context, the out-projection; attention weights only
  when ``need_weights`` (averaged over heads when ``average_attn_weights``).
* encoder layer: attention + residual, layer norm, feed-forward (exact GELU or ReLU) +
  residual, layer norm; the norms before each block instead when ``norm_first``.
"""

from __future__ import annotations

import math

import torch

from torchtpu.ops import aten
from torchtpu.ops.decomp_overrides import decomp


def _in_projection(query, key, value, embed_dim, qkv_weight):
    """``[B, T, 3D]``, as CPU's ``qkv_projection``: one product when query, key and
    value are the same tensor, else one per input (query / key-value when key is value)."""
    if key is value:
        if query is key:
            return torch.matmul(query, qkv_weight.t())
        wq, wkv = qkv_weight.split([embed_dim, 2 * embed_dim], 0)
        return torch.cat([torch.matmul(query, wq.t()), torch.matmul(key, wkv.t())], 2)
    wq, wk, wv = qkv_weight.chunk(3, 0)
    return torch.cat([torch.matmul(query, wq.t()), torch.matmul(key, wk.t()),
                      torch.matmul(value, wv.t())], 2)


def _mask(mask, mask_type, B, H, T, S):
    """The mask as a bool tensor broadcastable to ``[B, H, T, S]`` (True: masked out).
    A float mask counts as bool (non-zero masks), as CPU's ``masked_softmax`` converts it."""
    if mask.dtype != torch.bool:
        mask = mask.to(torch.bool)
    if mask_type == 1:  # key padding [B, S]
        return mask.view(B, 1, 1, S)
    if mask_type == 0:  # [T, S] for every batch and head
        return mask.view(1, 1, T, S)
    return mask  # 2 / None: [B, H, T, S] (or broadcastable)


@decomp(aten._native_multi_head_attention.default)
def _native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                                 proj_weight, proj_bias, mask=None, need_weights=True,
                                 average_attn_weights=True, mask_type=None):
    if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
        raise RuntimeError("expected 3-D `query`, `key` and `value`")
    if query.shape[2] != embed_dim:
        raise RuntimeError(f"passed-in embed_dim {embed_dim} didn't match last dim of query "
                           f"{query.shape[2]}")
    if not (query.shape == key.shape == value.shape):
        raise RuntimeError("expected `query`/`key`/`value` shapes to match")
    if tuple(qkv_weight.shape) != (3 * embed_dim, embed_dim) or tuple(qkv_bias.shape) != (3 * embed_dim,):
        raise RuntimeError("expected `qkv_weight` [3 x embed_dim, embed_dim] and `qkv_bias` [3 x embed_dim]")
    if embed_dim % num_head:
        raise RuntimeError("`embed_dim` must divide evenly by `num_heads`")
    B, T, D = query.shape
    if query.numel() == 0:
        return torch.empty_like(query), None
    dh = D // num_head
    qkv = _in_projection(query, key, value, embed_dim, qkv_weight) + qkv_bias
    # [B, T, 3, H, dh] -> 3 x [B, H, T, dh]
    q, k, v = qkv.view(B, T, 3, num_head, dh).permute(2, 0, 3, 1, 4).unbind(0)
    q = q / math.sqrt(dh)
    scores = torch.matmul(q, k.transpose(-2, -1))  # [B, H, T, T]
    if mask is not None:
        scores = scores.masked_fill(_mask(mask, mask_type, B, num_head, T, T), float("-inf"))
    attn = torch.softmax(scores, -1)
    ctx = torch.matmul(attn, v).transpose(1, 2).reshape(B, T, D)
    out = torch.nn.functional.linear(ctx, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    if average_attn_weights:
        attn = attn.sum(1) / num_head
    return out, attn


@decomp(aten._transformer_encoder_layer_fwd.default)
def _transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                   proj_bias, use_gelu, norm_first, eps, norm_weight_1, norm_bias_1,
                                   norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
                                   ffn_bias_2, mask=None, mask_type=None):
    F = torch.nn.functional
    if src.numel() == 0:
        return src.clone()

    def norm(t, w, b):
        return F.layer_norm(t, (embed_dim,), w, b, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                     proj_bias, mask, False, True, mask_type)[0]
    x = x + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    res = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    h = F.linear(x, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else F.relu(h)
    x = F.linear(h, ffn_weight_2, ffn_bias_2) + res
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x
