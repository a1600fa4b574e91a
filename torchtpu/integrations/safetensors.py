"""safetensors: ``device="tpu"`` for ``safe_open``, ``load_file`` and ``load_model``.

safetensors' Rust reader validates the device name against a fixed list ("cpu", "cuda",
"mps", "xpu", ...) and rejects ``"tpu"``.  It offers no registration point, so the one
integration point is its ``safe_open`` class: right after ``import safetensors`` (before
``safetensors.torch`` and transformers bind the name), ``safetensors.safe_open`` becomes
:class:`safe_open` below.  For a ``tpu`` device with the PyTorch framework it opens the
file on the CPU (memory-mapped, as the Rust reader does) and moves each tensor it hands
out to the device; for every other device it returns the Rust object itself, untouched.
``load_file`` and ``load_model`` go through ``safe_open``, so they follow.
"""

from __future__ import annotations

LO, HI = (0, 4), (1,)  # tested: 0.8.0; the Rust safe_open API is stable since 0.4
_TORCH_FRAMEWORKS = ("pt", "torch", "pytorch")


def _tpu_device(device):
    """The ``torch.device`` if ``device`` names a tpu device, else None (no torch import
    unless the name could be ours)."""
    if isinstance(device, str):
        if not device.startswith("tpu"):
            return None
    elif type(device).__name__ != "device":
        return None
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        return None
    return d if d.type == "tpu" else None


class _TpuSlice:
    """``get_slice`` on a tpu ``safe_open``: slices on the CPU, then moves the result."""

    def __init__(self, sl, device):
        self._sl = sl
        self._device = device

    def __getitem__(self, idx):
        return self._sl[idx].to(self._device)

    def __getattr__(self, name):  # get_shape, get_dtype, ...
        return getattr(self._sl, name)


def install(module):
    """Post-import hook for ``safetensors``: replace ``safetensors.safe_open``."""
    from torchtpu.integrations import check_version

    why = check_version("safetensors", getattr(module, "__version__", "0"), LO, HI)
    if why:
        return why
    orig = module.safe_open
    if getattr(orig, "_torchtpu", False):
        return None
    for name in ("get_tensor", "get_slice", "keys", "metadata", "__enter__", "__exit__"):
        if not hasattr(orig, name):
            return f"skipped: safetensors.safe_open has no {name}"

    class safe_open:
        """``safetensors.safe_open`` that also accepts a ``tpu`` device for PyTorch.

        ``safe_open(filename, framework="pt", device="tpu:N")`` reads the file on the CPU
        and returns tensors on ``tpu:N`` from ``get_tensor``, ``get_tensors`` and
        ``get_slice(...)[...]`` (same values, dtypes and shapes as a CPU load).  Any other
        device or framework: the Rust ``safe_open`` object itself.

        Raises:
            Whatever the Rust reader raises for the file (missing file, bad header...).
        """

        _torchtpu = True
        __wrapped__ = orig

        def __new__(cls, filename, framework, device="cpu", *args, **kwargs):
            dev = _tpu_device(device) if framework in _TORCH_FRAMEWORKS else None
            if dev is None:
                return orig(filename, framework, device, *args, **kwargs)
            self = object.__new__(cls)
            self._f = orig(filename, framework, "cpu", *args, **kwargs)
            self._device = dev
            return self

        def __enter__(self):
            self._f.__enter__()
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def get_tensor(self, name):
            return self._f.get_tensor(name).to(self._device)

        def get_tensors(self):
            return {k: v.to(self._device) for k, v in self._f.get_tensors().items()}

        def get_slice(self, name):
            return _TpuSlice(self._f.get_slice(name), self._device)

        def __getattr__(self, name):  # keys, metadata, offset_keys, ...
            return getattr(self._f, name)

    safe_open.__module__ = module.__name__
    safe_open.__qualname__ = "safe_open"
    module.safe_open = safe_open
    st = getattr(module, "torch", None)  # safetensors.torch imported before the hook ran
    if st is not None and getattr(st, "safe_open", None) is orig:
        st.safe_open = safe_open
    return None
