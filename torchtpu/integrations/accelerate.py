"""Hugging Face accelerate: ``Accelerator()`` and ``device_map="auto"`` pick ``tpu``.

accelerate chooses its device in ``PartialState.default_device`` from a fixed list
(MPS, MLU, SDAA, MUSA, NPU, HPU, CUDA, XPU, Neuron, else CPU); its only override is the
``ACCELERATE_TORCH_DEVICE`` environment variable, which also overrides ``cpu=True``.  It
does not consult ``torch.accelerator``.  ``get_max_memory`` (behind ``device_map="auto"``)
likewise lists only those devices' memory.  So two narrow patches, each applied right
after its module is imported:

* ``PartialState.default_device``: when accelerate's own answer is the CPU and PyTorch's
  current accelerator is ``tpu`` (``torch.accelerator``), answer ``tpu``.  Any device
  accelerate knows, ``cpu=True``, ``use_cpu=True`` and ``ACCELERATE_TORCH_DEVICE`` keep
  their meaning.
* ``accelerate.utils.modeling.get_max_memory``: when ``tpu`` is the accelerator (then no
  CUDA/XPU/MPS device is, and the PrivateUse1-based NPU/MLU/MUSA/HPU backends cannot be
  loaded beside us), integer keys are ``tpu`` devices (``torch.device(N)`` is ``tpu:N``):
  with no argument it lists each ``tpu:N``'s free memory under ``N``, as it does for CUDA;
  with a user's ``max_memory`` it checks integer keys against the tpu device count.

Version range tested: accelerate 1.15 (the code patched has this shape since 0.2x).
"""

from __future__ import annotations

LO, HI = (1, 0), (2,)


def _version_ok():
    from importlib.metadata import version

    from torchtpu.integrations import check_version

    return check_version("accelerate", version("accelerate"), LO, HI)


def install_state(module):
    """Post-import hook for ``accelerate.state``: patch ``PartialState.default_device``."""
    why = _version_ok()
    if why:
        return why
    cls = getattr(module, "PartialState", None)
    prop = getattr(cls, "__dict__", {}).get("default_device")
    if not isinstance(prop, property):
        return "skipped: accelerate.state.PartialState.default_device is not a property"
    if getattr(prop.fget, "_torchtpu", False):
        return None
    orig = prop.fget

    def default_device(self):
        dev = orig(self)
        if dev.type == "cpu":
            from torchtpu.integrations import tpu_is_the_accelerator

            if tpu_is_the_accelerator():
                import torch

                return torch.device("tpu")
        return dev

    default_device.__doc__ = (orig.__doc__ or "") + (
        "\n        torchtpu: ``tpu`` when accelerate finds none of the devices above and "
        "PyTorch's current accelerator is tpu.\n")
    default_device._torchtpu = True
    default_device.__wrapped__ = orig
    cls.default_device = property(default_device)
    return None


def install_modeling(module):
    """Post-import hook for ``accelerate.utils.modeling``: patch ``get_max_memory``."""
    why = _version_ok()
    if why:
        return why
    orig = getattr(module, "get_max_memory", None)
    if orig is None:
        return "skipped: accelerate.utils.modeling has no get_max_memory"
    if getattr(orig, "_torchtpu", False):
        return None
    from torchtpu.integrations import replaces

    @replaces(orig, "with no argument, also lists each tpu device's free memory (key N = "
              "tpu:N) when PyTorch's current accelerator is tpu.")
    def get_max_memory(max_memory=None):
        from torchtpu.integrations import tpu_is_the_accelerator

        if not tpu_is_the_accelerator():  # CUDA, XPU, MPS, or no device: accelerate's own
            return orig(max_memory)
        import torch

        n = torch.tpu.device_count()
        if max_memory is None:
            out = orig(None)
            tpu = {i: torch.tpu.mem_get_info(i)[0] for i in range(n)}
            return {**tpu, **out}  # device indices first, as accelerate orders them
        # Integer keys are tpu devices: accelerate would check them against CUDA's count.
        ints = sorted(k for k in max_memory if isinstance(k, int))
        rest = orig({k: v for k, v in max_memory.items() if not isinstance(k, int)})
        for k in ints:
            if not 0 <= k < n:
                module.logger.warning(f"Device {k} is not available, available devices are "
                                      f"{list(range(n))}")
        conv = getattr(module, "convert_file_size_to_int")
        return {**{k: conv(max_memory[k]) if isinstance(max_memory[k], str) else max_memory[k]
                   for k in ints}, **rest}

    module.get_max_memory = get_max_memory
    return None
