"""Hugging Face transformers: ``pipeline(...)`` with no device runs on ``tpu``.

transformers 5 already knows the ``tpu`` accelerator through ``torch.accelerator``
(``is_torch_tpu_available``): ``TrainingArguments`` picks ``tpu:0`` by itself, and the
``Trainer`` follows accelerate (:mod:`torchtpu.integrations.accelerate`).  The one gap is
``Pipeline.__init__``: with ``device=None`` it documents "the first available
accelerator", but its list (MLU, MUSA, CUDA, NPU, HPU, XPU, MPS) ends on the CPU.  The
patch: when the pipeline is built with no ``device``, no accelerate device map, and that
list finds nothing while PyTorch's current accelerator is ``tpu``, pass ``device="tpu"``.
An explicit ``device`` (``-1``, ``"cpu"``, ...) is never changed.

Version range tested: transformers 5.24.
"""

from __future__ import annotations

LO, HI = (5, 0), (6,)


def _other_accelerator_available(base) -> bool:
    """Whether the pipeline's own device list would find a device (its order)."""
    names = ("is_torch_mlu_available", "is_torch_musa_available", "is_torch_cuda_available",
             "is_torch_npu_available", "is_torch_hpu_available", "is_torch_mps_available")
    for n in names:
        f = getattr(base, n, None)
        if f is not None and f():
            return True
    f = getattr(base, "is_torch_xpu_available", None)
    return bool(f is not None and f(check_device=True))


def install_pipeline(module):
    """Post-import hook for ``transformers.pipelines.base``: patch ``Pipeline.__init__``."""
    import inspect
    from importlib.metadata import version

    from torchtpu.integrations import check_version

    why = check_version("transformers", version("transformers"), LO, HI)
    if why:
        return why
    cls = getattr(module, "Pipeline", None)
    orig = getattr(cls, "__init__", None)
    if orig is None or getattr(orig, "_torchtpu", False):
        return None if orig is not None else "skipped: no transformers Pipeline"
    if "device" not in inspect.signature(orig).parameters:
        return "skipped: Pipeline.__init__ takes no device argument"

    n_before_device = list(inspect.signature(orig).parameters).index("device") - 2

    def __init__(self, model, *args, **kwargs):
        if (len(args) <= n_before_device and kwargs.get("device") is None
                and getattr(model, "hf_device_map", None) is None):
            from torchtpu.integrations import tpu_is_the_accelerator

            if not _other_accelerator_available(module) and tpu_is_the_accelerator():
                kwargs["device"] = "tpu"
        orig(self, model, *args, **kwargs)

    __init__.__doc__ = orig.__doc__
    __init__.__wrapped__ = orig
    __init__._torchtpu = True
    cls.__init__ = __init__
    return None
