"""vLLM's model runner on ``tpu`` (vLLM 0.33): vLLM's own GPU model runner (input batch,
block tables, sampling) with the device ``tpu``, like vLLM's CPU runner does for ``cpu``:
CUDA streams, events and graphs are not used."""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from vllm.logger import init_logger
from vllm.v1.worker.block_table import BlockTable, SlotMappingMode
from vllm.v1.worker import gpu_model_runner as _gmr
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.utils import allocate_kv_cache as _vllm_allocate_kv_cache

from torchtpu.integrations.vllm._shapes import MIN_TOKENS, bucket

logger = init_logger(__name__)


@contextlib.contextmanager
def _no_cuda_streams():
    """vLLM's runner makes CUDA streams and events at construction; on tpu they are
    placeholders (everything runs in the device's order anyway)."""

    class _Event:
        def __init__(self, *a, **k):
            pass

        def record(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def wait(self, *a, **k):
            pass

    class _Stream:
        def __init__(self, *a, **k):
            self.device = torch.device("tpu")

        def wait_stream(self, *a, **k):
            pass

        def synchronize(self):
            pass

    saved = torch.Event, torch.cuda.Stream, torch.cuda.Event
    torch.Event, torch.cuda.Stream, torch.cuda.Event = _Event, _Stream, _Event
    try:
        yield
    finally:
        torch.Event, torch.cuda.Stream, torch.cuda.Event = saved


def _slot_mapping(self, num_reqs: int, query_start_loc: torch.Tensor,
                  positions: torch.Tensor) -> None:
    """``BlockTable.compute_slot_mapping`` in PyTorch ops (vLLM's is a Triton kernel):
    token ``t`` of request ``r`` at position ``p`` goes to slot ``block_table[r, p //
    block_size] * block_size + p % block_size``; tokens past the batch's get -1."""
    if self.slot_mapping_mode == SlotMappingMode.NONE:
        return
    if getattr(self, "dcp_world_size", 1) > 1:
        raise NotImplementedError("torchtpu's vLLM plugin: decode context parallelism")
    n = positions.shape[0]
    bs = self.block_size
    qsl = query_start_loc[: num_reqs + 1].to(torch.int64)
    idx = torch.arange(n, device=positions.device)
    req = torch.searchsorted(qsl[1:], idx, right=True).clamp(max=max(num_reqs - 1, 0))
    table = self.block_table.gpu
    blocks = table[req, positions // bs].to(torch.int64)
    slots = torch.where(idx < qsl[num_reqs], blocks * bs + positions % bs,
                        torch.full_like(blocks, -1))
    out = self.slot_mapping.gpu
    out[:n] = slots
    if out.shape[0] > n:
        out[n:] = -1


def _allocate_per_layer(kv_cache_config, device, layout, kernel_block_sizes=None):
    """vLLM's ``allocate_kv_cache`` with one tensor per layer instead of typed views into
    one shared int8 buffer.  The layers' shapes, dtypes and sharing are vLLM's (its own
    function run on the ``meta`` device, which allocates nothing); each distinct view
    becomes a zero-filled tensor of its own.  A KV write then updates its own storage
    in place (a donated scatter), where a write through a view of the shared buffer made
    XLA copy the whole buffer (the executor's failed-check select reads the storage):
    16 MiB per layer per step, a 10x slower serving loop at 32 MiB of KV cache."""
    views = _vllm_allocate_kv_cache(kv_cache_config, torch.device("meta"), layout,
                                    kernel_block_sizes)
    made: dict = {}
    out = {}
    for name, v in views.items():
        t = made.get(id(v))
        if t is None:
            if not v.is_contiguous():
                raise NotImplementedError(
                    f"torchtpu's vLLM plugin: KV cache layer {name} is a non-contiguous "
                    f"view {tuple(v.shape)} / {v.stride()} (layout {layout})")
            t = made[id(v)] = torch.zeros(v.shape, dtype=v.dtype, device=device)
        out[name] = t
    return out


class TpuModelRunner(GPUModelRunner):
    """vLLM's ``GPUModelRunner`` on a ``tpu`` device, eager (no CUDA graphs)."""

    def __init__(self, vllm_config, device: torch.device):
        with _no_cuda_streams():
            super().__init__(vllm_config, device)
        self.use_cuda_graph = False
        # (every BlockTable of this process is ours: one platform per process)
        BlockTable.compute_slot_mapping = _slot_mapping

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes,
                                    kv_cache_allocation_context=None):
        """vLLM's, with one KV cache tensor per layer (:func:`_allocate_per_layer`)."""
        saved = _gmr.allocate_kv_cache
        _gmr.allocate_kv_cache = _allocate_per_layer
        try:
            return super().initialize_kv_cache_tensors(
                kv_cache_config, kernel_block_sizes, kv_cache_allocation_context)
        finally:
            _gmr.allocate_kv_cache = saved

    def _determine_batch_execution_and_padding(self, num_tokens: int, *args, **kwargs):
        """vLLM's choice, with the token count padded to a bucket (a power of two, at
        least :data:`MIN_TOKENS`, at most ``max_num_batched_tokens``): the model's ops
        then meet a few token counts instead of one per batch composition, so a new
        batch compiles nothing once each bucket has run (vLLM pads the same way for
        CUDA graphs; padding tokens write to block 0 and are never read)."""
        out = super()._determine_batch_execution_and_padding(num_tokens, *args, **kwargs)
        mode, desc, *rest = out
        padded = bucket(desc.num_tokens, MIN_TOKENS, self.max_num_tokens)
        if padded != desc.num_tokens:
            desc = dataclasses.replace(desc, num_tokens=padded)
        return (mode, desc, *rest)

    def _sync_device(self) -> None:
        torch.tpu.synchronize(self.device)

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()
