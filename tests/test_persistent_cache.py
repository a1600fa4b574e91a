"""JAX's persistent compilation cache: a second process loads the executables the first
one compiled (per-op eager executables, DeferAndFuse segments, compiled graphs), with
the same results; TORCHTPU_CACHE_DIR moves or disables it."""

import json
import os
import subprocess
import sys
import time

import _budget


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
    "graph_executables_loaded": m["compile"]["executable_cache_hits"],
    "signatures": m["signature_cache"],
    "diff": max((eager - ref).abs().max().item(), (compiled - ref).abs().max().item(),
                (fused - ref).abs().max().item()),
    "dir": torchtpu.persistent_cache_directory(),
}))
"""


def _run(cache_dir):
    # the program's first part is the STRICT one, whatever mode the suite runs in; the
    # compiled graph launches its own executable (stitched, it would run as a segment,
    # through JAX's cache: tests/test_compile_cache.py)
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(cache_dir), TORCHTPU_EAGER_MODE="strict",
               TORCHTPU_STITCH_GRAPHS="0")
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
    # the fused segment; per-op executables and the compiled graph's are compiled outside
    # JAX's cache and stored under torchtpu's own keys (next to JAX's entries)
    assert first["cache"]["misses"] == 1
    assert first["diff"] < 1e-5
    assert any(cache.iterdir())

    second = _run(cache)
    assert second["cache"]["misses"] == 0
    assert second["compiles"] == 1  # the fused segment, loaded from JAX's cache
    # the compiled graph's executable comes from torchtpu's graph cache (stored next to
    # JAX's entries, torchtpu.compile.graph_cache), the per-op executables from the
    # signature cache (torchtpu.eager.signature_cache), the fused segment from JAX's
    assert first["graph_executables_loaded"] == 0
    assert second["graph_executables_loaded"] == 1
    assert first["signatures"]["hits"] == 0
    assert second["signatures"]["stores"] == 0
    assert second["signatures"]["hits"] == first["signatures"]["stores"] >= 3
    assert second["cache"]["hits"] == 1  # the DeferAndFuse segment
    assert second["diff"] == first["diff"]


@_budget.full_only  # (a 9 s process; the in-process tests read the same switch; CI's budget)
def test_off_disables_it(tmp_path):
    res = _run("off")
    assert res["dir"] is None
    assert res["cache"] == {"hits": 0, "misses": 0, "load_seconds": 0.0}
    assert res["signatures"] == {"hits": 0, "stores": 0, "load_seconds": 0.0,
                                 "structure_mismatches": 0}
    assert res["diff"] < 1e-5


def test_trim_deletes_least_recently_used_entries_beyond_the_cap(tmp_path):
    """The size cap: entries (``<key>-cache``) are deleted oldest use first, down to 80%
    of the cap, only when the directory exceeds it; JAX's ``-atime`` files go."""
    from torchtpu._device import persistent_cache

    now = 1_700_000_000
    for i in range(10):  # 10 entries of 1000 bytes, entry 0 the least recently used
        f = tmp_path / f"jit_op-{i:02d}-cache"
        f.write_bytes(b"x" * 1000)
        os.utime(f, (now + i, now + i))
    (tmp_path / "jit_op-00-atime").write_bytes(b"12345678")
    assert persistent_cache.trim(str(tmp_path), 20_000) == 0  # under the cap: kept
    assert not (tmp_path / "jit_op-00-atime").exists()
    assert persistent_cache.trim(str(tmp_path), 9_000) == 3  # down to 7,200 bytes
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [f"jit_op-{i:02d}-cache" for i in range(3, 10)]


def test_trim_counts_the_signature_cache_with_jax_entries(tmp_path):
    """The eager signature cache's files (``torchtpu-signatures/<key>.full|.quick``)
    share the cap with JAX's entries, least recently used first across both."""
    from torchtpu._device import persistent_cache

    now = 1_700_000_000
    sig = tmp_path / persistent_cache.SIGNATURE_DIR
    sig.mkdir()
    for i in range(6):  # interleaved ages: even i JAX's, odd i ours
        f = tmp_path / f"jit_op-{i:02d}-cache" if i % 2 == 0 else \
            sig / f"{i:040d}.{'full' if i % 4 == 1 else 'quick'}"
        f.write_bytes(b"x" * 1000)
        os.utime(f, (now + i, now + i))
    (sig / "notes.txt").write_bytes(b"y" * 5000)  # not an entry: neither counted nor deleted
    assert persistent_cache.trim(str(tmp_path), 5_000) == 2  # 6,000 -> 4,000 bytes
    assert sorted(p.name for p in tmp_path.glob("*-cache")) == ["jit_op-02-cache",
                                                               "jit_op-04-cache"]
    assert sorted(p.name for p in sig.iterdir()) == [f"{3:040d}.quick", f"{5:040d}.full",
                                                     "notes.txt"]


def test_no_lock_or_directory_scan_per_store():
    """JAX's own size cap locks and scans the whole cache directory on every store
    (0.75 s per compiled executable at 30,000 entries); torchtpu leaves it off."""
    code = ("import jax, torch, torchtpu; torch.ones(2, device='tpu').cpu(); "
            "print(jax.config.jax_compilation_cache_max_size, "
            "torchtpu.persistent_cache_directory() is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["-1", "True"]


def test_trim_runs_in_a_low_priority_process_once_an_hour(tmp_path):
    """The hourly size check runs as its own process (its scan held the GIL against the
    user's loop when it was a thread), claims the stamp before it starts (so processes
    starting together do not all scan) and is skipped within the hour."""
    import threading

    from torchtpu._device import persistent_cache

    stamp = tmp_path / persistent_cache._TRIM_STAMP
    for i in range(4):
        (tmp_path / f"jit_op-{i:02d}-cache").write_bytes(b"x" * 1000)
        os.utime(tmp_path / f"jit_op-{i:02d}-cache", (1_700_000_000 + i,) * 2)
    stamp.write_bytes(b"")
    os.utime(stamp, (0, 0))  # the last trim: long ago
    threads = {t.name for t in threading.enumerate()}
    proc = persistent_cache._start_trim(str(tmp_path), 3_000)
    assert proc is not None and proc.pid != os.getpid()
    assert time.time() - stamp.stat().st_mtime < 60  # claimed at start
    assert {t.name for t in threading.enumerate()} <= threads  # no thread of ours
    assert proc.wait(timeout=60) == 0
    assert sorted(p.name for p in tmp_path.glob("*-cache")) == ["jit_op-02-cache",
                                                               "jit_op-03-cache"]
    assert persistent_cache._start_trim(str(tmp_path), 1) is None  # within the hour
    assert len(list(tmp_path.glob("*-cache"))) == 2
