"""The torchvision sweep's comparison and summary (no torchvision needed), and one model
end to end where torchvision imports (``.venv-vision``; ``make conformance-vision``)."""

import pytest
import torch

from torchtpu.conformance import vision


def test_tolerance_scales_with_output_magnitude():
    ref = torch.tensor([300.0, -2.0, 0.5])
    # float32 reassociation on logits in the hundreds: 1e-5 relative passes ...
    ok = vision._compare_tensors([("out", ref, (ref * (1 + 1e-6)).to("tpu"))], vision.FWD_TOL)
    assert ok["ok"], ok
    # ... a wrong small logit does not hide behind the large one
    bad = ref.clone()
    bad[2] += 0.1
    res = vision._compare_tensors([("out", ref, bad.to("tpu"))], vision.FWD_TOL)
    assert not res["ok"] and res["where"] == "out"


def test_missing_gradient_is_a_mismatch():
    res = vision._compare_tensors([("grad w", torch.ones(2), None)], vision.TRAIN_TOL)
    assert not res["ok"] and res["where"] == "grad w"


def test_summary_groups_root_causes():
    results = {
        "a": {"name": "a", "family": "f", "status": "pass", "params": 10,
              "input": [2, 3, 64, 64], "forward": {"max_abs_err": 0.0, "rel_err": 0.0}},
        "b": {"name": "b", "family": "f", "status": "error", "reason": "x",
              "missing_op": "aten.foo.default"},
        "c": {"name": "c", "family": "f", "status": "error", "reason": "y",
              "missing_op": "aten.foo.default"},
        "d": {"name": "d", "family": "f", "status": "skipped-size", "reason": "big"},
    }
    md = vision.summarize(results, 5)
    assert "| missing op aten.foo.default | 2 | b, c |" in md
    assert "passed on tpu: **1**" in md and "ran (CPU forward worked, within the size budget): **3**" in md


def _torchvision():
    try:
        import torchvision.models  # noqa: F401
    except Exception:  # PyPI's torchvision does not import beside torch 2.13.0+cpu
        return False
    return True


@pytest.mark.skipif(not _torchvision(), reason="torchvision does not import here")
def test_resnet18_forward_and_training_step():
    res = vision.run_model({"name": "resnet18", "family": "resnet"}, do_train=True)
    assert res["status"] == "pass", res
    assert res["train"]["status"] == "pass", res["train"]
