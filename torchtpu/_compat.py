"""The installed PyTorch's version, for the behaviours that changed inside the supported
range (torch 2.13-2.15).  Each use names the behaviour it follows; CPU PyTorch of the
same version is always the reference.

Changes in 2.14 that torchtpu follows (found by running the test suite on 2.14.1):

* ``sub`` with a bool operand raises ``NotImplementedError`` (``RuntimeError`` before);
* checked conversion of a float into an integer dtype (``fill_``, ``full``,
  ``masked_fill``, ...) truncates first: it overflows only when the value is below the
  type's minimum or at least its maximum + 1 (``fill_(127.9)`` on int8 gives 127;
  ``2.0**63`` into int64 raises, where 2.13 stored INT64_MIN);
* ``split_group`` keeps each list's rank order (a rank's position in its list is its
  rank in the new group) instead of sorting it;
* ``scaled_dot_product_attention`` refuses an explicit ``attn_mask`` together with
  ``is_causal=True``.

Changes in 2.15 (the suite on 2.15.0):

* ``init_process_group`` attaches a flight recorder hook to a group with registered
  backends, which needs the group's default backend (``ProcessGroupTPU`` sets gloo);
* integer ``clamp`` / ``hardtanh`` bounds outside the dtype saturate, except a ``min``
  above the range or a ``max`` below it, which raise "Clamp min value 300 is outside the
  representable range of Char" (``ops._scalar.clamp_integer_bounds``);
* ``argmax``/``argmin`` of bool and ``std``/``var`` of integers raise
  ``NotImplementedError``, ``aminmax`` of complex ``TypeError``.
"""

from __future__ import annotations

import torch


def _parse(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


TORCH = _parse(torch.__version__)


def torch_at_least(major: int, minor: int) -> bool:
    """Whether the installed PyTorch is ``major.minor`` or newer."""
    return TORCH >= (major, minor)


def error_since(major: int, minor: int, new: type, old: type = RuntimeError) -> type:
    """The exception type CPU raises for a check whose type changed in ``major.minor``:
    ``new`` from that version on, ``old`` before."""
    return new if torch_at_least(major, minor) else old
