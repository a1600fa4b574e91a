"""The few places where PyTorch assumes a C++ allocator for the backend, patched.

``torch.UntypedStorage(n, device="tpu")`` would call the (missing) PrivateUse1 C++
allocator and crash; ``torch.load(..., map_location="tpu")`` and ``storage.to("tpu")``
go through it.  We route that constructor to :func:`torchtpu._tensor.storage.new_storage`.
"""

from __future__ import annotations

import torch

_orig_new = None


def _storage_new(cls, *args, device=None, **kwargs):
    if device is not None:
        dev = torch.device(device)
        if dev.type == "tpu":
            from torchtpu._device import state
            from torchtpu._tensor import storage as _st

            index = state.current_device if dev.index is None else dev.index
            if len(args) == 0:
                n = 0
            elif len(args) == 1 and isinstance(args[0], int):
                n = args[0]
            else:
                raise NotImplementedError(
                    "torchtpu: torch.UntypedStorage(..., device='tpu') supports only a size"
                )
            return _st.new_storage((n,), torch.uint8, index)
    return _orig_new(cls, *args, device=device, **kwargs)


def install() -> None:
    """Install every patch (idempotent)."""
    global _orig_new
    if _orig_new is None:
        _orig_new = torch.UntypedStorage.__new__
        torch.UntypedStorage.__new__ = _storage_new
    install_pinned()
    install_accelerator()
    install_module_apply()


# --------------------------------------------------------------- pinned memory
# ``Tensor.pin_memory()`` asks the current accelerator's C++ hooks for a pinned-memory
# allocator, which a Python backend cannot provide.  Host->tpu copies go through a
# private host copy anyway (see handlers.host_array), so page-locking buys nothing:
# pin_memory() returns a copy marked as pinned, as CUDA returns a pinned copy.
_orig_pin = None
_orig_is_pinned = None


def _pin_memory(self, device=None):
    if self.device.type != "cpu":
        return _orig_pin(self, device) if device is not None else _orig_pin(self)
    if getattr(self, "_torchtpu_pinned", False):
        return self
    out = self.clone()
    out._torchtpu_pinned = True
    return out


def _is_pinned(self, device=None):
    if self.device.type != "cpu":
        return False
    return bool(getattr(self, "_torchtpu_pinned", False))


def install_pinned() -> None:
    global _orig_pin, _orig_is_pinned
    if _orig_pin is None:
        _orig_pin = torch.Tensor.pin_memory
        _orig_is_pinned = torch.Tensor.is_pinned
        torch.Tensor.pin_memory = _pin_memory
        torch.Tensor.is_pinned = _is_pinned


# --------------------------------------------------------------- torch.accelerator
# torch.accelerator's synchronize and memory queries call C++ device-allocator hooks that a
# Python backend cannot register; route them to torch.tpu when the accelerator is tpu.
_ACCEL = {
    "synchronize": "synchronize",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_peak_memory_stats",
    "empty_cache": "empty_cache",
    "get_memory_info": "mem_get_info",
}


def _accel_wrapper(orig, target):
    def fn(device_index=None, *args, **kwargs):
        dev = device_index
        if isinstance(dev, (str, torch.device)):
            dev = torch.device(dev)
            if dev.type != "tpu":
                return orig(device_index, *args, **kwargs)
            dev = dev.index
        return getattr(torch.tpu, target)(dev)

    fn.__name__ = getattr(orig, "__name__", target)
    fn.__doc__ = (f"torch.accelerator.{fn.__name__} for the tpu device: "
                  f"torch.tpu.{target} (see its docstring).")
    return fn


def install_accelerator() -> None:
    import torch.accelerator as acc

    for name, target in _ACCEL.items():
        orig = getattr(acc, name, None)
        if orig is not None and not getattr(orig, "_torchtpu", False):
            w = _accel_wrapper(orig, target)
            w._torchtpu = True
            setattr(acc, name, w)


# ------------------------------------------------------------ tied parameters
# Module.to("tpu") keeps a Parameter object only when torch._has_compatible_shallow_copy_type
# says the new tensor may replace its .data; PyTorch's C++ rule knows CPU/CUDA/MPS/HIP/XPU/HPU
# but not PrivateUse1, so every parameter becomes a new Parameter, and a parameter shared by
# two modules (tied embeddings / LM heads) would become two.  This wrapper re-ties them.
_orig_apply = None
_apply_depth = [0]


def _module_apply(self, fn, recurse=True):
    if _apply_depth[0]:
        return _orig_apply(self, fn, recurse)
    slots: dict = {}
    for mod in self.modules():
        for name, p in mod._parameters.items():
            if p is not None:
                slots.setdefault(id(p), []).append((mod, name))
    _apply_depth[0] += 1
    try:
        out = _orig_apply(self, fn, recurse)
    finally:
        _apply_depth[0] -= 1
    for places in slots.values():
        if len(places) > 1:
            first = places[0][0]._parameters[places[0][1]]
            for mod, name in places[1:]:
                mod._parameters[name] = first
    return out


def install_module_apply() -> None:
    global _orig_apply
    if _orig_apply is None:
        _orig_apply = torch.nn.Module._apply
        torch.nn.Module._apply = _module_apply
