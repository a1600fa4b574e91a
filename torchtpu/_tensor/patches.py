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
    global _orig_new
    if _orig_new is None:
        _orig_new = torch.UntypedStorage.__new__
        torch.UntypedStorage.__new__ = _storage_new
