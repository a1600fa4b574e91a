"""Smoke test of ``python -m torchtpu.bench compile`` (not a timing test): each row runs
with tiny step counts, its output has the documented structure, and every column trains
the same model the same way: its losses (first and last step, same number of AdamW
steps from the same initial weights) agree with plain PyTorch on CPU; the greedy
``generate()`` ids of every tpu column equal CPU's."""

import json
import os

import _budget
import pytest
import torch

pytest.importorskip("transformers")

from torchtpu.bench import compile as bench  # noqa: E402

TPU_COLS = ("jax", "cpu", "strict", "defer_and_fuse", "compiled", "compiled_step")
# the CNN and Llama rows, Inductor and the two-process cold/warm row take minutes on a
# 2-core machine: `make test-full` (TORCHTPU_FULL_TESTS=1) runs them
full_only = _budget.full_only


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _check_train_row(r, name, cols, steps, warmup):
    assert r["row"] == name and r["steps"] == steps and r["warmup"] == warmup
    assert list(r["columns"]) == list(cols)
    cpu = r["columns"]["cpu"]
    for col, v in r["columns"].items():
        assert isinstance(v, dict), (col, v)
        assert v["ms_per_step"] > 0 and v["first_call_s"] > 0
        # same weights, same batch, same number of AdamW steps: the same losses as CPU
        assert v["loss_first"] == pytest.approx(cpu["loss_first"], rel=1e-5), col
        assert v["loss_last"] == pytest.approx(cpu["loss_last"], rel=1e-4), col
    assert cpu["loss_last"] < cpu["loss_first"]  # it trains
    assert set(r["ratio_to_jax"]) == set(cols) and r["ratio_to_jax"]["jax"] == 1.0
    c = r["columns"]["compiled"]
    assert set(c["compile_split_s"]) == {"tracing_seconds", "lowering_seconds", "xla_seconds"}
    assert c["compile_split_s"]["xla_seconds"] > 0 and c["graphs_compiled"] >= 3
    assert 0 < c["our_share_of_first_call"] <= 1
    assert c["recompiles_after_first_step"] == 0 and c["executables_after_first_step"] == 0
    assert c["timed_steps_after_first"] == c["steps_run"] - 1
    # forward+loss, loss seed, backward and update stitched: one XLA program per step
    assert c["programs_per_step"] == 1, c
    for col, v in r["columns"].items():  # warm: nothing was built while timing
        assert v["warmup_settled"] and v["built_while_timing"] == 0, (col, v)
    if "compiled_step" in r["columns"]:
        # the whole step compiled: no recompiles, and the flag it sets for Dynamo restored
        w = r["columns"]["compiled_step"]
        assert w["recompiles_after_first_step"] == 0 and w["executables_after_first_step"] == 0
        assert w["graph_calls_per_step"] >= 1 and w["programs_per_step"] == 1, w
        assert torch._dynamo.config.trace_autograd_ops is False


@pytest.mark.parametrize("name", ["small-mlp", pytest.param("cnn", marks=full_only),
                                  pytest.param("llama", marks=full_only)])
def test_train_row_columns_agree_with_cpu(name, no_stored_executables):
    # compiled, not loaded from the graph cache: the compile split is then all nonzero
    r = bench.train_row(name, steps=2, warmup=2, columns=TPU_COLS)
    _check_train_row(r, name, TPU_COLS, 2, 2)


@full_only
def test_train_row_inductor_column():
    cols = ("cpu", "inductor")
    r = bench.train_row("small-mlp", steps=1, warmup=1, columns=cols)
    v = r["columns"]["inductor"]
    if isinstance(v, str):  # Inductor cannot run here (e.g. no C++ compiler): says why
        assert v.startswith("n/a: ")
    else:
        assert v["loss_last"] == pytest.approx(r["columns"]["cpu"]["loss_last"], rel=1e-4)
    assert r["ratio_to_jax"] == {}  # no JAX column, no ratios


def test_train_row_inductor_without_a_compiler_is_na():
    import torch._inductor.config as cfg

    # cfg.patch, not monkeypatch: monkeypatch's undo deletes a config entry that was not
    # in the module's __dict__, and Inductor's config then lacks fx_graph_cache
    with cfg.patch({"cpp.cxx": ("no-such-c-compiler-for-the-test",), "fx_graph_cache": False}):
        r = bench.train_row("small-mlp", steps=1, warmup=1, columns=("inductor",))
    assert isinstance(r["columns"]["inductor"], str)
    assert r["columns"]["inductor"].startswith("n/a: ")


@full_only  # ~60 s; static-cache generation itself is tested in test_compile_generate.py
def test_generate_row_ids_equal_cpu_and_no_recompiles():
    r = bench.generate_row(new_tokens=3, prompt_len=8)
    assert r["row"] == "generate" and r["new_tokens"] == 3
    assert list(r["columns"]) == list(bench.GEN_COLUMNS)
    for col, v in r["columns"].items():
        assert v["new_tokens"] == 3 and v["tokens_per_s"] > 0, col
        assert v["ids_match_cpu"], col
    assert r["columns"]["strict"]["xla_compiles_timed_call"] == 0
    c = r["columns"]["compiled"]
    assert c["graphs_compiled"] == 1 and c["recompiles"] == 0
    assert c["executables_timed_call"] == 0 and c["graph_calls_timed_call"] == 2
    assert r["ratio_to_strict"]["strict"] == 1.0


@full_only
def test_coldwarm_row_second_process_hits_the_persistent_cache():
    r = bench.coldwarm_row("small-mlp")
    cold, warm = r["cold"], r["warm"]
    assert cold["cache_dir"] == warm["cache_dir"]
    assert cold["persistent_cache"]["misses"] > 0
    assert warm["persistent_cache"]["misses"] == 0
    # every executable the cold process compiled is loaded: by JAX's persistent cache or
    # (with its traced graph) by torchtpu's graph cache
    gc = warm["graph_cache"]
    assert warm["persistent_cache"]["hits"] + gc["executable_cache_hits"] >= \
        cold["persistent_cache"]["misses"]
    assert gc["graphs_compiled"] > 0 and gc["graph_cache_hits"] == gc["graphs_compiled"]
    assert cold["graph_cache"]["graph_cache_hits"] == 0
    assert r["warm_over_cold"] == warm["first_call_s"] / cold["first_call_s"]


@full_only
@pytest.mark.parametrize("precompile", [False, True])
def test_coldwarm_model_form_first_loss_matches_cpu(precompile):
    """coldwarm-model / coldwarm-precompile: the cold and the warm process (graphs loaded
    from the caches, and with precompile Dynamo's bytecode too) compute CPU's first
    loss."""
    r = bench.coldwarm_row("small-mlp", form="model", precompile=precompile)
    base, batch, loss = bench.TRAIN_ROWS["small-mlp"][0]()
    cpu = bench._tsync(bench.torch_step(base, batch, loss)())
    for k in ("cold", "warm"):
        assert r[k]["form"] == "model"
        assert r[k]["loss"] == pytest.approx(cpu, rel=1e-5), k
    assert r["warm"]["graph_cache"]["graph_cache_hits"] > 0


def test_main_writes_json_and_table(tmp_path, capsys):
    path = tmp_path / "out.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--rows", "small-mlp", "--columns", "jax,compiled", "--steps", "1",
                           "--warmup", "1", "--cache-dir", "default", "--json", str(path)]) == 0
    finally:
        torch.set_num_threads(threads)
    out = json.loads(path.read_text())
    assert set(out) == {"machine", "rows"} and list(out["rows"]) == ["small-mlp"]
    # every column gets the same thread budget: torch uses every usable core, as XLA does
    assert out["machine"]["torch_threads"] == len(os.sched_getaffinity(0))
    assert list(out["rows"]["small-mlp"]["columns"]) == ["jax", "compiled"]
    table = capsys.readouterr().out
    assert "| small-mlp | " in table and "compiled ms (x JAX)" in table
    assert "load average" in table and "donated buffers" in table


def test_unknown_row_is_refused():
    with pytest.raises(SystemExit):
        bench.main(["--rows", "resnet"])


def test_jax_baseline_donates_its_state():
    # a JAX step without donate_argnums copies every parameter and optimizer buffer,
    # which handicapped the baseline that every ratio is measured against
    base, batch, _ = bench.TRAIN_ROWS["small-mlp"][0]()
    run = bench.jax_step(base, batch, bench.JAX_LOSSES["small-mlp"](base))
    run()
    before = run.state[0]
    leaves = [a for part in before[:3] for a in part.values()]
    run()
    assert all(a.is_deleted() for a in leaves)
