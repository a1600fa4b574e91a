"""vLLM's worker for ``tpu`` (vLLM 0.33): vLLM's GPU worker with the device set-up, the
memory budget and the warm-up of a ``tpu`` device (``model_runner.TpuModelRunner`` runs
the model)."""

from __future__ import annotations

import torch
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

logger = init_logger(f"vllm.{__name__}")  # (under "vllm": its log configuration)

# the default KV cache budget when tpu is the CPU PJRT device (vLLM's CPU backend
# defaults to 4 GiB too): 0.9 of host memory got the process killed for memory
CPU_KV_CACHE_BYTES = 4 << 30


# dummy steps per token bucket at most (start-up stops a bucket at one making nothing new,
# after executables.DONATE_AFTER + 1 of them)
_WARM_UP_STEPS = 10


def _load_native_helper() -> None:
    """Load torchtpu's C++ helper, building it first when this machine has no build for
    this torch yet (once, about 40 s; ``torchtpu._tensor.native``).  Training builds it at
    its first backward; a server never runs one, and without the helper every tpu view
    and eager op takes the Python path (a slice 11 us instead of 2, an eager op about
    twice as long here).  Without a C++ compiler: a warning, and serving goes on."""
    from torchtpu._tensor import native

    if native.LOADED is not None:
        return
    logger.info("tpu: building torchtpu's C++ helper (once per machine and torch "
                "version, about 40 s)")
    try:
        native.module()
    except NotImplementedError as e:
        logger.warning("tpu: serving without torchtpu's C++ helper, slower per step: %s", e)


class TpuWorker(Worker):
    """One ``tpu`` device serving one model replica (``tpu:<local_rank>``)."""

    def init_device(self) -> None:
        """``tpu:<local_rank>`` as this worker's device, vLLM's (single-rank) distributed
        state on gloo, the seed, then the model runner."""
        self.device = torch.device(f"tpu:{self.local_rank}")
        torch.tpu.set_device(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        init_worker_distributed_environment(self.vllm_config, self.rank,
                                            self.distributed_init_method, self.local_rank,
                                            current_platform.dist_backend)
        set_random_seed(self.model_config.seed)
        _load_native_helper()
        self._init_workspace_and_model_runner()

    def _make_model_runner(self):
        from torchtpu.integrations.vllm import moe
        from torchtpu.integrations.vllm.model_runner import TpuModelRunner

        moe.register()  # (before the model is built: its MoE layers' method)

        return TpuModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str):
        import contextlib

        return contextlib.nullcontext()

    def _scoped_allocator_max_split(self, max_split_size_mb: int):
        import contextlib

        return contextlib.nullcontext()

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: ``kv_cache_memory_bytes`` when given, else
        ``gpu_memory_utilization`` of the device's memory less what the weights and
        buffers hold now (``torch.tpu.mem_get_info`` / ``memory_allocated``); on the CPU
        PJRT platform, whose device memory is the host's own (the process, vLLM and the
        rest of the machine live in it too), at most :data:`CPU_KV_CACHE_BYTES`.  Raises
        ``ValueError`` when nothing is left."""
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            return int(explicit)
        free, total = torch.tpu.mem_get_info(self.device)
        used = torch.tpu.memory_allocated(self.device)
        budget = int(total * self.cache_config.gpu_memory_utilization) - used
        budget = min(budget, free)
        from torchtpu._device import runtime

        if runtime.platform() == "cpu" and budget > CPU_KV_CACHE_BYTES:
            logger.info("tpu runs on the CPU here: KV cache capped at %d bytes (set "
                        "kv_cache_memory_bytes for another size)", CPU_KV_CACHE_BYTES)
            budget = CPU_KV_CACHE_BYTES
        if budget <= 0:
            raise ValueError(
                f"torchtpu's vLLM plugin: no device memory left for the KV cache "
                f"(total {total} bytes, {used} held by the model, utilization "
                f"{self.cache_config.gpu_memory_utilization}); raise "
                "gpu_memory_utilization or set kv_cache_memory_bytes")
        logger.info("KV cache budget on %s: %d bytes", self.device, budget)
        return budget

    def compile_or_warm_up_model(self) -> CompilationTimes:
        """Compile the model for every token bucket before serving (unless
        ``enforce_eager``): a dummy step of each padded token count
        (``_shapes.token_buckets``), attention included, and the sampling of every
        request bucket (``TpuModelRunner.warm_up_sampling``), so that no request waits
        for a compile.  Logs the seconds and XLA compiles it took; returns
        them as vLLM's ``CompilationTimes`` (seconds)."""
        import time

        import torchtpu
        from torchtpu.eager.executables import DONATE_AFTER
        from torchtpu.integrations.vllm._shapes import token_buckets
        from torchtpu.integrations.vllm.model_runner import (_executables_made,
                                                             serve_warmed_up)

        runner = self.model_runner
        seconds = 0.0
        if not self.model_config.enforce_eager:
            from tqdm import tqdm

            m0 = torchtpu.metrics()
            t0 = time.perf_counter()
            sizes = token_buckets(runner.max_num_tokens)
            sampled: dict = {}
            for n in tqdm(sizes, desc="Compiling the model per token bucket (tpu)",
                          disable=not self.is_driver_worker):
                # dummy steps until one makes no new XLA executable, and at least as
                # many as a hot eager in-place op needs for its donating variant (the
                # KV-cache writes are inside the compiled graph now, donated there)
                for i in range(_WARM_UP_STEPS):
                    made = _executables_made()
                    hidden, _ = runner._dummy_run(n, force_attention=True,
                                                  skip_eplb=True, remove_lora=False)
                    runner.warm_up_sampling(hidden, sampled)
                    if i > DONATE_AFTER and _executables_made() == made:
                        break
            torch.tpu.synchronize(self.device)
            seconds = time.perf_counter() - t0
            serve_warmed_up(runner.model)
            m = torchtpu.metrics()
            logger.info("Compiled the model for %d token buckets (%s) in %.1f s: %d XLA "
                        "compiles, %.1f s of them", len(sizes),
                        ", ".join(map(str, sizes)), seconds,
                        m["compiles"] - m0["compiles"],
                        m["compile_seconds"] - m0["compile_seconds"])
        set_random_seed(self.model_config.seed)
        return CompilationTimes(language_model=seconds, encoder=0.0)

    def sleep(self, level: int = 1) -> None:
        logger.warning("sleep mode is not supported on tpu; ignored")

    def wake_up(self, tags=None) -> None:
        logger.warning("sleep mode is not supported on tpu; ignored")
