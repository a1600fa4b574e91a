"""vLLM on ``tpu``: a vLLM platform plugin (entry point group ``vllm.platform_plugins``).

vLLM asks every installed platform plugin whether it applies (:func:`register`); ours
answers with :class:`~torchtpu.integrations.vllm.platform.TpuPlatform` when a ``tpu``
device is usable, and vLLM then runs its engine (scheduler, continuous batching, paged KV
cache, prefix caching: all vLLM's) with our worker (``worker.TpuWorker``), model runner
(``model_runner.TpuModelRunner``: vLLM's own GPU model runner on the ``tpu`` device) and
attention backend (``attention.TpuAttentionBackend``: paged attention written in PyTorch
ops, lowered like any other ops).

Nothing here is imported unless vLLM is (the plugin's modules import ``vllm``).
"""

from __future__ import annotations

import os


def register() -> str | None:
    """vLLM's platform-plugin hook: the qualified name of our ``Platform`` class when a
    ``tpu`` device is usable in this process, else None (vLLM then picks another
    platform).  ``TORCHTPU_VLLM=0`` turns the plugin off."""
    if os.environ.get("TORCHTPU_VLLM", "1") == "0":
        return None
    try:
        import torch

        import torchtpu  # noqa: F401 (registers the tpu device)

        # (without opening the PJRT client here: vLLM may fork its processes after
        # this, and a child of a process with an open client hangs; a CPU PJRT device
        # always exists, so tpu is usable wherever torchtpu imports)
        if torch.tpu.is_initialized() and not torch.tpu.is_available():
            return None
    except Exception:  # noqa: BLE001 - a plugin that cannot load must not stop vLLM
        return None
    return "torchtpu.integrations.vllm.platform.TpuPlatform"
