"""``python -m torchtpu info``: the bug-report environment dump matches what the running
process sees."""

import json
import os
import subprocess
import sys
from importlib.metadata import version

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "torchtpu", *args], capture_output=True,
                          text=True, env=env, timeout=300, cwd=ROOT)


def test_info_json_matches_this_process():
    r = _run("info", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["versions"]["torch"] == version("torch")
    assert torch.__version__.startswith(info["versions"]["torch"].split("+")[0])
    assert info["versions"]["jax"] == version("jax")
    assert info["versions"]["jaxlib"] == version("jaxlib")
    assert info["platform"] == torch.tpu.get_device_properties(0).platform
    assert len(info["devices"]) == torch.tpu.device_count()
    d0 = info["devices"][0]
    assert d0["index"] == "tpu:0" and d0["kind"] == torch.tpu.get_device_name(0)
    assert d0["memory_total"] == torch.tpu.mem_get_info(0)[1]
    assert info["eager_mode"] == torch.tpu.eager_mode.name
    assert info["accelerator"] == "tpu"
    assert set(info["integrations"]) >= {"safetensors", "accelerate.state"}
    assert "xla_persistent_cache" in info["caches"]


def test_info_text_and_usage():
    r = _run("info")
    assert r.returncode == 0, r.stderr
    for word in ("platform:", "tpu:0:", "torch:", "jaxlib:", "eager mode:", "caches:"):
        assert word in r.stdout, word
    bad = _run("nonsense")
    assert bad.returncode == 2 and "unknown command" in bad.stderr
