"""Executable caches are bounded (torchtpu._device.executable_limit): a program meeting
thousands of shapes must not keep thousands of XLA executables loaded (each maps its code
into the process; past vm.max_map_count XLA crashed it)."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import torch, torchtpu
    from torchtpu.eager import defer, executor
    lim = int(__import__("os").environ["TORCHTPU_MAX_EXECUTABLES"])
    for n in list(range(1, 40)) + [3, 1, 17]:  # the last ones were evicted by then
        x_c = torch.arange(n, dtype=torch.float32)
        x_t = x_c.to("tpu")
        got = (x_t * 3 + 1).sum().cpu()
        want = (x_c * 3 + 1).sum()
        assert torch.equal(got, want), (n, got, want)
        assert len(executor._CACHE) <= lim, len(executor._CACHE)
    with torch.tpu.set_eager_mode("defer_and_fuse"):  # segments: a quarter of the bound
        for n in list(range(1, 12)) + [2, 1]:
            x_c = torch.arange(n, dtype=torch.float32)
            got = ((x_c.to("tpu") - 2) * 5).max().cpu()
            assert torch.equal(got, ((x_c - 2) * 5).max()), n
            assert len(defer._CACHE) <= max(1, lim // 4), len(defer._CACHE)
    m = torchtpu.metrics()
    print("EVICTIONS", m["executable_evictions"], "CACHED", len(executor._CACHE))
""")


def test_per_op_executables_are_bounded_and_evicted_signatures_rerun_correctly(tmp_path):
    env = dict(os.environ, TORCHTPU_MAX_EXECUTABLES="8", TORCHTPU_CACHE_DIR="off")
    script = tmp_path / "bounded.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("EVICTIONS")][-1]
    _, evictions, _, cached = line.split()
    assert int(evictions) > 0 and int(cached) <= 8, line


@pytest.mark.parametrize("raw", ["0", "many"])
def test_bad_limit_is_a_clear_error(raw):
    env = dict(os.environ, TORCHTPU_MAX_EXECUTABLES=raw)
    proc = subprocess.run([sys.executable, "-c", "import torchtpu._device.executable_limit"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "TORCHTPU_MAX_EXECUTABLES" in proc.stderr
