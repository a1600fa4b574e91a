"""factory lowerings."""

from __future__ import annotations

from torchtpu.ops import aten, lower  # noqa: F401
