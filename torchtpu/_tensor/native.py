"""A tiny C++ helper, compiled on first use (``torch.utils.cpp_extension``).

Only tensors on ``tpu:N`` with N > 0 need it: PyTorch 2.13's Python backend API creates
every tensor on device index 0.  The build takes about half a minute once per machine
(cached under ``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) and needs
a C++ compiler and ``ninja`` (a dependency of torchtpu).
"""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=None)
def module():
    """The compiled extension module.

    Raises:
        NotImplementedError: it cannot be built here (no compiler), naming the cause.
    """
    from torch.utils.cpp_extension import load

    src = os.path.join(os.path.dirname(__file__), "_native.cpp")
    try:
        return load("torchtpu_native", [src], extra_cflags=["-O1"], verbose=False)
    except Exception as e:  # pragma: no cover - depends on the machine's toolchain
        raise NotImplementedError(
            f"torchtpu: tensors on tpu:N>0 need a small C++ helper that could not be "
            f"built here ({type(e).__name__}: {e})"
        ) from e


def make_on_storage(storage, size, stride, offset, dtype):
    """A ``tpu`` tensor viewing ``storage`` (any device index)."""
    return module().make_on_storage(storage, list(size), list(stride), int(offset), dtype)
