"""JAX's persistent compilation cache: a second process loads the executables the first
one compiled (per-op eager executables, DeferAndFuse segments, compiled graphs), with
the same results; TORCHTPU_CACHE_DIR moves or disables it."""

import json
import os
import subprocess
import sys


PROGRAM = r"""
import json, torch, torchtpu
torch.manual_seed(0)
x = torch.randn(7, 5)
w = torch.randn(5, 3)
def f(a, b):
    return torch.nn.functional.gelu(a @ b).sum(1)
eager = f(x.to("tpu"), w.to("tpu")).cpu()
compiled = torch.compile(f, backend="tpu")(x.to("tpu"), w.to("tpu")).cpu()
with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
    fused = f(x.to("tpu"), w.to("tpu")).cpu()
ref = f(x, w)
m = torchtpu.metrics()
print(json.dumps({
    "cache": m["persistent_cache"],
    "compiles": m["compiles"],
    "diff": max((eager - ref).abs().max().item(), (compiled - ref).abs().max().item(),
                (fused - ref).abs().max().item()),
    "dir": torchtpu.persistent_cache_directory(),
}))
"""


def _run(cache_dir):
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(cache_dir))
    env.pop("TORCHTPU_COMPILE_TIERS", None)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_every_executable(tmp_path):
    cache = tmp_path / "xla"
    first = _run(cache)
    assert first["dir"] == str(cache)
    assert first["cache"]["hits"] == 0
    assert first["cache"]["misses"] >= 3  # eager ops, a fused segment, a compiled graph
    assert first["diff"] < 1e-5
    assert any(cache.iterdir())

    second = _run(cache)
    assert second["cache"]["misses"] == 0
    assert second["cache"]["hits"] == first["cache"]["misses"]
    assert second["diff"] == first["diff"]


def test_off_disables_it(tmp_path):
    res = _run("off")
    assert res["dir"] is None
    assert res["cache"] == {"hits": 0, "misses": 0, "load_seconds": 0.0}
    assert res["diff"] < 1e-5
