"""The Hugging Face architecture sweep's CI subset (``--subset ci``) against CPU.

Runs ``python -m torchtpu.conformance models --subset ci`` once (a subprocess; each
architecture in its own worker) and checks that every architecture of the subset matches
CPU: forward outputs (rtol=atol=1e-4) and, for causal LMs, 8 tokens of greedy generate.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

from torchtpu.conformance import models  # noqa: E402

# Architectures of the subset that fail today: {name: root cause}.
KNOWN_FAILURES: dict = {}


@pytest.fixture(scope="module")
def ci_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("models_sweep")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("TORCHTPU_CPU_FALLBACK", None)  # everything must run on tpu
    proc = subprocess.run(
        [sys.executable, "-m", "torchtpu.conformance", "models", "--subset", "ci",
         "--out", str(out), "--no-progress", "--timeout", "300"],
        capture_output=True, text=True, timeout=1800, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "models.json") as f:
        data = json.load(f)
    assert (out / "models.md").exists()
    return data["results"]


def _param(name):
    marks = ()
    if name in KNOWN_FAILURES:
        marks = pytest.mark.xfail(strict=False, reason=KNOWN_FAILURES[name])
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_param(n) for n in models.CI_SUBSET])
def test_architecture_matches_cpu(ci_results, name):
    res = ci_results.get(name)
    assert res is not None, f"{name} not recorded"
    assert res["status"] == "pass", json.dumps(res, indent=1)[:3000]
    if models.CI_SUBSET and "generate" in res:
        assert res["generate"]["status"] == "pass", res["generate"]


def test_ci_subset_is_enumerated():
    names = {a["name"] for a in models.enumerate_architectures()}
    missing = [n for n in models.CI_SUBSET if n not in names]
    assert not missing, missing


def test_compare_detects_mismatch():
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    a = BaseModelOutput(last_hidden_state=torch.zeros(2, 3), hidden_states=(torch.ones(2),))
    b = BaseModelOutput(last_hidden_state=torch.zeros(2, 3), hidden_states=(torch.ones(2) + 1e-3,))
    r = models.compare(a, b, **models.FWD_TOL)
    assert not r["ok"] and r["where"] == "out.hidden_states[0]"
    assert models.compare(a, a, **models.FWD_TOL)["ok"]
