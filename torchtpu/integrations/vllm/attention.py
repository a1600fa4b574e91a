"""Paged attention for vLLM on ``tpu`` (vLLM 0.33's v1 attention-backend interface).

The KV cache of a layer is vLLM's paged cache, ``[num_blocks, num_kv_heads, block_size,
2 * head_size]`` (layout ``LBHNC``; one tensor per layer, ``model_runner``): per block,
head and position, the key then the value.  The attention is not an opaque op
(``TpuPlatform.opaque_attention_op`` is False): Dynamo traces vLLM's attention functions
and these methods into the model's graph, the layer's KV cache and the step's metadata
tensors becoming graph inputs (the cache rewritten in place, its buffer donated), so a
step is one executable; the request layout reaches only the metadata's values, never a
shape or a guard.  Per layer and step:

* :meth:`TpuAttentionImpl.do_kv_cache_update`: the new tokens' keys and values into
  their slots, one in-place ``index_put`` of the whole layer tensor at the scheduler's
  slot mapping (padding tokens, slot ``-1``, go to block 0, vLLM's null block, which no
  request reads);
* :meth:`TpuAttentionImpl.forward`: one op, ``torchtpu_vllm::paged_attention``
  (:func:`_paged_attention`, a JAX function made a PyTorch op with ``torchtpu.jax_op``,
  so one XLA program per shape on whatever PJRT device ``tpu`` is): the batch's queries
  (a ragged mix of prefill and decode tokens) cut into tiles of consecutive tokens of one
  request; each tile meets its request's keys and values a chunk of blocks at a time
  (gathered through the block table) with an online softmax, query ``j`` of a request
  seeing keys ``0 .. ctx + j`` (``ctx`` the request's tokens before this step); then the
  rows back in the batch's order.  Equal to causal attention over each request's whole
  sequence (the math path; ``tests`` compare against Hugging Face on CPU).

The layout is built on the host from vLLM's CPU copies of the query start locations,
sequence lengths, block table and slot mapping (no device read) and uploaded once per
step.  Every shape follows the step's padded token count alone (the number of tiles, the
block table's rows), and the context lengths set only the loop's runtime trip count, so
a token bucket has one attention program, compiled at start-up, whatever the batch's
composition.
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
from torchtpu.integrations.vllm._shapes import padded_tokens


class TpuAttentionBackend(AttentionBackend):
    """vLLM attention backend ``TPU_PAGED``: decoder self-attention over a paged KV
    cache in float32/bfloat16/float16, any head size, causal, no sliding window shorter
    than ``max_model_len``, ALiBi, soft cap or sinks (those raise ``NotImplementedError``
    when a layer asks)."""

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


# query tiles of a step: at most about this many (a tile's rows: max(1, Tp // TILES))
TILES = 256
# keys per step of the attention's loop over a request's context, in KV-cache blocks
CHUNK_KEYS = 128


def tile_rows(num_tokens_padded: int) -> int:
    """Query rows per tile for a step of ``num_tokens_padded`` tokens: 1 up to
    :data:`TILES` tokens (each token a tile of its own: decodes waste nothing), then
    ``Tp // TILES`` (a long prefill: fewer, larger tiles, so fewer key gathers)."""
    return max(1, num_tokens_padded // TILES)


def tile_count(num_tokens_padded: int, max_reqs: int | None) -> int:
    """Tiles of a step of ``num_tokens_padded`` tokens (``Tp``), a function of ``Tp``
    alone: a request of ``q`` tokens takes ``ceil(q / rows)`` tiles, so ``R`` requests
    of ``T <= Tp`` tokens take fewer than ``Tp / rows + R`` (and ``R <= min(Tp,
    max_reqs)``); with one row per tile, exactly ``T <= Tp``."""
    rows = tile_rows(num_tokens_padded)
    if rows == 1:
        return num_tokens_padded
    reqs = num_tokens_padded if max_reqs is None else min(max_reqs, num_tokens_padded)
    return -(-num_tokens_padded // rows) + reqs


@dataclass
class TpuAttentionMetadata:
    """One step's attention layout (the same for every layer), in query tiles.

    Each request's query tokens (a ragged mix of prefills, chunks and decodes) are cut
    into tiles of ``rows`` consecutive tokens (:func:`tile_rows`; a request's last tile
    may be short), ``W`` tiles in all (:func:`tile_count`; unused tiles are empty).  Every
    shape is a function of the step's padded token count ``Tp`` (and vLLM's limits), so
    that each token bucket has one attention program, compiled at start-up, whatever
    the batch's requests, query lengths and context lengths:

    * ``tile_req``, ``tile_start``, ``tile_len``, ``tile_pos``, ``tile_seq`` ``[W]``: the
      tile's request (a row of ``block_table``), its first token's index in the batch,
      its tokens (0: an empty tile), its first token's position in the request, and the
      request's tokens after this step (keys ``0 .. tile_seq - 1`` exist; query row
      ``j`` sees keys ``0 .. tile_pos + j``);
    * ``block_table`` ``[min(Tp, max_reqs), B]``: the step's requests' KV-cache blocks
      (``B``: vLLM's blocks per request, rounded up to whole key chunks; 0 past a
      request's own);
    * ``token_rows`` ``[max_num_batched_tokens]``: each token's row among the tiles' rows
      (tile ``w``, row ``j`` is ``w * rows + j``); ``W * rows`` (a zero row) for padding
      tokens.  A step reads its first ``Tp``;
    * ``slot_block``, ``slot_offset`` ``[max_num_batched_tokens]``: each token's KV slot
      as (block, offset in the block); block 0 (vLLM's null block, never read) for
      padding tokens.

    Every array is int32 on tpu, all of them views of one upload at offsets that
    depend on ``Tp`` only.

    Attributes:
        num_actual_tokens: tokens of the batch (``T <= Tp``).
        rows: query rows per tile.
        chunk_blocks: KV-cache blocks per step of the attention's loop over keys
            (:data:`CHUNK_KEYS` keys).
        tiles: ``(tile_req, tile_start, tile_len, tile_pos, tile_seq)``.
        block_table, token_rows, slot_block, slot_offset: as above.
    """

    num_actual_tokens: int
    rows: int
    chunk_blocks: int
    tiles: tuple
    block_table: torch.Tensor
    token_rows: torch.Tensor
    slot_block: torch.Tensor
    slot_offset: torch.Tensor


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
            host_slots = bt.slot_mapping.np
        else:  # (a dummy run or a direct call: device reads)
            host_table = cm.block_table_tensor[:R0].cpu().numpy()
            host_slots = cm.slot_mapping.cpu().numpy()
        M = max(self.max_tokens or 0, T)
        Tp = padded_tokens(T, M)  # (the model step's token count: model_runner)
        rows = tile_rows(Tp)
        W = tile_count(Tp, self.max_reqs)
        # the tiles: request r's tokens qsl[r] .. qsl[r+1]-1 in tiles of `rows`
        ntiles = -(-qlen // rows)
        n = int(ntiles.sum())
        if n > W:
            raise AssertionError(f"paged attention: {n} query tiles for {T} tokens of "
                                 f"{R0} requests, room for {W} (padded tokens {Tp})")
        req = np.repeat(np.arange(R0), ntiles)
        k = np.arange(n) - np.repeat(np.cumsum(ntiles) - ntiles, ntiles)
        tiles = np.zeros((5, W), np.int64)
        tiles[0, :n] = req
        tiles[1, :n] = qsl[:-1][req] + k * rows
        tiles[2, :n] = np.minimum(rows, qlen[req] - k * rows)
        tiles[3, :n] = seq[req] - qlen[req] + k * rows
        tiles[4, :n] = seq[req]
        # each token's row among the tiles' rows; padding tokens: the zero row W * rows
        token_rows = np.full(M, W * rows, np.int64)
        nt = int(qsl[-1])  # (the requests' tokens: T less any padding)
        tok = np.arange(nt)
        r_of = np.repeat(np.arange(R0), qlen)
        within = tok - qsl[:-1][r_of]
        first_tile = np.cumsum(ntiles) - ntiles
        token_rows[:nt] = (first_tile[r_of] + within // rows) * rows + within % rows
        # the requests' blocks, padded to whole key chunks (the loop reads a chunk a step)
        chunk = max(1, CHUNK_KEYS // bs)
        width = -(-max(host_table.shape[1], 1) // chunk) * chunk
        table = np.zeros((min(Tp, self.max_reqs or Tp), width), np.int64)
        table[:R0, :host_table.shape[1]] = host_table
        slots = np.full(M, -1, np.int64)
        m = min(M, host_slots.shape[0])
        slots[:m] = host_slots[:m]
        slots[nt:] = -1
        slots = np.maximum(slots, 0)  # (padding tokens: block 0, never read)
        # one upload of every index array (int32), the fields are views of it; offsets
        # depend on Tp only (so do the programs that read them)
        parts = [token_rows, slots // bs, slots % bs, tiles.reshape(-1), table.reshape(-1)]
        packed = _host.upload(np.concatenate(parts).astype(np.int32), self.device)
        fields, at = [], 0
        for p in parts:
            fields.append(packed[at: at + p.size])
            at += p.size
        return TpuAttentionMetadata(
            num_actual_tokens=T, rows=rows, chunk_blocks=chunk,
            tiles=tuple(fields[3][i * W: (i + 1) * W] for i in range(5)),
            block_table=fields[4].view(table.shape), token_rows=fields[0],
            slot_block=fields[1], slot_offset=fields[2])


def _paged_attention(q, kv_cache, token_rows, block_table, tile_req, tile_start,
                     tile_len, tile_pos, tile_seq, *, scale, rows, chunk_blocks):
    """Paged attention of a ragged batch in query tiles, in JAX (one XLA program per
    shape, and every shape follows the step's padded token count).

    ``q`` ``[Tp, H, D]``: the step's queries; ``kv_cache`` ``[N, Hk, bs, 2D]``: the
    layer's cache (key then value per slot); ``token_rows`` ``[Tp]``, ``block_table``
    ``[R, B]`` and the tile arrays ``[W]``: :class:`TpuAttentionMetadata`.  Returns
    ``[Tp, H * D]`` in ``q``'s dtype: for each token, softmax(q k^T * scale) v over the
    keys its request holds up to its own position; zero rows for padding tokens.

    Each tile's queries meet its request's keys a chunk of ``chunk_blocks`` blocks at a
    time, with an online softmax (running maximum and sum, float32): the loop runs as
    many chunks as the step's longest request needs (a runtime count: a ``while`` loop),
    so neither the context lengths nor the request layout reach a shape.  GQA by head
    groups."""
    import jax
    import jax.numpy as jnp

    Tp, H, D = q.shape
    N, Hk, bs, _ = kv_cache.shape
    G = H // Hk
    W = tile_req.shape[0]
    ck = chunk_blocks * bs
    j = jnp.arange(rows)
    live = j[None, :] < tile_len[:, None]  # [W, rows]
    qi = jnp.where(live, tile_start[:, None] + j[None, :], Tp)
    padded_q = jnp.concatenate([q, jnp.zeros((1, H, D), q.dtype)])
    qw = padded_q[qi].reshape(W, rows, Hk, G, D)
    pos = tile_pos[:, None] + j[None, :]  # [W, rows]: each row's position
    table = block_table[tile_req]  # [W, B]
    seq = jnp.where(tile_len > 0, tile_seq, 0)
    nchunks = (jnp.max(seq) + ck - 1) // ck

    def step(c, carry):
        mx, total, acc = carry
        blocks = jax.lax.dynamic_slice_in_dim(table, c * chunk_blocks, chunk_blocks, 1)
        kv = kv_cache[blocks]  # [W, cb, Hk, bs, 2D]
        kv = kv.transpose(0, 2, 1, 3, 4).reshape(W, Hk, ck, 2 * D)
        k, v = kv[..., :D].astype(q.dtype), kv[..., D:].astype(jnp.float32)
        s = jnp.einsum("wqhgd,whkd->whgqk", qw, k,
                       preferred_element_type=jnp.float32) * jnp.float32(scale)
        keys = c * ck + jnp.arange(ck)
        see = (keys[None, None, :] <= pos[:, :, None]) \
            & (keys[None, None, :] < seq[:, None, None])  # [W, rows, ck]
        s = jnp.where(see[:, None, None], s, -jnp.inf)
        new = jnp.maximum(mx, s.max(-1))
        base = jnp.where(jnp.isfinite(new), new, 0.0)
        p = jnp.exp(s - base[..., None])
        scale_old = jnp.exp(mx - base)
        total = total * scale_old + p.sum(-1)
        acc = acc * scale_old[..., None] + jnp.einsum("whgqk,whkd->whgqd", p, v)
        return new, total, acc

    init = (jnp.full((W, Hk, G, rows), -jnp.inf, jnp.float32),
            jnp.zeros((W, Hk, G, rows), jnp.float32),
            jnp.zeros((W, Hk, G, rows, D), jnp.float32))
    _, total, acc = jax.lax.fori_loop(0, nchunks, step, init)
    o = acc / jnp.where(total > 0, total, 1.0)[..., None]  # (empty rows: 0)
    o = o.transpose(0, 3, 1, 2, 4).reshape(W * rows, H * D).astype(q.dtype)
    o = jnp.concatenate([o, jnp.zeros((1, H * D), q.dtype)])
    return o[token_rows]


_PAGED_ATTENTION = jax_op("torchtpu_vllm::paged_attention", _paged_attention,
                          static_argnames=("scale", "rows", "chunk_blocks"))



def _max_model_len() -> int:
    """The engine's ``max_model_len`` (vLLM's current config), or 0 outside one."""
    from vllm.config import get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()
    mc = getattr(cfg, "model_config", None) if cfg is not None else None
    return int(getattr(mc, "max_model_len", 0) or 0)


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
        if sliding_window not in (None, 0, -1) and sliding_window >= _max_model_len():
            # (a window no shorter than the longest sequence never leaves a key out:
            # full causal attention, as a model whose window exceeds max_model_len has)
            sliding_window = None
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
        if m is not None:
            blk, off = m.slot_block[:T], m.slot_offset[:T]
        else:  # (no step: the slot mapping on the device)
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
                             kv_cache, m.token_rows[: query.shape[0]], m.block_table,
                             *m.tiles, scale=self.scale, rows=m.rows,
                             chunk_blocks=m.chunk_blocks)
        output.copy_(o.view(output.shape))
        return output
