"""Paged attention for vLLM on ``tpu`` (vLLM 0.33's v1 attention-backend interface).

The KV cache of a layer is vLLM's paged cache, ``[num_blocks, num_kv_heads, block_size,
2 * head_size]`` (layout ``LBHNC``; one tensor per layer, ``model_runner``): per block,
head and position, the key then the value.  The platform makes the attention an opaque
op (``opaque_attention_op``): in the compiled model it runs eagerly between the graph's
compiled stretches, so the request layout never reaches the graph.  Per layer and step:

* :meth:`TpuAttentionImpl.do_kv_cache_update`: the new tokens' keys and values into
  their slots, one in-place ``index_put`` of the whole layer tensor at the scheduler's
  slot mapping (padding tokens, slot ``-1``, go to block 0, vLLM's null block, which no
  request reads);
* :meth:`TpuAttentionImpl.forward`: one op, ``torchtpu_vllm::paged_attention``
  (:func:`_paged_attention`, a JAX function made a PyTorch op with ``torchtpu.jax_op``,
  so one XLA program per shape on whatever PJRT device ``tpu`` is): the batch's queries
  (a ragged mix of prefill and decode tokens) laid out as ``[requests, longest query,
  heads, head_size]``, each request's keys and values gathered from its blocks up to the
  longest context, softmax attention where query ``j`` of request ``r`` sees keys ``0..
  ctx_r + j`` (``ctx_r`` the request's tokens before this step), then the rows back in
  the batch's order.  Equal to causal attention over each request's whole sequence (the
  math path; ``tests`` compare against Hugging Face on CPU).

The layouts are built on the host from vLLM's CPU copies of the query start locations
and sequence lengths (no device read); requests, query rows and blocks are padded to
powers of two and every shape follows the step's padded token count, so a new batch
composition meets shapes that have run before.
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

from torchtpu import jax_op
from torchtpu.integrations.vllm import _host
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
        num_actual_tokens: tokens of the batch (``T``; the model step runs a padded
            count ``Tp >= T``, ``model_runner``).
        query_index: ``[R * Q]`` on tpu: for request ``r`` and query row ``j``, one
            plus the token's index in the batch, or 0 (a zero row) past the request's
            tokens.
        token_rows: ``[max_num_batched_tokens]`` on tpu: each token's row ``r * Q +
            j`` in the padded layout; ``R * Q`` (a zero row) for padding tokens.  A step
            reads its first ``Tp``, so that every shape of the attention depends on the
            padded token count, never on ``T``.
        block_table: ``[R, B]`` on tpu: the requests' first ``B`` blocks (``B``
            blocks hold the longest context).
        seq_lens, query_lens: ``[R]`` on tpu: each request's tokens after this step
            and its query tokens in it (0 and 0 for padding requests); query row ``j``
            of request ``r`` sees keys ``0 .. seq_lens[r] - query_lens[r] + j``.
        slot_block, slot_offset: int32 ``[max_num_batched_tokens]`` on tpu: each token's
            KV slot as (block, offset in the block), block 0 for padding tokens; None
            when the step's host copies were not at hand (``_host``): the KV write then
            computes them from the slot mapping on the device.

    Every index array is int32, the fields are views of one upload.
        num_reqs, max_query_len: ``R`` and ``Q``.
    """

    num_actual_tokens: int
    query_index: torch.Tensor
    token_rows: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_lens: torch.Tensor
    slot_block: torch.Tensor | None
    slot_offset: torch.Tensor | None
    num_reqs: int
    max_query_len: int


class TpuAttentionMetadataBuilder(AttentionMetadataBuilder[TpuAttentionMetadata]):
    """Builds :class:`TpuAttentionMetadata` from vLLM's common metadata (host side)."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self.max_reqs = vllm_config.scheduler_config.max_num_seqs if vllm_config else None
        self.max_tokens = (vllm_config.scheduler_config.max_num_batched_tokens
                           if vllm_config else None)

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
        # (capped at the step's token budget, never at its exact token count T: a cap at
        # T made a new query-row count, a new program, for every new prompt length)
        Q = bucket(max(int(qlen.max()) if R0 else 1, 1), 1, max(self.max_tokens or T, 1))
        bs = self.block_size
        B = bucket(max(int(-(-int(seq.max()) // bs)) if R0 else 1, 1), 1,
                   max(table.shape[1], 1))
        j = np.arange(Q)
        valid = j[None, :] < qlen[:, None]  # [R, Q]
        qidx = np.where(valid, qsl[:-1, None] + j[None, :] + 1, 0)
        M = max(self.max_tokens or 0, T)
        rows = np.full(M, R * Q, dtype=np.int64)  # (padding tokens: a zero row past the end)
        r_of = np.repeat(np.arange(R), qlen)
        rows[: int(qsl[-1])] = r_of * Q + (np.arange(int(qsl[-1])) - qsl[:-1][r_of])
        parts = [qidx.reshape(-1), rows, seq, qlen]
        runner = _host.current()
        host_table = None
        if runner is not None:  # the runner's host copies: no device op to build them
            bt = runner.input_batch.block_table[0]
            host_table = np.zeros((R, B), np.int64)
            w = min(B, bt.block_table.np.shape[1])
            host_table[:R0, :w] = bt.block_table.np[:R0, :w]
            slots = np.full(M, -1, np.int64)
            n = min(M, bt.slot_mapping.np.shape[0])
            slots[:n] = bt.slot_mapping.np[:n]
            slots = np.maximum(slots, 0)  # (padding tokens: block 0, never read)
            parts += [host_table.reshape(-1), slots // bs, slots % bs]
        # one upload of every index array (int32), the fields are views of it
        packed = torch.from_numpy(np.concatenate(parts).astype(np.int32)).to(self.device)
        fields, at = [], 0
        for p in parts:
            fields.append(packed[at: at + p.size])
            at += p.size
        qi, tr, sl, ql = fields[:4]
        if host_table is not None:
            table_t, blk, off = fields[4].view(R, B), fields[5], fields[6]
        else:
            table_t, blk, off = _rows(table, R, B), None, None
        return TpuAttentionMetadata(
            num_actual_tokens=T, query_index=qi, token_rows=tr, block_table=table_t,
            seq_lens=sl, query_lens=ql, slot_block=blk, slot_offset=off,
            num_reqs=R, max_query_len=Q)


def _paged_attention(q, kv_cache, query_index, block_table, seq_lens, query_lens,
                     token_rows, *, scale):
    """Paged attention of a ragged batch, in JAX (one XLA program per shape).

    ``q`` ``[Tp, H, D]``: the step's queries (``Tp`` the padded token count);
    ``kv_cache`` ``[N, Hk, bs, 2D]``: the layer's cache (key then value per slot);
    ``query_index`` ``[R * Q]``: 1 + the token of request ``r``'s query row ``j`` (0: none);
    ``block_table`` ``[R, B]``; ``seq_lens``/``query_lens`` ``[R]``; ``token_rows``
    ``[Tp]``: each token's row ``r * Q + j`` (``R * Q``: none).  Returns ``[Tp, H * D]``
    in ``q``'s dtype: for each token, softmax(q k^T * scale) v over the keys its request
    holds up to its own position (scores and softmax in float32; GQA by head groups);
    zero rows for padding tokens."""
    import jax
    import jax.numpy as jnp

    Tp, H, D = q.shape
    R, B = block_table.shape
    Q = query_index.shape[0] // R
    N, Hk, bs, _ = kv_cache.shape
    G = H // Hk
    K = B * bs
    qr = jnp.concatenate([jnp.zeros((1, H, D), q.dtype), q])[query_index]
    qr = qr.reshape(R, Q, Hk, G, D)
    kv = kv_cache[block_table]  # [R, B, Hk, bs, 2D]
    kv = kv.transpose(0, 2, 1, 3, 4).reshape(R, Hk, K, 2 * D)
    k, v = kv[..., :D].astype(q.dtype), kv[..., D:].astype(q.dtype)
    s = jnp.einsum("rqhgd,rhkd->rhgqk", qr, k,
                   preferred_element_type=jnp.float32) * jnp.float32(scale)
    j = jnp.arange(Q)
    keys = jnp.arange(K)
    pos = (seq_lens - query_lens)[:, None] + j[None, :]  # [R, Q]: each row's position
    valid = j[None, :] < query_lens[:, None]
    see = (keys[None, None, :] <= pos[:, :, None]) & (keys[None, None, :] < seq_lens[:, None, None])
    # (rows of no token see key 0 only: no all-masked softmax)
    see = jnp.where(valid[:, :, None], see, keys[None, None, :] == 0)
    s = jnp.where(see[:, None, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("rhgqk,rhkd->rqhgd", p, v.astype(jnp.float32))
    o = o.reshape(R * Q, H * D).astype(q.dtype)
    return jnp.concatenate([o, jnp.zeros((1, H * D), q.dtype)])[token_rows]


_PAGED_ATTENTION = jax_op("torchtpu_vllm::paged_attention", _paged_attention,
                          static_argnames=("scale",))


def _layer_metadata(layer):
    """The step's :class:`TpuAttentionMetadata` for attention layer ``layer`` (vLLM's
    forward context), or None outside a step."""
    if layer is None:
        return None
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    meta = get_forward_context().attn_metadata
    if isinstance(meta, dict):
        meta = meta.get(getattr(layer, "layer_name", None))
    return meta if isinstance(meta, TpuAttentionMetadata) else None


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
        T = key.shape[0]
        m = _layer_metadata(layer)
        if m is not None and m.slot_block is not None:
            blk, off = m.slot_block[:T], m.slot_offset[:T]
        else:
            bs = kv_cache.shape[2]
            slots = slot_mapping[:T].to(torch.int64).clamp(min=0)
            blk, off = slots // bs, slots % bs
        kv_cache[blk, :, off] = torch.cat([key, value], -1).to(kv_cache.dtype)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: TpuAttentionMetadata | None,
                output: torch.Tensor, output_scale=None, output_block_scale=None):
        """``output`` (``[Tp, num_heads * head_size]`` or ``[Tp, num_heads, head_size]``,
        ``Tp`` the step's padded token count) = attention of ``query`` (``[Tp, num_heads,
        head_size]``) over each request's cached keys and values (written by
        :meth:`do_kv_cache_update`); padding tokens' rows are zero."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("torchtpu's vLLM attention: fused output "
                                      "quantization is not supported on tpu")
        if attn_metadata is None:  # (a profiling run without a cache)
            return output
        m = attn_metadata
        o = _PAGED_ATTENTION(query.reshape(query.shape[0], self.num_heads, self.head_size),
                             kv_cache, m.query_index, m.block_table, m.seq_lens,
                             m.query_lens, m.token_rows[: query.shape[0]], scale=self.scale)
        output.copy_(o.view(output.shape))
        return output
