"""``torch.tpu.amp``: ``GradScaler`` and ``autocast`` with ``"tpu"`` filled in, shaped like
``torch.cuda.amp`` (the same classes as ``torch.amp.GradScaler("tpu")`` and
``torch.autocast("tpu")``)."""

from __future__ import annotations

import torch

__all__ = ["GradScaler", "autocast"]


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("tpu", ...)``: dynamic loss scaling for float16 training.

    The unscale / inf check (``_amp_foreach_non_finite_check_and_unscale_``) and the scale
    update (``_amp_update_scale_``) run on the device, with CPU's semantics.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        super().__init__("tpu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast("tpu", ...)``; ``dtype=None`` is ``torch.get_autocast_dtype("tpu")``."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype | None = None,
                 cache_enabled: bool = True) -> None:
        super().__init__("tpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)
