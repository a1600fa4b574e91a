"""vLLM's model runner on ``tpu`` (vLLM 0.33): vLLM's own GPU model runner (input batch,
block tables, sampling) with the device ``tpu``, like vLLM's CPU runner does for ``cpu``:
CUDA streams, events and graphs are not used."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.block_table import BlockTable, SlotMappingMode
from vllm.v1.worker import gpu_model_runner as _gmr
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.utils import allocate_kv_cache as _vllm_allocate_kv_cache

from torchtpu.integrations.vllm import _host
from torchtpu.integrations.vllm._shapes import MIN_TOKENS, bucket, token_buckets

logger = init_logger(f"vllm.{__name__}")  # (under "vllm": its log configuration)


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
    """``BlockTable.compute_slot_mapping`` on the host (vLLM's is a Triton kernel over
    device tensors): token ``t`` of request ``r`` at position ``p`` goes to slot
    ``block_table[r, p // block_size] * block_size + p % block_size``; slots past the
    batch's tokens are -1.  Computed with numpy from the runner's host copies (query
    start locations, computed-token counts, the block table), then the whole buffer is
    copied to the device: one transfer of a fixed shape, where device ops would meet a
    new token count in every batch."""
    if self.slot_mapping_mode == SlotMappingMode.NONE:
        return
    if getattr(self, "dcp_world_size", 1) > 1:
        raise NotImplementedError("torchtpu's vLLM plugin: decode context parallelism")
    runner = _host.current()
    if runner is None:
        raise RuntimeError("torchtpu's vLLM plugin: compute_slot_mapping called outside "
                           "a step of TpuModelRunner (no host copies to read)")
    n = positions.shape[0]
    bs = self.block_size
    qsl = runner.query_start_loc.np[: num_reqs + 1].astype(np.int64)
    req = np.repeat(np.arange(num_reqs), qsl[1:] - qsl[:-1])
    pos = runner.input_batch.num_computed_tokens_cpu[req].astype(np.int64) \
        + (np.arange(len(req)) - qsl[req])
    out = self.slot_mapping.np
    out[: len(req)] = self.block_table.np[req, pos // bs].astype(np.int64) * bs + pos % bs
    out[len(req):] = -1
    if len(req) != n:
        raise AssertionError(f"slot mapping: {len(req)} tokens on the host, {n} on tpu")
    self.slot_mapping.gpu.copy_(self.slot_mapping.cpu)


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


def _copy_to_device(self, n: int | None = None) -> torch.Tensor:
    """``CpuGpuBuffer.copy_to_gpu`` as one upload of the whole buffer (returns the
    device buffer's first ``n`` elements, as vLLM's does).  vLLM copies the first ``n``
    elements, a write into a slice of the device buffer whose length is the step's
    exact token or request count: a new program for every new count.  The elements past
    ``n`` take the host buffer's values (what vLLM's device buffers hold there is never
    read: no asynchronous scheduling or speculative decoding on this platform)."""
    self.gpu.copy_(self.cpu)
    return self.gpu if n is None else self.gpu[:n]


class TpuModelRunner(GPUModelRunner):
    """vLLM's ``GPUModelRunner`` on a ``tpu`` device, eager (no CUDA graphs)."""

    def __init__(self, vllm_config, device: torch.device):
        with _no_cuda_streams():
            super().__init__(vllm_config, device)
        self.use_cuda_graph = False
        # (every BlockTable of this process is ours: one platform per process)
        BlockTable.compute_slot_mapping = _slot_mapping
        CpuGpuBuffer.copy_to_gpu = _copy_to_device

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

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's, then the model's forward compiled with ``torch.compile(backend="tpu",
        fullgraph=True, dynamic=False)`` unless ``enforce_eager``: one graph per token
        bucket (the token count is padded, :meth:`_determine_batch_execution_and_padding`),
        with the attention layers' custom ops (``opaque_attention_op``) run eagerly between
        its compiled stretches, so that the request layout (requests, query rows, blocks)
        never reaches the graph and its guards."""
        super().load_model(*args, **kwargs)
        if self.model_config.enforce_eager:
            return
        buckets = token_buckets(self.max_num_tokens)
        # one Dynamo entry per bucket (Dynamo's default keeps 8 per code object)
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, len(buckets) + 4)
        self.model.compile(backend="tpu", fullgraph=True, dynamic=False)

    def execute_model(self, *args, **kwargs):
        """vLLM's, with this runner's host copies readable (``_host.current``) by the
        slot mapping and the attention metadata."""
        with _host.stepping(self):
            return super().execute_model(*args, **kwargs)

    def _prepare_padding_mask(self, num_tokens_unpadded: int,
                              num_tokens_padded: int) -> torch.Tensor:
        """vLLM's padding mask (bool ``[num_tokens_padded]``, True past the step's
        tokens) built on the host and uploaded whole: vLLM fills two slices of a device
        buffer at the exact token count, a new program for every new count."""
        mask = np.arange(num_tokens_padded) >= num_tokens_unpadded
        return torch.from_numpy(mask).to(self.device)

    def _sync_device(self) -> None:
        torch.tpu.synchronize(self.device)

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()
