"""Lowerings of the gradient-scaling ops behind ``torch.amp.GradScaler``.

Only the functional overloads are lowered; the executor derives the in-place ops that
GradScaler calls (``_amp_foreach_non_finite_check_and_unscale_`` writes every gradient of
its ``Tensor[]`` argument and ``found_inf``; ``_amp_update_scale_`` writes the scale and the
growth tracker) and writes each result through the argument's view.  Both follow PyTorch's
CPU kernels (``aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp``) value for value,
including their argument checks (same exception type and message, minus "must be a CPU
tensor").
"""

from __future__ import annotations

import torch

from torchtpu.ops import aten, lower
from torchtpu.ops._scalar import scalar_check
from torchtpu.ops._util import jnp, npdt, scalar_type_name, tdtype


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise RuntimeError(msg)


@scalar_check
def _unscale_checks(vals):
    """Host-side argument checks of the CPU kernel (before the executable is looked up)."""
    grads, found_inf, inv_scale = vals[:3]
    if grads:
        _check(inv_scale.numel() == 1, "inv_scale must be a 1-element tensor.")
        _check(found_inf.numel() == 1, "found_inf must be a 1-element tensor.")
        _check(inv_scale.dtype == torch.float32, "inv_scale must be a float tensor.")
        _check(found_inf.dtype == torch.float32, "found_inf must be a float tensor.")
        for g in grads:
            if g.dtype not in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
                raise NotImplementedError(
                    f'"_amp_foreach_non_finite_check_and_unscale_cpu" not implemented for '
                    f"'{scalar_type_name(g.dtype)}'")
    return vals


@scalar_check
def _update_checks(vals):
    scale, growth_tracker, found_inf = vals[:3]
    _check(growth_tracker.numel() == 1, "growth_tracker must be a 1-element tensor.")
    _check(scale.numel() == 1, "current_scale must be a 1-element tensor.")
    _check(found_inf.numel() == 1, "found_inf must be a 1-element tensor.")
    _check(growth_tracker.dtype == torch.int32, "growth_tracker must be an int tensor.")
    _check(scale.dtype == torch.float32, "current_scale must be a float tensor.")
    _check(found_inf.dtype == torch.float32, "found_inf must be a float tensor.")
    return vals


@lower(aten._amp_foreach_non_finite_check_and_unscale.default, prepare=_unscale_checks)
def amp_foreach_non_finite_check_and_unscale(grads, found_inf, inv_scale):
    """Multiply every gradient by ``inv_scale``; set ``found_inf`` to 1.0 if any element of
    any gradient is inf or NaN (else keep its value: zeroing it is the caller's job).

    ``grads``: float64/float32/float16/bfloat16 tensors (half types are unscaled in float32
    and rounded once, as on CPU); ``found_inf``, ``inv_scale``: one-element float32.
    Returns ``(unscaled grads, found_inf)``.  Raises RuntimeError / NotImplementedError as
    the CPU kernel does for wrong sizes and dtypes.
    """
    if not grads:
        return [], found_inf
    np_ = jnp()
    inv = inv_scale.reshape(())
    bad = np_.asarray(False)
    out = []
    for g in grads:
        dt = tdtype(g)
        compute = g.astype(np_.float32) if dt in (torch.float16, torch.bfloat16) else g
        bad = bad | ~np_.all(np_.isfinite(compute))
        out.append((compute * inv.astype(compute.dtype)).astype(npdt(dt)))
    found = np_.where(bad, np_.ones_like(found_inf), found_inf)
    return out, found


@lower(aten._amp_update_scale.default, prepare=_update_checks)
def amp_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                     growth_interval):
    """GradScaler's scale update: on ``found_inf`` the scale is multiplied by
    ``backoff_factor`` and the tracker reset; otherwise the tracker counts the successful
    step and, on reaching ``growth_interval``, the scale is multiplied by ``growth_factor``
    (kept when that overflows float32) and the tracker reset.

    ``scale``: one-element float32; ``growth_tracker``: one-element int32; ``found_inf``:
    one-element float32.  The products are computed in float64 and rounded to float32, as
    the CPU kernel's ``float * double``.  Returns ``(new scale, new growth_tracker)``.
    """
    np_ = jnp()
    s64 = scale.astype(np_.float64)
    backed_off = (s64 * backoff_factor).astype(np_.float32)
    successful = growth_tracker + np_.int32(1)
    grown = (s64 * growth_factor).astype(np_.float32)
    grow = successful == growth_interval
    new_scale = np_.where(found_inf != 0, backed_off,
                          np_.where(grow & np_.isfinite(grown), grown, scale))
    new_tracker = np_.where((found_inf != 0) | grow, np_.zeros_like(growth_tracker), successful)
    return new_scale, new_tracker
