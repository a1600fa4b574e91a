"""``torch.utils.data.DataLoader(num_workers>0)`` after the tpu runtime started.

On Linux the DataLoader forks its workers.  Once JAX has started, every fork prints JAX's
"os.fork() was called ... will likely lead to a deadlock" warning: the forked child has
none of the parent's PJRT threads, so a child that touches the device may hang.  The
workers of a tpu training loop never do: they load and collate CPU tensors, and the main
process moves each batch to tpu.  So, keeping ``fork`` (``spawn`` would re-run unguarded
scripts in every worker and pickle the dataset):

* quiet: JAX's fork warning is suppressed while a DataLoader starts its workers (only
  there; any other ``os.fork()`` still warns);
* safe: in such a worker, any use of a tpu device (``.to("tpu")``, ``torch.ones(...,
  device="tpu")``) raises a ``RuntimeError`` saying what to do, instead of hanging, as
  CUDA's "Cannot re-initialize CUDA in forked subprocess"; ``torch.tpu._is_in_bad_fork()``
  is True there.

A DataLoader given ``multiprocessing_context`` (``"spawn"``, ``"forkserver"``) is left
alone.  Patched: ``torch.utils.data.dataloader._MultiProcessingDataLoaderIter.__init__``
(private to PyTorch: version-checked, and guarded by tests/test_dataloader_workers.py).
"""

from __future__ import annotations

import os
import warnings

LO, HI = (2, 13), (2, 16)

_starting_workers = [False]
_FORK_WARNING = r"os\.fork\(\) was called"


def _bad_fork_error(*args, **kwargs):
    raise RuntimeError(
        "torchtpu: a tpu device was used in a DataLoader worker process forked after the "
        "tpu runtime started; a forked process cannot use the parent's PJRT client. Keep "
        "the dataset on the CPU and move each batch to tpu in the main process, or pass "
        "multiprocessing_context='spawn' to the DataLoader.")


def _after_fork_in_child() -> None:
    if not _starting_workers[0]:
        return
    _starting_workers[0] = False
    from torchtpu._device import runtime, tpu_module

    runtime.jax_device = _bad_fork_error  # every host->device copy and allocation asks it
    tpu_module._is_in_bad_fork = lambda: True


def install(module):
    """Hook for ``torch.utils.data.dataloader`` (already imported by ``import torch``)."""
    import torch

    from torchtpu.integrations import check_version

    why = check_version("torch", torch.__version__, LO, HI)
    if why:
        return why
    cls = getattr(module, "_MultiProcessingDataLoaderIter", None)
    orig = getattr(cls, "__init__", None)
    if orig is None:
        return "skipped: torch.utils.data.dataloader has no _MultiProcessingDataLoaderIter"
    if getattr(orig, "_torchtpu", False):
        return None

    def __init__(self, loader, *args, **kwargs):
        if loader.multiprocessing_context is not None or "jax" not in __import__("sys").modules:
            return orig(self, loader, *args, **kwargs)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_FORK_WARNING, category=RuntimeWarning)
            _starting_workers[0] = True
            try:
                return orig(self, loader, *args, **kwargs)
            finally:
                _starting_workers[0] = False

    __init__.__wrapped__ = orig
    __init__._torchtpu = True
    __init__.__doc__ = orig.__doc__
    cls.__init__ = __init__
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    return None
