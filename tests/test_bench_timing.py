"""The benchmarks' timing rule (torchtpu.bench.timing) and the process-wide executable
counter it rests on (metrics()["xla"])."""

import pytest
import torch

import torchtpu
from torchtpu.bench import timing

pytestmark = pytest.mark.usefixtures("strict_mode")  # donating variants are STRICT's


def _inplace_step(n):
    # >= 64 KiB: a hot in-place signature donates; more than buckets.MAX_NUMEL elements:
    # never shape-bucketed, whatever ops earlier tests made churn through shapes
    x = torch.zeros(n, device="tpu")

    def step():
        x.add_(1.0)
        return x

    def sync(t):
        return float(t[0].item())

    return x, step, sync


def test_donating_variants_are_counted_as_executables(sync_first_calls):
    # the donating variant of a hot in-place signature is compiled lazily at its 5th
    # call; metrics()["compiles"] never saw it, so benchmarks timed its compile
    torchtpu.reset_metrics()
    x, step, sync = _inplace_step(1 << 17 | 7)
    for _ in range(8):
        step()
    assert sync(x) == 8.0
    by_kind = torchtpu.metrics()["xla"]["by_kind"]
    assert by_kind.get("op_donating") == 1, by_kind


def test_warm_up_runs_until_nothing_is_built():
    x, step, sync = _inplace_step(1 << 17 | 11)
    w = timing.warm_up(step, sync, min_steps=3, steps=4)
    assert w["settled"] and w["steps"] >= 5  # past the 5th call, when the variant builds
    assert w["values"][:3] == [1.0, 2.0, 3.0]
    r = timing.time_rounds(step, sync, rounds=3, steps=4)
    assert r["built_while_timing"] == 0
    assert r["last"] == w["steps"] + 12  # every step ran, values as on CPU
    assert r["ms_min"] <= r["ms_median"] <= r["ms_max"]


def test_a_fixed_three_step_warm_up_times_a_build():
    # what the old `--warmup 3` did: the donating variant was built inside the timing
    x, step, sync = _inplace_step(1 << 17 | 13)
    for _ in range(3):
        sync(step())
    r = timing.time_rounds(step, sync, rounds=2, steps=3)
    assert r["built_while_timing"] >= 1


def test_memory_probe_measures_where_memory_lives():
    with timing.memory_probe() as mem:
        y = torch.ones(1 << 20, device="tpu") * 2  # 4 MiB
        assert y[0].item() == 2.0
    res = mem.result
    assert res["where"] in ("host", "pjrt")
    assert res["tensor_bytes_peak"] >= 4 << 20
    assert res["jax_live_bytes"] >= 4 << 20
    if res["where"] == "host" and res["peak_bytes"] is not None:
        assert res["peak_bytes"] >= 0
    assert "load average" in timing.load_line()


def test_memory_probe_peak_is_never_negative_when_memory_is_freed_at_entry(monkeypatch):
    """The host peak is ``VmHWM`` minus ``VmRSS`` read *after* the high-water mark is
    reset: memory another thread frees between the two reads cannot make it negative (a
    suite run measured -24,576 bytes when ``VmRSS`` was read first)."""
    import io

    state = {"reset": False}
    rss = {False: 1000, True: 900}  # KiB: 100 KiB freed around the reset

    class _ClearRefs(io.StringIO):
        def close(self):
            state["reset"] = True
            super().close()

    monkeypatch.setattr(timing, "open", lambda *a, **k: _ClearRefs(), raising=False)
    monkeypatch.setattr(timing, "_proc_status_kib",
                        lambda key: rss[state["reset"]] if key == "VmRSS" else 900)
    monkeypatch.setattr(torch.tpu, "max_memory_allocated", lambda *a: 0)
    with timing.memory_probe() as mem:
        pass
    if mem.result["where"] != "host":
        pytest.skip("the device reports its own peak (PJRT memory_stats)")
    assert mem.result["peak_bytes"] == 0
