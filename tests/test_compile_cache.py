"""torch.compile(backend="tpu") in a second process: the traced graphs come from the
on-disk graph cache (torchtpu.compile.graph_cache) and give CPU's results."""

import json
import os
import subprocess
import sys
import textwrap

import _budget
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import torchtpu

    def run(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.BatchNorm1d(16),
                                    torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
        x = torch.randn(6, 8).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)

        def loss_fn(x):
            # a constant tensor in the graph (a get_attr of a tpu tensor in the forward)
            offset = torch.tensor(0.5, device=x.device)
            return (model(x) - 1.0).pow(2).mean() + offset

        if device == "tpu":
            loss_fn = torch.compile(loss_fn, backend="tpu")
            step = torch.compile(opt.step, backend="tpu")
        else:
            step = opt.step
        losses = []
        for _ in range(3):
            loss = loss_fn(x)
            loss.backward()
            step()
            opt.zero_grad()
            losses.append(float(loss.detach().cpu()))
        state = {k: v.detach().cpu().tolist() for k, v in model.state_dict().items()}
        return losses, state

    tpu = run("tpu")
    cpu = run("cpu")
    m = torchtpu.metrics()
    print(json.dumps({"tpu": tpu, "cpu": cpu, "compile": m["compile"],
                      "persistent": m["persistent_cache"], "segments": m["segments_run"]}))
""")


def _child(cache_dir, stitch=True):
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(cache_dir),
               TORCHTPU_STITCH_GRAPHS="1" if stitch else "0")
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _assert_close(a, b):
    import torch

    torch.testing.assert_close(torch.tensor(a, dtype=torch.float64),
                               torch.tensor(b, dtype=torch.float64), rtol=1e-5, atol=1e-5)


# (the launched form, a second 16 s process pair, in the full run: CI's time budget)
@pytest.mark.parametrize("stitch", [True, pytest.param(False, marks=_budget.full_only)],
                         ids=["stitched", "launched"])
def test_second_process_loads_traced_graphs_and_matches_cpu(tmp_path, stitch):
    first = _child(tmp_path, stitch)
    second = _child(tmp_path, stitch)
    for r in (first, second):
        _assert_close(r["tpu"][0], r["cpu"][0])  # losses of the 3 steps
        assert r["tpu"][1].keys() == r["cpu"][1].keys()
        for k in r["cpu"][1]:  # weights and BatchNorm running stats after 3 steps
            _assert_close(r["tpu"][1][k], r["cpu"][1][k])
    # forward, backward and the optimizer update: traced in the first process, loaded
    # in the second
    assert first["compile"]["graphs_compiled"] >= 3
    assert first["compile"]["graph_cache_hits"] == 0
    assert second["compile"]["graph_cache_hits"] == first["compile"]["graphs_compiled"]
    assert second["compile"]["recompiles"] == first["compile"]["recompiles"]
    assert second["compile"]["executables"] == first["compile"]["executables"]
    if stitch:
        # each step's one program (the graphs stitched): compiled through JAX, so the
        # second process loads it from JAX's persistent cache (after a JAX trace)
        assert first["segments"] == second["segments"] >= 3
        assert second["persistent"]["hits"] >= second["compile"]["executables"] >= 1
        assert second["compile"]["executable_cache_hits"] == 0
    else:
        # each graph's executable is loaded too (no JAX trace, no XLA compile)
        assert first["compile"]["executable_cache_hits"] == 0
        assert second["compile"]["executable_cache_hits"] == first["compile"]["executables"]


@_budget.full_only  # (tests/test_persistent_cache.py tests the off switch in one process; CI's budget)
def test_graph_cache_off_with_persistent_cache_off():
    # TORCHTPU_CACHE_DIR=off: nothing loaded, every graph traced (one process: with
    # nothing stored, a second one has nothing it could load)
    second = _child("off")
    assert second["compile"]["graph_cache_hits"] == 0
    assert second["compile"]["executable_cache_hits"] == 0
    assert second["compile"]["graphs_compiled"] >= 3
    _assert_close(second["tpu"][0], second["cpu"][0])


def test_executables_loaded_from_jax_cache_are_not_stored_again(tmp_path):
    # a process whose executables came from JAX's persistent cache (here: the graph
    # cache's executables deleted, JAX's entries kept) must not store them (XLA:CPU
    # cannot serialize a deserialized executable again: the next process failed with
    # "Function wrapped_add not found")
    import glob
    import shutil

    _child(tmp_path)
    for d in glob.glob(os.path.join(str(tmp_path), "torchtpu-graphs", "*", "executables")):
        shutil.rmtree(d)
    _child(tmp_path)
    third = _child(tmp_path)
    _assert_close(third["tpu"][0], third["cpu"][0])
    for k in third["cpu"][1]:
        _assert_close(third["tpu"][1][k], third["cpu"][1][k])


def test_backward_that_cannot_be_lowered_raises_at_backward_not_forward(monkeypatch):
    # the graph cache compiles the backward together with the forward: an op the backward
    # cannot lower must still raise at the first backward (as AOTAutograd's lazy backward
    # compile does), so a forward-only use of a compiled function keeps working
    import torch

    import torchtpu  # noqa: F401
    from torchtpu.compile import graph as graph_mod

    real = graph_mod.check_graph

    def check(gm):
        for n in gm.graph.nodes:
            if "threshold_backward" in str(n.target) or "le.Scalar" in str(n.target):
                raise NotImplementedError(f"torchtpu: test: no lowering for {n.target}")
        real(gm)

    monkeypatch.setattr(graph_mod, "check_graph", check)
    torch._dynamo.reset()
    try:
        x = torch.randn(6)
        xt = x.to("tpu").requires_grad_(True)
        f = torch.compile(lambda a: torch.relu(a).sum(), backend="tpu")
        y = f(xt)  # the forward runs
        torch.testing.assert_close(y.detach().cpu(), torch.relu(x).sum())
        with pytest.raises(NotImplementedError, match="test: no lowering"):
            y.backward()
    finally:
        torch._dynamo.reset()
