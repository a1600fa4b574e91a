"""The host copies of the vLLM model runner running a step now.

vLLM's runner keeps numpy copies of what it uploads (query start locations, computed
token counts, block tables, slot mappings).  The plugin reads them instead of device
tensors where it builds layouts (``model_runner``'s slot mapping, ``attention``'s
metadata), so that building a layout costs no device op and no device read.
"""

from __future__ import annotations

import contextlib

_CURRENT: list = [None]


def current():
    """The ``TpuModelRunner`` inside :func:`stepping` now, or None (a dummy run, a unit
    test calling the attention directly)."""
    return _CURRENT[0]


@contextlib.contextmanager
def stepping(runner):
    """``runner``'s host copies are :func:`current` inside (several engines may live in
    one process; one step runs at a time)."""
    saved = _CURRENT[0]
    _CURRENT[0] = runner
    try:
        yield
    finally:
        _CURRENT[0] = saved


def upload(host, device):
    """``host`` (a numpy array or CPU tensor) as a new tensor on ``device``, transferred
    exactly as it is (never one of the eager executor's padded sequences: the plugin
    picks its own shapes, and the programs reading them must be the ones compiled at
    start-up)."""
    import torch

    from torchtpu.eager import handlers, padded

    t = torch.from_numpy(host) if not isinstance(host, torch.Tensor) else host
    with padded.exact_transfers():
        if device.index is not None and type(t) is torch.Tensor \
                and t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad:
            return handlers.to_device(t, device.index)  # (what .to(device) runs)
        return t.to(device)
