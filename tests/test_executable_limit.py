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
    from torchtpu.eager import defer, executables
    lim = int(__import__("os").environ["TORCHTPU_MAX_EXECUTABLES"])
    for n in list(range(1, 40)) + [3, 1, 17]:  # the last ones were evicted by then
        x_c = torch.arange(n, dtype=torch.float32)
        x_t = x_c.to("tpu")
        got = (x_t * 3 + 1).sum().cpu()
        want = (x_c * 3 + 1).sum()
        assert torch.equal(got, want), (n, got, want)
        assert len(executables.CACHE) <= lim, len(executables.CACHE)
    with torch.tpu.set_eager_mode("defer_and_fuse"):  # segments: a quarter of the bound
        for n in list(range(1, 12)) + [2, 1]:
            x_c = torch.arange(n, dtype=torch.float32)
            got = ((x_c.to("tpu") - 2) * 5).max().cpu()
            assert torch.equal(got, ((x_c - 2) * 5).max()), n
            assert len(defer._CACHE) <= max(1, lim // 4), len(defer._CACHE)
    m = torchtpu.metrics()
    print("EVICTIONS", m["executable_evictions"], "CACHED", len(executables.CACHE))
""")


def _run_bounded(tmp_path, source: str, bound: int):
    """Run ``source`` in a fresh process with at most ``bound`` executables, no disk cache;
    assert it exits 0 and return its stdout."""
    env = dict(os.environ, TORCHTPU_MAX_EXECUTABLES=str(bound), TORCHTPU_CACHE_DIR="off")
    script = tmp_path / "bounded.py"
    script.write_text(source)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc.stdout


def test_per_op_executables_are_bounded_and_evicted_signatures_rerun_correctly(tmp_path):
    out = _run_bounded(tmp_path, SCRIPT, 8)
    line = [ln for ln in out.splitlines() if ln.startswith("EVICTIONS")][-1]
    _, evictions, _, cached = line.split()
    assert int(evictions) > 0 and int(cached) <= 8, line


@pytest.mark.parametrize("raw", ["0", "many"])
def test_bad_limit_is_a_clear_error(raw):
    env = dict(os.environ, TORCHTPU_MAX_EXECUTABLES=raw)
    proc = subprocess.run([sys.executable, "-c", "import torchtpu._device.executable_limit"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "TORCHTPU_MAX_EXECUTABLES" in proc.stderr


EVICT_UNDER_DEFER = textwrap.dedent("""
    import torch, torchtpu
    OPS = [torch.sin, torch.cos, torch.exp, torch.tanh, torch.neg, torch.abs, torch.sigmoid,
           torch.relu, torch.floor, torch.ceil, torch.expm1, torch.square, torch.reciprocal,
           torch.atan, torch.sinh, torch.cosh]
    xc = torch.linspace(0.1, 0.9, 7)
    x = xc.to("tpu")
    shape = 100
    for r in range(3):
        for op in OPS:
            with torch.tpu.set_eager_mode("defer_and_fuse"):
                got = op(x).cpu()
            assert torch.allclose(got, op(xc)), (r, op.__name__, got, op(xc))
        for _ in range(90):  # new STRICT signatures evict every executable above
            shape += 1
            torch.ones(shape, device="tpu").add_(1)
        OPS = OPS[5:] + OPS[:5]
    print("OK")
""")


def test_fused_segments_never_reuse_an_evicted_executables_program(tmp_path):
    # DeferAndFuse keyed its fused segments on id(executable): once a bounded cache freed
    # an executable, a new one at the same address hit the old segment (wrong values or
    # an IndexError); segments now key on a serial number that is never reused
    assert "OK" in _run_bounded(tmp_path, EVICT_UNDER_DEFER, 64)
