"""sentence-transformers: ``SentenceTransformer(model)`` with no ``device`` runs on ``tpu``.

With ``device=None`` (and no ``model_kwargs["device_map"]``) ``SentenceTransformer``
asks ``sentence_transformers.util.get_device_name()``, which checks CUDA, MPS, NPU, XPU
and HPU and otherwise answers ``"cpu"``; it does not consult ``torch.accelerator``.  The
patch: when that answer is ``"cpu"`` and PyTorch's current accelerator is ``tpu``, answer
``"tpu"``.  An explicit ``device`` (``"cpu"``, ...) is never changed, nor is a
``device_map`` (accelerate's, see :mod:`torchtpu.integrations.accelerate`).

``get_device_name`` is imported by name into ``sentence_transformers.util`` and
``sentence_transformers.base.model``; the hook runs right after
``sentence_transformers.util.environment`` executes, so both pick up the patched function
(if sentence-transformers was imported before torchtpu, their references are updated too).

Version range tested: sentence-transformers 6.2.
"""

from __future__ import annotations

import sys

LO, HI = (6, 0), (7,)

_REFERENCES = ("sentence_transformers.util", "sentence_transformers.base.model")


def install(module):
    """Post-import hook for ``sentence_transformers.util.environment``: patch
    ``get_device_name``."""
    from importlib.metadata import version

    from torchtpu.integrations import check_version

    why = check_version("sentence-transformers", version("sentence-transformers"), LO, HI)
    if why:
        return why
    orig = getattr(module, "get_device_name", None)
    if orig is None:
        return "skipped: sentence_transformers.util.environment has no get_device_name"
    if getattr(orig, "_torchtpu", False):
        return None
    from torchtpu.integrations import replaces

    @replaces(orig, "``'tpu'`` when none of the devices above is found and PyTorch's "
              "current accelerator is tpu.")
    def get_device_name() -> str:
        name = orig()
        if name == "cpu":
            from torchtpu.integrations import tpu_is_the_accelerator

            if tpu_is_the_accelerator():
                return "tpu"
        return name

    module.get_device_name = get_device_name
    for name in _REFERENCES:  # imported before torchtpu: update their references too
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "get_device_name", None) is orig:
            mod.get_device_name = get_device_name
    return None
