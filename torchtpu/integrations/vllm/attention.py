"""Paged attention for vLLM on ``tpu`` (vLLM 0.33's v1 attention-backend interface).

The KV cache of a layer is vLLM's paged cache, ``[num_blocks, num_kv_heads, block_size,
2 * head_size]`` (layout ``LBHNC``; one tensor per layer, ``model_runner``): per block,
head and position, the key then the value.  Both are written and read with PyTorch ops
that lower like any other (one ``index_put`` of the whole layer tensor at the scheduler's
slot mapping, in place; a gather of each request's blocks through its block table), so
they run on whatever PJRT device ``tpu`` is:

* :meth:`TpuAttentionImpl.do_kv_cache_update`: the new tokens' keys and values into
  their slots (padding tokens, slot ``-1``, go to block 0, vLLM's null block, which no
  request reads);
* :meth:`TpuAttentionImpl.forward`: the batch's queries (a ragged mix of prefill and
  decode tokens) laid out as ``[requests, longest query, heads, head_size]``, each
  request's keys and values gathered from its blocks up to the longest context, and
  ``scaled_dot_product_attention`` with a mask that lets query ``j`` of request ``r``
  see keys ``0..ctx_r + j`` (``ctx_r`` the request's tokens before this step), then the
  rows back in the batch's order.  Equal to causal attention over each request's whole
  sequence (the math path, ``tests`` compare against Hugging Face on CPU).

The layouts are built on the host from vLLM's CPU copies of the query start locations
and sequence lengths (no device read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_interface import KVCacheLayout

from torchtpu.integrations.vllm._shapes import bucket


class TpuAttentionBackend(AttentionBackend):
    """vLLM attention backend ``TPU_PAGED``: decoder self-attention over a paged KV
    cache in float32/bfloat16/float16, any head size, causal, no sliding window, ALiBi,
    soft cap or sinks (those raise ``NotImplementedError`` when a layer asks)."""

    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float32, torch.bfloat16,
                                                      torch.float16]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return TpuAttentionImpl

    @staticmethod
    def get_builder_cls():
        return TpuAttentionMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # (any)

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size > 0

    @classmethod
    def supported_kv_cache_layouts(cls):
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


@dataclass
class TpuAttentionMetadata:
    """One batch's attention layout (the same for every layer).

    Attributes:
        num_actual_tokens: tokens of the batch (``T``).
        query_index: int64 ``[R * Q]`` on tpu: for request ``r`` and query row ``j``, the
            token's index in the batch, or ``T`` (a zero row) past the request's tokens.
        token_rows: int64 ``[T]`` on tpu: each token's row ``r * Q + j`` in the padded
            layout.
        block_table: int32 ``[R, B]`` on tpu: the requests' first ``B`` blocks (``B``
            blocks hold the longest context).
        mask: bool ``[R, 1, Q, B * block_size]`` on tpu: which keys each query sees.
        num_reqs, max_query_len: ``R`` and ``Q``.
    """

    num_actual_tokens: int
    query_index: torch.Tensor
    token_rows: torch.Tensor
    block_table: torch.Tensor
    mask: torch.Tensor
    num_reqs: int
    max_query_len: int


class TpuAttentionMetadataBuilder(AttentionMetadataBuilder[TpuAttentionMetadata]):
    """Builds :class:`TpuAttentionMetadata` from vLLM's common metadata (host side)."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self.max_reqs = vllm_config.scheduler_config.max_num_seqs if vllm_config else None

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> TpuAttentionMetadata:
        cm = common_attn_metadata
        R0 = cm.num_reqs
        T = cm.num_actual_tokens
        qsl = cm.query_start_loc_cpu[:R0 + 1].numpy().astype(np.int64)
        seq = cm.seq_lens_cpu_upper_bound
        if seq is None:  # (a device read: vLLM did not give the host copy)
            seq = cm.seq_lens[:R0].cpu()
        seq = seq[:R0].numpy().astype(np.int64)
        # requests, query rows and blocks padded to powers of two (padding requests have
        # no tokens), so that the attention's ops meet a few shapes, not one per batch
        table = cm.block_table_tensor
        R = bucket(max(R0, 1), 1, self.max_reqs)
        qsl = np.concatenate([qsl, np.full(R - R0, qsl[-1])])
        seq = np.concatenate([seq, np.zeros(R - R0, np.int64)])
        qlen = qsl[1:] - qsl[:-1]
        Q = bucket(max(int(qlen.max()) if R0 else 1, 1), 1, max(T, 1))
        bs = self.block_size
        B = bucket(max(int(-(-int(seq.max()) // bs)) if R0 else 1, 1), 1,
                   max(table.shape[1], 1))
        K = B * bs
        j = np.arange(Q)
        valid = j[None, :] < qlen[:, None]  # [R, Q]
        qidx = np.where(valid, qsl[:-1, None] + j[None, :], T)
        rows = np.full(T, R * Q, dtype=np.int64)  # (padding tokens: a row past the end)
        r_of = np.repeat(np.arange(R), qlen)
        rows[: int(qsl[-1])] = r_of * Q + (np.arange(int(qsl[-1])) - qsl[:-1][r_of])
        ctx = seq - qlen
        pos = ctx[:, None] + j[None, :]  # [R, Q] the query's position
        k = np.arange(K)
        mask = (k[None, None, :] <= pos[:, :, None]) & (k[None, None, :] < seq[:, None, None])
        mask &= valid[:, :, None]
        mask |= ~valid[:, :, None] & (k[None, None, :] == 0)  # (padding rows: one key)
        dev = self.device
        return TpuAttentionMetadata(
            num_actual_tokens=T,
            query_index=torch.from_numpy(qidx.reshape(-1)).to(dev),
            token_rows=torch.from_numpy(rows).to(dev),
            block_table=_rows(table, R, B),
            mask=torch.from_numpy(mask[:, None]).to(dev),
            num_reqs=R,
            max_query_len=Q,
        )


def _rows(table: torch.Tensor, R: int, B: int) -> torch.Tensor:
    """The first ``R`` rows and ``B`` columns of block table ``table`` as int64, zero
    rows added past its own (padding requests read block 0, masked out)."""
    t = table[:R, :B].to(torch.int64)
    if t.shape[0] < R or t.shape[1] < B:
        t = torch.nn.functional.pad(t, (0, B - t.shape[1], 0, R - t.shape[0]))
    return t


class TpuAttentionImpl(AttentionImpl[TpuAttentionMetadata]):
    """The attention of one layer: cache update and paged attention (module docstring)."""

    def __init__(self, num_heads: int, head_size: int, scale: float,
                 num_kv_heads: int | None = None, alibi_slopes=None, sliding_window=None,
                 kv_cache_dtype: str = "auto", logits_soft_cap=None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None, sinks=None) -> None:
        unsupported = {"alibi_slopes": alibi_slopes, "sliding_window": sliding_window,
                       "logits_soft_cap": logits_soft_cap, "sinks": sinks,
                       "kv_sharing_target_layer_name": kv_sharing_target_layer_name}
        for name, v in unsupported.items():
            if v not in (None, 0, -1):
                raise NotImplementedError(
                    f"torchtpu's vLLM attention: {name}={v!r} is not supported on tpu yet")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(
                f"torchtpu's vLLM attention: attention type {attn_type} is not supported "
                "on tpu yet (decoder self-attention only)")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = None

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write ``key``/``value`` (``[T, num_kv_heads, head_size]``) at ``slot_mapping``
        (``[T]``; negative: padding, written to block 0): one ``index_put`` of the whole
        layer tensor (a write through a view of it would copy the whole cache)."""
        bs = kv_cache.shape[2]
        T = key.shape[0]
        slots = slot_mapping[:T].to(torch.int64)
        slots = torch.where(slots < 0, torch.zeros_like(slots), slots)
        kv_cache[slots // bs, :, slots % bs] = torch.cat([key, value], -1).to(kv_cache.dtype)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: TpuAttentionMetadata | None,
                output: torch.Tensor, output_scale=None, output_block_scale=None):
        """``output[:T]`` (``[T, num_heads * head_size]`` or ``[T, num_heads,
        head_size]``) = attention of ``query`` (``[T, num_heads, head_size]``) over
        each request's cached keys and values (written by :meth:`do_kv_cache_update`)."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("torchtpu's vLLM attention: fused output "
                                      "quantization is not supported on tpu")
        if attn_metadata is None:  # (a profiling run without a cache)
            return output
        m = attn_metadata
        T, R, Q = m.num_actual_tokens, m.num_reqs, m.max_query_len
        H, D, Hk = self.num_heads, self.head_size, self.num_kv_heads
        q = query[:T].reshape(T, H, D)
        q = torch.cat([q, q.new_zeros(1, H, D)])[m.query_index].view(R, Q, H, D)
        kv = kv_cache[m.block_table]  # [R, B, Hk, bs, 2D]
        kv = kv.permute(0, 2, 1, 3, 4).reshape(R, Hk, -1, 2 * D)
        k, v = kv[..., :D].to(q.dtype), kv[..., D:].to(q.dtype)
        if Hk != H:
            k = k.repeat_interleave(H // Hk, dim=1)
            v = v.repeat_interleave(H // Hk, dim=1)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k, v, attn_mask=m.mask, scale=self.scale)  # [R, H, Q, D]
        o = o.transpose(1, 2).reshape(R * Q, H * D)
        o = torch.cat([o, o.new_zeros(1, H * D)])[m.token_rows]
        output[:T].copy_(o.view(output[:T].shape))
        return output
