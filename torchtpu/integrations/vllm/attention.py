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


# prefill query-length buckets within this factor of each other share a padded group
GROUP_SPAN = 8


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

    The batch's requests form groups by their query length's power-of-two bucket (1:
    decodes; prefill buckets within a factor :data:`GROUP_SPAN` of a group's largest
    join it), each padded on its own, so that a long prefill pads neither the decodes
    nor the much shorter prefills of its step to its length.  A group of ``R`` requests (a
    power of two), ``Q`` query rows each (the bucket) and ``B`` blocks (a power of two
    holding its longest context) is four arrays, ``groups[g] = (query_index,
    block_table, seq_lens, query_lens)``:

    * ``query_index`` ``[R * Q]``: for request ``r`` and query row ``j``, one plus the
      token's index in the batch, or 0 (a zero row) past the request's tokens;
    * ``block_table`` ``[R, B]``: the requests' first ``B`` blocks (0 past their own);
    * ``seq_lens``, ``query_lens`` ``[R]``: each request's tokens after this step and its
      query tokens in it (0 and 0 for padding requests); query row ``j`` of request
      ``r`` sees keys ``0 .. seq_lens[r] - query_lens[r] + j``.

    Attributes:
        num_actual_tokens: tokens of the batch (``T``; the model step runs a padded
            count ``Tp >= T``, ``model_runner``).
        groups: the groups above, shortest queries first.
        token_rows: ``[max_num_batched_tokens]``: each token's row in the groups' rows
            laid end to end (group 0's ``R * Q`` rows first); one past the last row (a
            zero row) for padding tokens.  A step reads its first ``Tp``, so every shape
            follows the padded token count, never ``T``.
        slot_block, slot_offset: ``[max_num_batched_tokens]``: each token's KV slot as
            (block, offset in the block), block 0 for padding tokens; None when the
            step's host copies were not at hand (``_host``): the KV write then computes
            them from the slot mapping on the device.
        num_reqs, max_query_len: the groups' padded requests in all and longest query
            rows (for logs).

    Every index array is int32 on tpu, all of them views of one upload.
    """

    num_actual_tokens: int
    groups: tuple
    token_rows: torch.Tensor
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
        qlen = qsl[1:] - qsl[:-1]
        bs = self.block_size
        runner = _host.current()
        if runner is not None:  # the runner's host copies: no device op to build them
            bt = runner.input_batch.block_table[0]
            host_table = bt.block_table.np[:R0]
        else:  # (a dummy run or a direct call: one device read)
            bt = None
            host_table = cm.block_table_tensor[:R0].cpu().numpy()
        M = max(self.max_tokens or 0, T)
        rows = np.full(M, -1, dtype=np.int64)
        parts, shapes, base, Rs, Qs = [], [], 0, 0, 1
        # requests grouped by their query-row bucket (decodes: 1), each group padded on
        # its own (requests, query rows and blocks to powers of two; query rows capped at
        # the step's token budget, never at T): a long prompt pads only its own group
        cap = max(self.max_tokens or T, 1)
        qb = np.array([1 if q <= 1 else bucket(int(q), 1, cap) for q in qlen], np.int64)
        # (prefill buckets within a factor GROUP_SPAN of a group's largest join it: fewer
        # groups, so fewer distinct programs, where padding them together costs little)
        top = 0
        for b in sorted(set(qb.tolist()) - {1}, reverse=True):
            if top and top // b <= GROUP_SPAN:
                qb[qb == b] = top
            else:
                top = b
        for b in np.unique(qb):
            sel = np.nonzero(qb == b)[0]
            n = len(sel)
            R = bucket(n, 1, self.max_reqs)
            ql = np.zeros(R, np.int64)
            ql[:n] = qlen[sel]
            sq = np.zeros(R, np.int64)
            sq[:n] = seq[sel]
            start = qsl[:-1][sel]
            Q = int(b)
            B = bucket(max(int(-(-int(sq.max()) // bs)), 1), 1, max(host_table.shape[1], 1))
            j = np.arange(Q)
            valid = j[None, :] < ql[:n, None]
            qidx = np.zeros((R, Q), np.int64)
            qidx[:n] = np.where(valid, start[:, None] + j[None, :] + 1, 0)
            tab = np.zeros((R, B), np.int64)
            w = min(B, host_table.shape[1])
            tab[:n, :w] = host_table[sel, :w]
            r_loc = np.repeat(np.arange(n), ql[:n])
            within = np.arange(len(r_loc)) - np.repeat(np.cumsum(ql[:n]) - ql[:n], ql[:n])
            rows[start[r_loc] + within] = base + r_loc * Q + within
            parts += [qidx.reshape(-1), tab.reshape(-1), sq, ql]
            shapes += [(R * Q,), (R, B), (R,), (R,)]
            base += R * Q
            Rs, Qs = Rs + R, max(Qs, Q)
        rows[rows < 0] = base  # (padding tokens: a zero row past the end)
        parts.append(rows)
        if bt is not None:
            slots = np.full(M, -1, np.int64)
            k = min(M, bt.slot_mapping.np.shape[0])
            slots[:k] = bt.slot_mapping.np[:k]
            slots = np.maximum(slots, 0)  # (padding tokens: block 0, never read)
            parts += [slots // bs, slots % bs]
        # one upload of every index array (int32), the fields are views of it
        packed = torch.from_numpy(np.concatenate(parts).astype(np.int32)).to(self.device)
        fields, at = [], 0
        for p in parts:
            fields.append(packed[at: at + p.size])
            at += p.size
        groups = tuple(tuple(fields[g + i].view(shapes[g + i]) for i in range(4))
                       for g in range(0, len(shapes), 4))
        blk, off = (fields[-2], fields[-1]) if bt is not None else (None, None)
        return TpuAttentionMetadata(
            num_actual_tokens=T, groups=groups, token_rows=fields[len(shapes)],
            slot_block=blk, slot_offset=off, num_reqs=Rs, max_query_len=Qs)


def _paged_attention(q, kv_cache, token_rows, *groups, scale):
    """Paged attention of a ragged batch, in JAX (one XLA program per shape).

    ``q`` ``[Tp, H, D]``: the step's queries (``Tp`` the padded token count);
    ``kv_cache`` ``[N, Hk, bs, 2D]``: the layer's cache (key then value per slot);
    ``token_rows`` ``[Tp]``: each token's row in the groups' rows laid end to end;
    ``groups``: four arrays per group of requests (``TpuAttentionMetadata``):
    ``query_index`` ``[R * Q]``, ``block_table`` ``[R, B]``, ``seq_lens`` and
    ``query_lens`` ``[R]``.  Returns ``[Tp, H * D]`` in ``q``'s dtype: for each token,
    softmax(q k^T * scale) v over the keys its request holds up to its own position
    (scores and softmax in float32; GQA by head groups); zero rows for padding tokens."""
    import jax
    import jax.numpy as jnp

    Tp, H, D = q.shape
    N, Hk, bs, _ = kv_cache.shape
    G = H // Hk
    padded_q = jnp.concatenate([jnp.zeros((1, H, D), q.dtype), q])
    outs = []
    for g in range(0, len(groups), 4):
        query_index, block_table, seq_lens, query_lens = groups[g: g + 4]
        R, B = block_table.shape
        Q = query_index.shape[0] // R
        K = B * bs
        qr = padded_q[query_index].reshape(R, Q, Hk, G, D)
        kv = kv_cache[block_table]  # [R, B, Hk, bs, 2D]
        kv = kv.transpose(0, 2, 1, 3, 4).reshape(R, Hk, K, 2 * D)
        k, v = kv[..., :D].astype(q.dtype), kv[..., D:].astype(q.dtype)
        s = jnp.einsum("rqhgd,rhkd->rhgqk", qr, k,
                       preferred_element_type=jnp.float32) * jnp.float32(scale)
        j = jnp.arange(Q)
        keys = jnp.arange(K)
        pos = (seq_lens - query_lens)[:, None] + j[None, :]  # [R, Q]: each row's position
        valid = j[None, :] < query_lens[:, None]
        see = (keys[None, None, :] <= pos[:, :, None]) \
            & (keys[None, None, :] < seq_lens[:, None, None])
        # (rows of no token see key 0 only: no all-masked softmax)
        see = jnp.where(valid[:, :, None], see, keys[None, None, :] == 0)
        s = jnp.where(see[:, None, None], s, -jnp.inf)
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("rhgqk,rhkd->rqhgd", p, v.astype(jnp.float32))
        outs.append(o.reshape(R * Q, H * D).astype(q.dtype))
    outs.append(jnp.zeros((1, H * D), q.dtype))
    return jnp.concatenate(outs)[token_rows]


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
                             kv_cache, m.token_rows[: query.shape[0]],
                             *[t for grp in m.groups for t in grp], scale=self.scale)
        output.copy_(o.view(output.shape))
        return output
