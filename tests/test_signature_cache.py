"""The eager executor's on-disk signature cache (``torchtpu.eager.signature_cache``): a
second process loads each per-op executable by its op signature instead of tracing,
lowering and compiling it, with the same results and the same device-side checks."""

import json
import os
import subprocess
import sys

import _budget
import pytest

pytestmark = pytest.mark.usefixtures("strict_mode")  # STRICT's own machinery

PROGRAM = r"""
import json, sys, torch, torchtpu
torch.manual_seed(0)
x = torch.randn(6, 4)
res = {}
t = x.to("tpu")
t[1:3].mul_(2.5)                                   # in-place through a view
res["ops"] = (torch.nn.functional.softmax(t, 1) @ t.T).sum(0).cpu().tolist()
res["half"] = t.to(torch.bfloat16).cumsum(0).float().cpu().tolist()
try:                                               # a device-side check
    # (an index computed on the device: a host-known one is checked before the op runs)
    torch.arange(5, device="tpu")[torch.tensor([1, 4], device="tpu") * 2 + 1].cpu()
    res["check"] = None
except IndexError as e:
    res["check"] = str(e).split(" (in ")[0]
m = torchtpu.metrics()
res["sig"] = m["signature_cache"]
res["compiles"] = m["compiles"]
res["quick"] = m["quick_compiles"]
res["tier_ups"] = m["tier_ups"]
print(json.dumps(res))
"""


def _run(cache_dir, **env_extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHTPU_SIGNATURE_CACHE", "TORCHTPU_COMPILE_TIERS")}
    env.update({"TORCHTPU_CACHE_DIR": str(cache_dir), "TORCHTPU_COMPILE_TIERS": "0",
                **env_extra})
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cpu_reference():
    import torch

    torch.manual_seed(0)
    x = torch.randn(6, 4)
    x[1:3].mul_(2.5)
    return ((torch.nn.functional.softmax(x, 1) @ x.T).sum(0).tolist(),
            x.to(torch.bfloat16).cumsum(0).float().tolist())


def test_second_process_loads_each_op_signature(tmp_path):
    """A second process loads every signature the first stored, with the same values and
    the device-side check's message (stored with the executable: no trace).

    The first process runs after one with the signature cache off and JAX's persistent
    cache on, standing in for an older torchtpu source: every signature key is new while
    JAX's cache already holds the same StableHLO, whose executable cannot be serialized
    again, so each signature is compiled afresh and stored (one chain of three processes
    covers both cases: the suite's time budget)."""
    old = _run(tmp_path / "c", TORCHTPU_SIGNATURE_CACHE="0")
    assert old["sig"]["stores"] == 0 and old["compiles"] >= 6
    first = _run(tmp_path / "c", TORCHTPU_UPSTREAM_STALE=str(tmp_path / "a.txt"))
    assert first["sig"]["hits"] == 0 and first["sig"]["stores"] == first["compiles"] >= 6
    # torchtpu variables that do not change programs (a file path) do not enter the key
    second = _run(tmp_path / "c", TORCHTPU_UPSTREAM_STALE=str(tmp_path / "b.txt"))
    assert second["sig"]["hits"] == first["sig"]["stores"]
    assert second["sig"]["stores"] == 0 and second["compiles"] == 0
    ops, half = _cpu_reference()
    for run in (old, first, second):
        assert max(abs(a - b) for a, b in zip(run["ops"], ops)) < 1e-4
        assert run["half"] == half
    # the check's message was stored with the executable (no trace in the second process)
    assert old["check"] == first["check"] == second["check"] == \
        "index out of bounds for dimension 0 with size 5"


@_budget.full_only  # (the quick tier is opt-in; an 11 s process pair: CI's time budget)
def test_quick_tier_entries_are_stored_and_tier_up_as_before(tmp_path):
    """With the quick compile tier on, a signature used once is stored at the quick
    tier; a later process loads it, and a second call still recompiles it at the full
    tier (stored too, so a third process loads the full tier directly)."""
    # (element-wise options off: on CPU they are the quick options, so element-wise
    # signatures would compile once at the full tier, eager.tiers)
    env = dict(TORCHTPU_COMPILE_TIERS="1", TORCHTPU_ELEMENTWISE_OPTIONS="0")
    first = _run(tmp_path / "c", **env)
    assert first["quick"] == first["compiles"] == first["sig"]["stores"] >= 6
    second = _run(tmp_path / "c", **env)
    assert second["sig"]["hits"] == first["sig"]["stores"] and second["compiles"] == 0
    ops, half = _cpu_reference()
    assert second["half"] == half
    assert max(abs(a - b) for a, b in zip(second["ops"], ops)) < 1e-4


def test_off_with_the_environment_variable(tmp_path):
    # (one process: with nothing stored, a second one has nothing it could load)
    res = _run(tmp_path / "c", TORCHTPU_SIGNATURE_CACHE="0")
    assert res["sig"] == {"hits": 0, "stores": 0, "load_seconds": 0.0,
                          "structure_mismatches": 0}
    assert res["compiles"] >= 6
    assert not (tmp_path / "c" / "torchtpu-signatures").exists()


def test_out_into_an_uninitialized_and_an_initialized_tensor(eager_mode):
    """``out=`` into ``torch.empty`` passes no array for it, ``out=`` into a written tensor
    passes its array: two input structures, which the signature must tell apart (a loaded
    or explicitly compiled executable refuses the other structure; ``jax.jit`` had traced
    it again silently).  Found by ``test_moe_grouped_mm_experts_path_matches_cpu`` and the
    DDP test in a fresh clone."""
    import torch

    import torchtpu

    torchtpu.reset_metrics()
    a = torch.arange(6.0).reshape(2, 3)
    for shape in ((2, 3), (3, 2)):
        x = a.reshape(shape)
        got = []
        for make in (torch.empty, torch.ones, torch.empty):
            out = make(shape, device="tpu")
            torch.mul(x.to("tpu"), 2.5, out=out)
            got.append(out.cpu())
        for g in got:
            assert torch.equal(g, x * 2.5)
    assert torchtpu.metrics()["signature_cache"]["structure_mismatches"] == 0


LINALG_PROGRAM = r"""
import json, torch, torchtpu
a = torch.tensor([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
t = a.to("tpu")
res = {"inv": torch.linalg.inv(t).cpu().tolist(),
       "solve": torch.linalg.solve(t, t[:, :1]).cpu().tolist(),
       "chol": torch.linalg.cholesky(t).cpu().tolist(),
       "det": torch.linalg.det(t).item()}
try:
    torch.linalg.inv(torch.zeros(2, 2, device="tpu"))
    res["err"] = None
except Exception as e:
    res["err"] = str(e)
res["sig"] = torchtpu.metrics()["signature_cache"]["hits"]
print(json.dumps(res))
"""


def test_linear_algebra_loaded_from_the_cache_in_a_fresh_process(tmp_path):
    # executables with LAPACK custom calls, loaded without being lowered: JAX fills in its
    # LAPACK function pointers only when it lowers such an op, so the second process
    # died of a segmentation fault in linalg.inv before executable_store linked them
    import torch

    env = {k: v for k, v in os.environ.items() if k != "TORCHTPU_SIGNATURE_CACHE"}
    env["TORCHTPU_CACHE_DIR"] = str(tmp_path / "c")
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", LINALG_PROGRAM], env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[1]["sig"] > 0  # the second process loaded executables from the cache
    a = torch.tensor([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
    with_cpu = {"inv": torch.linalg.inv(a), "solve": torch.linalg.solve(a, a[:, :1]),
                "chol": torch.linalg.cholesky(a)}
    try:
        torch.linalg.inv(torch.zeros(2, 2))
    except Exception as e:
        cpu_err = str(e)
    for r in runs:
        for k, v in with_cpu.items():
            torch.testing.assert_close(torch.tensor(r[k]), v)
        assert abs(r["det"] - torch.linalg.det(a).item()) < 1e-4
        assert r["err"] == cpu_err
