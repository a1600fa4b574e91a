"""vLLM's ``Platform`` for ``tpu`` devices (vLLM 0.33; see ``torchtpu.integrations.vllm``).

What it decides for vLLM: the device (``tpu``, PyTorch's PrivateUse1 key), the worker
class (``worker.TpuWorker``), the attention backend (``attention.TpuAttentionBackend``),
memory figures (``torch.tpu.mem_get_info``), and the configuration it refuses or changes:
no CUDA graphs, none of vLLM's own compilation (it targets
Inductor: the model runner compiles the model with ``torch.compile(backend="tpu")``
itself, the attention layers traced into its graph), one device
(tensor parallelism is refused with a clear error for now).
"""

from __future__ import annotations

import os

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

logger = init_logger(f"vllm.{__name__}")  # (under "vllm": its log configuration)

_PKG = "torchtpu.integrations.vllm"


class TpuPlatform(Platform):
    """vLLM's view of a ``tpu`` device (one PJRT device: a TPU chip, else GPU or CPU).

    Mirrors vLLM's ``CpuPlatform``/``CudaPlatform`` in what it answers; raises
    ``ValueError`` from :meth:`check_and_update_config` for configurations the plugin
    cannot run (tensor/pipeline parallelism, LoRA, speculative decoding, MLA
    models, quantized weights or KV caches); mixture-of-experts layers run through
    ``moe.TpuUnquantizedFusedMoEMethod``."""

    _enum = PlatformEnum.OOT
    device_name: str = "tpu"
    device_type: str = "tpu"
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = "TPU"
    dist_backend: str = "gloo"
    device_control_env_var: str = "TORCHTPU_VISIBLE_DEVICES"
    simple_compile_backend: str = "tpu"
    supported_quantization: list[str] = []

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        """Raise ``ValueError`` for a model dtype other than float32/bfloat16/float16."""
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"torchtpu's vLLM plugin: dtype {dtype} is not supported on "
                             "tpu; use float32, bfloat16 or float16")

    @classmethod
    def verify_quantization(cls, quant: str) -> None:
        """Weight quantization is not supported yet: ``ValueError`` naming it."""
        raise ValueError(f"torchtpu's vLLM plugin: {quant} quantization is not supported "
                         "on tpu yet")

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.tpu.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        """Bytes of device memory (``torch.tpu.mem_get_info``'s total)."""
        return torch.tpu.mem_get_info(device_id)[1]

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        """Bytes of device memory held by tensors (``torch.tpu.memory_allocated``)."""
        return float(torch.tpu.memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.tpu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.tpu.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config,
                             num_heads: int | None = None) -> str:
        """Our paged attention (``attention.TpuAttentionBackend``) for every decoder
        model; MLA and sparse attention raise ``NotImplementedError``."""
        if getattr(attn_selector_config, "use_mla", False):
            raise NotImplementedError("torchtpu's vLLM plugin: MLA attention is not "
                                      "supported on tpu yet")
        if getattr(attn_selector_config, "use_sparse", False):
            raise NotImplementedError("torchtpu's vLLM plugin: sparse attention is not "
                                      "supported on tpu yet")
        if selected_backend is not None and getattr(selected_backend, "name", "") \
                not in ("", "CUSTOM"):
            logger.info("Attention backend %s is not available on tpu; using TPU_PAGED.",
                        selected_backend)
        return f"{_PKG}.attention.TpuAttentionBackend"

    @classmethod
    def get_punica_wrapper(cls) -> str:
        raise NotImplementedError("torchtpu's vLLM plugin: LoRA is not supported on tpu yet")

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def opaque_attention_op(cls) -> bool:
        """False: the attention layers call vLLM's ``unified_kv_cache_update`` /
        ``unified_attention_with_output`` as Python functions, which Dynamo traces into
        the model's graph (``attention.TpuAttentionImpl``: the KV cache write and the
        paged attention, reading the step's metadata tensors), so a step is one
        executable.  (As opaque custom ops they ran eagerly between compiled stretches:
        about 17 eager ops a step for two layers, 2.8 ms of host time.)"""
        return False

    @classmethod
    def supports_structured_output(cls) -> bool:
        return True

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        """Refuse what the plugin cannot run (``ValueError`` naming the option) and set
        what it needs: our worker, no vLLM compilation (the runner compiles the model
        itself unless ``enforce_eager``), no CUDA graphs, synchronous scheduling."""
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        parallel = vllm_config.parallel_config
        if parallel.tensor_parallel_size > 1 or parallel.pipeline_parallel_size > 1:
            raise ValueError(
                "torchtpu's vLLM plugin: tensor and pipeline parallelism are not supported "
                f"on tpu yet (tensor_parallel_size={parallel.tensor_parallel_size}, "
                f"pipeline_parallel_size={parallel.pipeline_parallel_size}); use 1")
        if vllm_config.lora_config is not None:
            raise ValueError("torchtpu's vLLM plugin: LoRA is not supported on tpu yet")
        if vllm_config.speculative_config is not None:
            raise ValueError("torchtpu's vLLM plugin: speculative decoding is not "
                             "supported on tpu yet")
        model = vllm_config.model_config
        if model is not None and getattr(model, "use_mla", False):
            raise ValueError("torchtpu's vLLM plugin: MLA models (DeepSeek-style "
                             "attention) are not supported on tpu yet")
        cache = vllm_config.cache_config
        if cache.cache_dtype not in ("auto", None):
            raise ValueError(f"torchtpu's vLLM plugin: kv_cache_dtype={cache.cache_dtype!r} "
                             "is not supported on tpu yet; use 'auto'")
        if parallel.worker_cls == "auto":
            parallel.worker_cls = f"{_PKG}.worker.TpuWorker"
        if parallel.distributed_executor_backend in (None, "mp"):
            parallel.distributed_executor_backend = "uni"
        comp = vllm_config.compilation_config
        comp.mode = CompilationMode.NONE
        comp.cudagraph_mode = CUDAGraphMode.NONE
        comp.cudagraph_capture_sizes = []
        # vLLM's engine core and workers run in new processes: spawned, not forked (a
        # forked child of a process that imported JAX hung deserializing its first
        # executable), as vLLM's CPU platform does; a script then guards its entry
        # point with if __name__ == "__main__"
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
