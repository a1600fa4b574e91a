"""Which compiler a ``torch.compile`` graph on ``tpu`` tensors goes to (one place).

PyTorch 2.13's Inductor associates a device named "tpu" with Google's ``torch_tpu``
package, so ``torch.compile(model)`` (default backend ``"inductor"``) on our tensors fails
inside generated code with ``ModuleNotFoundError: No module named 'torch_tpu'``.  This
module wraps the entry of the default backend, ``torch._TorchCompileInductorWrapper``
(what ``torch.compile`` builds for ``backend="inductor"``), to look at the graph's example
inputs: a graph with a ``tpu`` input goes to the ``"tpu"`` backend; every other graph
(CPU, CUDA) goes to Inductor unchanged.

Telling ``torch.compile(m)`` from ``torch.compile(m, backend="inductor")``: both build the
same wrapper.  PyTorch 2.13 resolves a missing backend through
``torch._dynamo.backends.registry.get_default_backend()``; when that module is imported
(an import hook: Dynamo is not imported before the first ``torch.compile``) we set the
default to ``"inductor"`` as a string of a marker type, and register the ``"tpu"``
backend.  The wrapper's constructor reads which string its caller (``torch.compile``)
held: the marker routes tpu graphs to ``"tpu"`` silently; an explicit
``backend="inductor"`` with ``tpu`` inputs is routed to ``"tpu"`` too, with a warning
(once per process) naming ``backend="tpu"``: frameworks write that string for "compile
with the defaults" (accelerate's ``DynamoBackend`` has no other name for it, so HF
``Trainer(torch_compile=True)`` passes ``backend="inductor"``), and Inductor has no code
generator for our device.  Where the caller cannot be determined (another caller builds
the wrapper), the graph is routed to ``"tpu"``.

The same post-import hooks on Dynamo's modules register torchtpu's fake kernels, keep
Dynamo out of torchtpu's runtime, and spare a process's first compile of an optimizer step
the import of Inductor (:func:`_on_dynamo_optimizer`).

Installed by ``torchtpu._device.register()`` (cheap: imports nothing from Dynamo).
Checked against torch 2.13-2.15; other versions get a warning and no routing.
"""

from __future__ import annotations

import sys
import warnings

import torch

_installed = False
SUPPORTED = ((2, 13), (2, 16))  # [from, to)


class _DefaultInductor(str):
    """``"inductor"`` as ``torch.compile``'s default: equal to the string, but marks that
    the caller did not choose it."""


def ensure_registered() -> None:
    """Register the Dynamo backend ``"tpu"`` (idempotent; the ``torch_dynamo_backends``
    entry point does the same for an installed package)."""
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "tpu" not in _COMPILER_FNS:
        from torchtpu.compile.backend import tpu_backend

        register_backend(compiler_fn=tpu_backend, name="tpu")


def _has_tpu_input(inputs) -> bool:
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return True
    return False


_REGISTRY = "torch._dynamo.backends.registry"
_TRACE_RULES = "torch._dynamo.trace_rules"


def _on_registry(mod) -> None:
    """Dynamo's backend registry was imported: default marker, backend "tpu"."""
    if getattr(mod, "get_default_backend", lambda: None)() == "inductor":
        mod.set_default_backend(_DefaultInductor("inductor"))
    ensure_registered()


def _on_trace_rules(mod) -> None:
    """Dynamo must never trace torchtpu's runtime, nor JAX under it: our PrivateUse1 kernels
    are Python frames that run inside compiled functions' eager regions (graph breaks),
    and Dynamo's frame hook sees every frame they call."""
    import importlib.util

    # torchtpu's runtime packages only: models in torchtpu.bench / torchtpu.demo are
    # user code that Dynamo must trace
    for name in ("torchtpu._device", "torchtpu._tensor", "torchtpu.eager", "torchtpu.ops",
                 "torchtpu.compile", "torchtpu._metrics", "torchtpu._public",
                 "jax", "jaxlib", "ml_dtypes", "opt_einsum"):
        if importlib.util.find_spec(name) is not None:
            mod.add(name)


def _on_fake_impls(mod) -> None:
    """PyTorch's fake-kernel registry was imported: add torchtpu's fake kernels."""
    from torchtpu.compile import fake_kernels

    fake_kernels.install(mod)


def _on_dynamo_optimizer(mod) -> None:
    """Dynamo's optimizer support was imported.  Its ``_is_static_for_cudagraphs(x)``
    (asked for every gradient when Dynamo traces an ``opt.step()``) imports Inductor's
    CUDA graph trees, and with them ``compile_fx`` and all of Inductor's lowerings (~1 s
    of a process's first ``torch.compile`` of an optimizer step), before it looks at the
    device: for a tensor that is not on CUDA it answers True without them, as PyTorch's
    own function does for such tensors.  CUDA tensors still go to PyTorch's function."""
    orig = getattr(mod, "_is_static_for_cudagraphs", None)
    if orig is None or getattr(orig, "_torchtpu", False):
        return

    def _is_static_for_cudagraphs(x):
        if not x.is_cuda:
            return True
        return orig(x)

    _is_static_for_cudagraphs._torchtpu = True
    mod._is_static_for_cudagraphs = _is_static_for_cudagraphs


_HOOKS = {_REGISTRY: _on_registry, _TRACE_RULES: _on_trace_rules,
          "torch._subclasses.fake_impls": _on_fake_impls,
          "torch._dynamo.variables.optimizer": _on_dynamo_optimizer}


class _PostImportHook:
    """``sys.meta_path`` finder that runs a callback once one of Dynamo's modules in
    ``_HOOKS`` has been executed (it finds nothing itself; Dynamo is not imported before
    the first ``torch.compile``)."""

    def find_spec(self, name, path=None, target=None):
        cb = _HOOKS.get(name)
        if cb is None:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            cb(module)

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Install the routing (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    from torchtpu import _compat

    ver = _compat.TORCH
    W = getattr(torch, "_TorchCompileInductorWrapper", None)
    if not (SUPPORTED[0] <= ver < SUPPORTED[1]) or W is None:
        warnings.warn(f"torchtpu: torch {torch.__version__} is not one torch.compile routing "
                      f"was checked against; use torch.compile(..., backend='tpu')")
        return
    if any(name not in sys.modules for name in _HOOKS):
        sys.meta_path.insert(0, _PostImportHook())
    for name, cb in _HOOKS.items():
        if name in sys.modules:
            cb(sys.modules[name])

    orig_init, orig_call = W.__init__, W.__call__

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        chosen = sys._getframe(1).f_locals.get("backend")
        # explicit only when the caller demonstrably held the plain string
        self._torchtpu_explicit = type(chosen) is str and chosen == "inductor"

    def __call__(self, model_, inputs_, **kwargs):
        if _has_tpu_input(inputs_):
            if getattr(self, "_torchtpu_explicit", False):
                warnings.warn(
                    'torch.compile(..., backend="inductor") got a graph with inputs on the '
                    'tpu device; Inductor does not compile for tpu, so the graph is compiled '
                    'by backend="tpu" (name it, or no backend, to silence this)',
                    stacklevel=2)
            from torchtpu.compile.backend import tpu_backend

            return tpu_backend(model_, inputs_)
        return orig_call(self, model_, inputs_, **kwargs)

    W.__init__, W.__call__ = __init__, __call__
