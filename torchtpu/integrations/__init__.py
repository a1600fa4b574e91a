"""Integrations with third-party libraries: one module per library.

``import torch`` must stay cheap, so nothing here imports a third-party library.  At
registration (:func:`install`, called from :func:`torchtpu._device.register`) we only add a
post-import hook to ``sys.meta_path``: when one of the modules named in :data:`HOOKS` is
imported later, the matching integration runs right after that module's body executed
and before the importer sees it (so ``from safetensors import safe_open`` elsewhere gets
the integrated object).  A module already imported when :func:`install` runs (torchtpu
imported late) is integrated at once.

Each integration uses the library's documented extension point where one exists; where
only a patch works, the patch lives in that library's module here, checks the library's
version and the shape of what it patches (a library outside the tested range is left
alone, with one warning), and has a test that fails if the library changes underneath.

Set ``TORCHTPU_INTEGRATIONS=0`` to disable them all.
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
import warnings

# module imported by the user -> "torchtpu.integrations.<lib>:<function>"
HOOKS: dict[str, str] = {
    "safetensors": "torchtpu.integrations.safetensors:install",
    "accelerate.state": "torchtpu.integrations.accelerate:install_state",
    "accelerate.utils.modeling": "torchtpu.integrations.accelerate:install_modeling",
    "transformers.pipelines.base": "torchtpu.integrations.transformers:install_pipeline",
    "lightning.fabric.connector": "torchtpu.integrations.lightning:install",
    "lightning.pytorch.trainer.connectors.accelerator_connector":
        "torchtpu.integrations.lightning:install",
    "lightning.pytorch.trainer.setup": "torchtpu.integrations.lightning:install_setup",
    "lightning_fabric.connector": "torchtpu.integrations.lightning:install",
    "pytorch_lightning.trainer.setup": "torchtpu.integrations.lightning:install_setup",
    "pytorch_lightning.trainer.connectors.accelerator_connector":
        "torchtpu.integrations.lightning:install",
    "sentence_transformers.util.environment":
        "torchtpu.integrations.sentence_transformers:install",
    "torchao.kernel.intmm": "torchtpu.integrations.torchao:install",
    # imported by `import torch` already: applied at install (a small module, no imports)
    "torch.utils.data.dataloader": "torchtpu.integrations.torch_data:install",
}

_pending: dict[str, str] = {}
_applied: dict[str, str] = {}  # module name -> "ok" or why it was skipped


def _run(name: str, module) -> None:
    target = _pending.pop(name, None)
    if target is None:
        return
    mod_name, fn_name = target.split(":")
    try:
        result = getattr(importlib.import_module(mod_name), fn_name)(module)
        _applied[name] = "ok" if result is None else str(result)
    except Exception as e:  # an integration must never break the user's import
        _applied[name] = f"failed: {type(e).__name__}: {e}"
        warnings.warn(f"torchtpu: integration for {name} failed ({type(e).__name__}: {e}); "
                      f"{name} works as without torchtpu", RuntimeWarning, stacklevel=2)


class _LoaderProxy:
    """Wraps a module's loader: runs the integration after ``exec_module``; every other
    attribute is the real loader's."""

    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _run(self._name, module)

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry answering only for the module names in ``_pending``:
    it finds the real spec through the other finders and wraps its loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _LoaderProxy(spec.loader, fullname)
        return spec


_finder = _PostImportFinder()


def install() -> None:
    """Arm the post-import hooks (cheap: imports nothing).  Idempotent."""
    if os.environ.get("TORCHTPU_INTEGRATIONS", "1") in ("0", "false", "False", ""):
        return
    for name, target in HOOKS.items():
        if name not in _applied and name not in _pending:
            _pending[name] = target
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in list(_pending):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__spec__", None) is not None:
            _run(name, mod)


def status() -> dict[str, str]:
    """Which integrations ran: module name -> ``"ok"``, ``"pending"`` (library not imported
    yet) or the reason it was skipped."""
    out = {name: "pending" for name in _pending}
    out.update(_applied)
    return out


def version_tuple(v: str) -> tuple:
    """``"1.15.0.dev0"`` -> ``(1, 15, 0)`` (numeric leading parts only)."""
    parts = []
    for p in v.split("."):
        digits = ""
        for ch in p:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if digits != p:
            break
    return tuple(parts)


def check_version(lib: str, version: str, lo: tuple, hi: tuple) -> str | None:
    """None when ``lo <= version < hi``; else a reason (and one warning)."""
    v = version_tuple(version)
    if lo <= v < hi:
        return None
    why = (f"skipped: {lib} {version} is outside the tested range "
           f"[{'.'.join(map(str, lo))}, {'.'.join(map(str, hi))})")
    warnings.warn(f"torchtpu: {lib} integration {why}; {lib} will not pick the tpu "
                  f"device by itself", RuntimeWarning, stacklevel=3)
    return why


def tpu_is_the_accelerator() -> bool:
    """True when PyTorch's current accelerator is ``tpu`` and a device exists (opens the
    PJRT client: call only where a library picks its device)."""
    import torch

    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == "tpu" and torch.accelerator.is_available()


def replaces(orig, note: str):
    """Decorator for a patch that replaces the library function ``orig``: the patch takes
    ``orig``'s name, qualified name, module and docstring (``functools.update_wrapper``,
    so ``__wrapped__`` is ``orig``), the docstring gains ``note``, and ``_torchtpu``
    marks it so a second installation can tell it is already in place."""
    import functools

    def deco(fn):
        functools.update_wrapper(fn, orig)
        fn.__doc__ = (orig.__doc__ or "") + f"\n    torchtpu: {note}\n"
        fn._torchtpu = True
        return fn

    return deco
