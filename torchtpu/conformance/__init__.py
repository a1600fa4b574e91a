"""Conformance tooling: check the ``tpu`` device against PyTorch's CPU results.

* :mod:`torchtpu.conformance.opinfo` -- the OpInfo sweep (library + CLI):
  ``python -m torchtpu.conformance.opinfo --filter '^add$' --dtypes float32``.

Nothing here is imported by ``import torchtpu``; the modules import PyTorch's test
internals (``torch.testing._internal``) lazily.
"""

__all__ = ["opinfo"]
