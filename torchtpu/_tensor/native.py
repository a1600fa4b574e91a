"""A small C++ helper (``_native.cpp``), compiled on first use (``torch.utils.cpp_extension``).

It provides what PyTorch 2.13's Python backend API cannot:

* tensors on ``tpu:N`` with N > 0 (the Python API creates every tensor on index 0);
* a C++ device guard for PrivateUse1 (:func:`install_device_guard`), installed on the
  first ``backward()`` after a tpu op ran and on the first use of ``tpu:N>0``.  PyTorch's
  Python device guard calls into Python from a destructor while the autograd engine
  unwinds an exception raised by a backward hook, which aborts the process; the C++
  guard never calls into Python;
* ``UntypedStorage.resize_`` of a tpu storage (:func:`torchtpu._tensor.storage.resize_bytes`,
  used by FSDP2): the StorageImpl's byte size set from Python;
* tensors made in one C++ call once the module is loaded (:data:`LOADED`,
  ``storage.tensor_on``: ~0.8 us against ~2.6 us through PyTorch's boxed ``set_``);
* ``HotPlan``: the C++ form of strict eager's per-op hot path (``torchtpu.eager.hotpath``;
  the executor gives every plan one through :data:`ON_LOAD` once the module is loaded);
* C++ PrivateUse1 kernels for the ops with a kernel of their own
  (``register_kernels``, by the executor once the module is loaded) and the C++
  PrivateUse1 fallback (``register_fallback``, at registration when an earlier process
  built the module: :func:`load_if_built`), which run ``HotPlan`` hits with no Python
  frame and hand every other call to the op's Python runner;
* ``graph_gather``: a compiled graph call's input loop (``torchtpu.compile.graph``,
  ``GraphExecutable._gather``) in one C++ call;
* C++ PrivateUse1 kernels for ``as_strided`` and ``view`` (PyTorch's own CPU kernels:
  metadata only), so a view op does not go through Python (~13 us each otherwise).
  Registered when the module loads, at registration (``import torch``) when an earlier
  process already built it with the same torch version (:func:`load_if_built`: no build
  on that path), or at a process's first view op.  Views
  they make are not counted in ``metrics()["view_ops"]``.

The build takes about half a minute once per machine and version of ``_native.cpp``
(cached under ``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``, in one
directory per source version and location; loading the cached build takes ~0.3 s per process) and
needs a C++ compiler and ``ninja`` (a dependency of torchtpu).
"""

from __future__ import annotations

import functools
import os
import warnings
import zlib


@functools.lru_cache(maxsize=None)
def module():
    """The compiled extension module, with its device guard installed.

    Raises:
        NotImplementedError: it cannot be built here (no compiler), naming the cause.
    """
    from torch.utils.cpp_extension import load

    src, name = _source_and_name()
    try:
        mod = load(name, [src], extra_cflags=list(_CFLAGS), verbose=False)
        mod.register_view_kernels()
        _write_built_for(mod)
    except Exception as e:  # pragma: no cover - depends on the machine's toolchain
        raise NotImplementedError(
            f"torchtpu: tensors on tpu:N>0 and UntypedStorage.resize_ on tpu need a "
            f"small C++ helper that could not be built here ({type(e).__name__}: {e})"
        ) from e
    _install_guard(mod)
    _loaded(mod)
    return mod


# -DNDEBUG: pybind11 otherwise checks that the GIL is held at every reference count change
# (PyGILState_Check), ~6% of a strict op's host time
_CFLAGS = ("-O2", "-DNDEBUG")


def _source_and_name():
    """``(path of _native.cpp, extension name)``: one build directory per source version and
    location: two checkouts on one machine (worktrees, an install beside a clone) would
    otherwise rebuild over each other's module on every load, since the source's path is
    part of the build command."""
    src = os.path.join(os.path.dirname(__file__), "_native.cpp")
    with open(src, "rb") as f:
        name = f"torchtpu_native_{zlib.crc32(f.read() + src.encode() + repr(_CFLAGS).encode()):08x}"
    return src, name


_view_kernels_tried = False
# the extension module once loaded in this process (by module() or
# view_kernels_if_built()), else None: storage.tensor_on makes tensors through it
LOADED = None
# called with the module once it is loaded (eager's hot path moves to C++ then)
ON_LOAD: list = []


def _loaded(mod) -> None:
    global LOADED
    if LOADED is None:
        LOADED = mod
        from torchtpu import _metrics

        _metrics.add_counter_source(mod.take_counts)  # the C++ kernels' counts
        for fn in ON_LOAD:
            fn(mod)


def load_if_built():
    """The helper module if this source version is already built for this torch (by an
    earlier process), else None; never builds.  Loading it registers the C++ ``as_strided``
    / ``view`` kernels.  Called at registration (``import torch``): a few ms."""
    view_kernels_if_built()
    return LOADED


def view_kernels_if_built() -> bool:
    """Register the C++ ``as_strided`` / ``view`` kernels if this source version of the
    helper is already built (by an earlier process); never builds.  Called once, at
    registration or at the first view op that reaches Python.  Returns whether they are
    registered now."""
    global _view_kernels_tried
    if _view_kernels_tried or LOADED is not None:
        return False
    _view_kernels_tried = True
    try:
        import importlib.util

        _, name = _source_and_name()
        path = os.path.join(_extensions_dir(), name, name + ".so")
        if not os.path.exists(path) or _built_for(path) != _torch_version():
            return False  # not built, or built against another torch (its ABI)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.register_view_kernels()
        _loaded(mod)
        return True
    except Exception:  # a stale or foreign build: the Python path stays
        return False


def _torch_version() -> str:
    import torch

    return torch.__version__


def _built_for(so_path: str):
    """The torch version the helper at ``so_path`` was last loaded with (written by
    :func:`module`, whose ``load`` rebuilds it when PyTorch's headers change), or None."""
    try:
        with open(so_path + ".torch_version") as f:
            return f.read().strip()
    except OSError:
        return None


def _write_built_for(mod) -> None:
    try:
        with open(mod.__file__ + ".torch_version", "w") as f:
            f.write(_torch_version())
    except (OSError, AttributeError):
        pass  # the fast path at the first view op then waits for a load()


def _extensions_dir() -> str:
    """Where ``torch.utils.cpp_extension.load`` builds (its ``_get_build_directory``'s
    parent), worked out without importing that module (~120 ms): ``TORCH_EXTENSIONS_DIR``,
    else ``<user cache>/torch_extensions/py<XY>_<cpu|cuXY>``.  A wrong guess only means
    no C++ view kernels until the helper is loaded."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return root
    import sys

    import torch
    from torch import _appdirs

    cu = "cpu" if torch.version.cuda is None else "cu" + torch.version.cuda.replace(".", "")
    py = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return os.path.join(os.path.realpath(_appdirs.user_cache_dir(appname="torch_extensions")),
                        f"{py}_{cu}")


def _install_guard(mod) -> None:
    from torchtpu._device import runtime, state

    try:
        count = runtime.device_count()
    except RuntimeError:
        count = 1
    # hand the current index over to the C++ guard: from now on it is the one place
    # that holds it (state.current_device reads it from there)
    mod.install_device_guard(max(count, 1), state.current_device)
    state._native = mod


_guard_failed = False


def install_device_guard() -> bool:
    """Install the C++ PrivateUse1 device guard (idempotent; builds the helper once).

    Returns False, after warning once, where the helper cannot be built (no C++
    compiler): the Python guard stays, and an exception raised by a backward hook then
    aborts the process as in PyTorch's Python backend API.
    """
    global _guard_failed
    if _guard_failed:
        return False
    try:
        module()
        return True
    except NotImplementedError as e:
        _guard_failed = True
        cause = e.__cause__ or e
        warnings.warn(
            f"torchtpu: could not build its C++ device guard ({type(cause).__name__}: "
            f"{cause}); PyTorch's Python device guard stays, with which an exception "
            "raised in a backward hook aborts the process",
            RuntimeWarning,
            stacklevel=2,
        )
        return False


def make_on_storage(storage, size, stride, offset, dtype):
    """A ``tpu`` tensor viewing ``storage`` (any device index)."""
    return module().make_on_storage(storage, list(size), list(stride), int(offset), dtype)
