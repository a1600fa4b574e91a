"""torch.compile on tpu: the Dynamo backend ``"tpu"`` (see docs/compile.md).

``torch.compile(model, backend="tpu")`` or, for graphs whose inputs are on tpu, plain
``torch.compile(model)`` (see :mod:`torchtpu.compile.routing`).  Pipeline: Dynamo ->
AOTAutograd (:mod:`torchtpu.compile.backend`) -> each ATen FX graph interpreted through
the eager lowering table into one ``jax.jit`` executable
(:mod:`torchtpu.compile.graph`).
"""

from __future__ import annotations


def tpu_backend(gm, example_inputs, **kwargs):
    """The Dynamo backend ``"tpu"`` (entry point of ``torch_dynamo_backends``); see
    :func:`torchtpu.compile.backend.tpu_backend`."""
    from torchtpu.compile.backend import tpu_backend as _backend

    return _backend(gm, example_inputs, **kwargs)


__all__ = ["tpu_backend"]
