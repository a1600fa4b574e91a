"""The conformance sweep's tolerances are CPU's: an OpInfo tolerance override declared for
another device (CUDA, Inductor on CUDA, MPS, XPU, ...) must not loosen the comparison of
tpu results with CPU results (project issue 27, "honest numbers")."""

from __future__ import annotations

import copy

import torch
from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride, tol
from torch.testing._internal.opinfo.core import DecorateInfo

from torchtpu.conformance.opinfo import (
    BASE_TOLERANCE,
    get_opinfo,
    run_sample,
    sample_inputs,
    tolerance,
)


def _foreign_float32_override(op):
    """A float32 toleranceOverride the OpInfo declares for a device other than CPU."""
    for info in op.decorators:
        if isinstance(info, DecorateInfo) and info.device_type not in (None, "cpu"):
            for dec in info.decorators:
                if isinstance(dec, toleranceOverride) and torch.float32 in dec.d:
                    return info.device_type, dec.d[torch.float32]
    return None


def test_cuda_only_override_does_not_loosen_float32():
    op = get_opinfo("atanh")
    foreign = _foreign_float32_override(op)
    # (the premise: PyTorch loosens atanh's float32 comparison for CUDA only)
    assert foreign is not None and foreign[1].atol > BASE_TOLERANCE[torch.float32][0]
    atol, rtol, source = tolerance(op, torch.float32)
    assert (atol, rtol) == BASE_TOLERANCE[torch.float32]
    assert source == "default"


class _FakeOp:
    """Just what :func:`tolerance` reads of an OpInfo."""

    def __init__(self, decorators):
        self.decorators = decorators


def test_override_applies_only_for_every_device_or_cpu():
    big = {torch.float32: tol(atol=1e-2, rtol=1e-2)}
    base = BASE_TOLERANCE[torch.float32]
    for dev in ("cuda", "mps", "xpu", "meta", "xla", "hpu"):
        op = _FakeOp([DecorateInfo(toleranceOverride(big), "TestCommon", device_type=dev),
                      DecorateInfo(precisionOverride({torch.float32: 1e-2}), device_type=dev)])
        assert tolerance(op, torch.float32)[:2] == base, dev
    for dev in (None, "cpu"):
        op = _FakeOp([DecorateInfo(toleranceOverride(big), "TestCommon", device_type=dev)])
        assert tolerance(op, torch.float32)[:2] == (1e-2, 1e-2), dev
    # a bare decorator (not a DecorateInfo) applies to every device
    assert tolerance(_FakeOp([precisionOverride({torch.float32: 1e-3})]),
                     torch.float32)[:2] == (1e-3, base[1])


def test_wrong_atanh_result_is_a_mismatch():
    """A tpu atanh that is off by 5e-3 everywhere (within CUDA's atol 9e-3, 500x float32's
    default) is a mismatch in the sweep, not a pass."""
    op = copy.copy(get_opinfo("atanh"))
    real = op.op

    def off(x, *args, **kwargs):
        r = real(x, *args, **kwargs)
        return r + 5e-3 if r.device.type == "tpu" else r

    op.op = off
    sample = sample_inputs(op, torch.float32, 1)[0]
    r = run_sample(op, sample, torch.float32)
    assert r.status == "mismatch", (r.status, r.detail)
    # and the unmodified op passes the same sample
    assert run_sample(get_opinfo("atanh"), sample, torch.float32).status == "pass"


def test_mps_overrides_without_a_device_type_do_not_apply():
    """Overrides in PyTorch's MPS-vs-CPU class (TestConsistency) or in tests named
    ``*_mps`` describe MPS even where they set no device_type: addbmm bfloat16 had
    atol 0.2 / rtol 0.6 from TestConsistency."""
    from torch.testing._internal.common_methods_invocations import op_db

    addbmm = next(o for o in op_db if o.name == "addbmm")
    atol, rtol, source = tolerance(addbmm, torch.bfloat16)
    assert (atol, rtol) == BASE_TOLERANCE[torch.bfloat16] and source == "default"
    conv = next(o for o in op_db if o.name == "nn.functional.conv_transpose1d")
    assert tolerance(conv, torch.float32)[2] == "default"
