"""vLLM's model runner on ``tpu`` (vLLM 0.33): vLLM's own GPU model runner (input batch,
block tables, sampling) with the device ``tpu``, like vLLM's CPU runner does for ``cpu``:
CUDA streams, events and graphs are not used."""

from __future__ import annotations

import contextlib

import torch
from vllm.logger import init_logger
from vllm.v1.worker.block_table import BlockTable, SlotMappingMode
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

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


class TpuModelRunner(GPUModelRunner):
    """vLLM's ``GPUModelRunner`` on a ``tpu`` device, eager (no CUDA graphs)."""

    def __init__(self, vllm_config, device: torch.device):
        with _no_cuda_streams():
            super().__init__(vllm_config, device)
        self.use_cuda_graph = False
        # (every BlockTable of this process is ours: one platform per process)
        BlockTable.compute_slot_mapping = _slot_mapping

    def _sync_device(self) -> None:
        torch.tpu.synchronize(self.device)

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()
