"""Eager modes: the API, DEBUG's checks, DeferAndFuse's caching and sync reporting."""

import json
import os
import subprocess
import sys

import _budget
import pytest
import torch

import torchtpu

# eager_mode tests run in DEFER_AND_FUSE too in the default run (tests/conftest.py)
DEFER_BY_DEFAULT = True

TPU = "tpu"
EM = torch.tpu.EagerMode


def test_default_mode_is_strict():
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.tpu.eager_mode.value)"],
        capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if k != "TORCHTPU_EAGER_MODE"},
    ).stdout.strip()
    assert out == "strict"


def test_mode_api_and_restore_on_exception():
    start = torch.tpu.eager_mode  # STRICT unless TORCHTPU_EAGER_MODE says otherwise
    try:
        torch.tpu.eager_mode = EM.STRICT
        with torch.tpu.set_eager_mode(EM.DEBUG):
            assert torch.tpu.eager_mode is EM.DEBUG
        assert torch.tpu.eager_mode is EM.STRICT
        with pytest.raises(ValueError):
            with torch.tpu.set_eager_mode(EM.DEFER_AND_FUSE):
                assert torch.tpu.eager_mode is EM.DEFER_AND_FUSE
                raise ValueError("boom")
        assert torch.tpu.eager_mode is EM.STRICT
        torch.tpu.eager_mode = EM.DEBUG
        assert torch.tpu.eager_mode is EM.DEBUG
        torch.tpu.eager_mode = "strict"
        assert torch.tpu.eager_mode is EM.STRICT
    finally:
        torch.tpu.eager_mode = start


def test_set_eager_mode_without_with_switches_now():
    start = torch.tpu.eager_mode
    try:
        torch.tpu.set_eager_mode(EM.DEBUG)  # like torch.set_grad_enabled(False)
        assert torch.tpu.eager_mode is EM.DEBUG
    finally:
        torch.tpu.eager_mode = start


def test_mode_from_environment():
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.tpu.eager_mode.value)"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "TORCHTPU_EAGER_MODE": "defer_and_fuse"},
    ).stdout.strip()
    assert out == "defer_and_fuse"


# A user's program: it never reads torch.tpu.eager_mode, so only the environment variable
# can have selected the mode.  It prints the counters and the values (checked against CPU).
_USER_PROGRAM = """
import json, torch, torchtpu
def run(dev):
    torch.manual_seed(0)
    a = torch.randn(32, 32).to(dev)
    for _ in range(6):
        a = torch.tanh(a @ a * 0.1 + 1)
    return a.cpu()
tpu, cpu = run("tpu"), run("cpu")
m = torchtpu.metrics()
print(json.dumps({"segments_run": m["segments_run"], "segment_ops": m["segment_ops"],
                  "debug_waits": m["debug_waits"],
                  "max_diff": (tpu - cpu).abs().max().item()}))
"""


def _run_user_program(mode_value):
    env = {k: v for k, v in os.environ.items() if k != "TORCHTPU_EAGER_MODE"}
    if mode_value is not None:
        env["TORCHTPU_EAGER_MODE"] = mode_value
    return subprocess.run([sys.executable, "-c", _USER_PROGRAM], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize("value,mode", [
    ("defer_and_fuse", "defer_and_fuse"), ("DEFER_AND_FUSE", "defer_and_fuse"),
    ("defer", "defer_and_fuse"), ("Defer-And-Fuse", "defer_and_fuse"), ("debug", "debug"),
    (" Strict ", "strict"), ("", "strict"), (None, "strict"),
])
def test_environment_spellings_name_the_mode(value, mode, monkeypatch):
    # (what the start-up reads; the processes below check that it is applied)
    from torchtpu.eager import modes

    if value is None:
        monkeypatch.delenv(modes.ENV, raising=False)
    else:
        monkeypatch.setenv(modes.ENV, value)
    assert modes.from_environment().value == mode


# one process per mode (a process costs ~8 s of CI time; the spellings are checked above):
# the default run starts one (a spelling that is not the default); all three with
# TORCHTPU_FULL_TESTS=1
@pytest.mark.parametrize("value,expect", _budget.every([
    ("Defer-And-Fuse", "defer"), ("debug", "debug"), (None, "strict"),
], 3))
def test_environment_alone_selects_the_mode(value, expect):
    # Before the fix the variable was applied only when the program read the mode:
    # DEFER_AND_FUSE ran 0 segments and DEBUG waited for no op.
    p = _run_user_program(value)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["max_diff"] < 1e-5
    if expect == "defer":
        assert out["segments_run"] >= 1 and out["segment_ops"] >= 18, out
        assert out["debug_waits"] == 0, out
    elif expect == "debug":
        assert out["segments_run"] == 0 and out["debug_waits"] >= 18, out
    else:
        assert out["segments_run"] == 0 and out["debug_waits"] == 0, out


@pytest.mark.parametrize("autoload", [True, False])
def test_invalid_environment_value_raises_at_load(autoload):
    # `import torch` autoloads torchtpu; with autoload off, `import torchtpu` registers.
    env = {**os.environ, "TORCHTPU_EAGER_MODE": "bogus",
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "1" if autoload else "0"}
    p = subprocess.run([sys.executable, "-c", "import torch; import torchtpu"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode != 0
    assert "TORCHTPU_EAGER_MODE='bogus' is not an eager mode" in p.stderr
    for spelling in ("strict", "debug", "defer_and_fuse", "defer"):
        assert spelling in p.stderr.split("is not an eager mode")[1]


def test_mode_names_accepted_by_the_api():
    start = torch.tpu.eager_mode
    try:
        for name, mode in [("defer", EM.DEFER_AND_FUSE), ("DEBUG", EM.DEBUG),
                           ("defer-and-fuse", EM.DEFER_AND_FUSE), ("Strict", EM.STRICT)]:
            torch.tpu.eager_mode = name
            assert torch.tpu.eager_mode is mode
        with pytest.raises(ValueError, match="not an eager mode"):
            torch.tpu.eager_mode = "fast"
    finally:
        torch.tpu.eager_mode = start


def test_mode_change_runs_pending_segment():
    x = torch.ones(4, device=TPU)
    with torch.tpu.set_eager_mode(EM.STRICT):
        with torch.tpu.set_eager_mode(EM.DEFER_AND_FUSE):
            y = x * 3
            from torchtpu.eager import defer

            assert defer.pending_ops() >= 1
        assert defer.pending_ops() == 0
        assert y.sum().item() == 12.0


def test_debug_nans_raises_at_first_bad_op():
    x = torch.tensor([1.0, 0.0], device=TPU)
    with torch.tpu.set_eager_mode(EM.DEBUG):
        torch.tpu.debug_nans = True
        try:
            y = x + 1  # fine
            with pytest.raises(RuntimeError, match=r"aten\.div.*NaN or Inf"):
                x / x[1]
        finally:
            torch.tpu.debug_nans = False
    assert torch.equal(y.cpu(), torch.tensor([2.0, 1.0]))


def test_defer_matches_strict_values():
    torch.manual_seed(0)
    a = torch.randn(8, 8)
    res = {}
    for mode in ("strict", "defer_and_fuse"):
        with torch.tpu.set_eager_mode(mode):
            x = a.to(TPU)
            y = torch.tanh(x @ x.t()) * 2 - x.mean(0, keepdim=True)
            y[:, 0] = 5.0
            res[mode] = y.cpu()
    c = torch.tanh(a @ a.t()) * 2 - a.mean(0, keepdim=True)
    c[:, 0] = 5.0
    torch.testing.assert_close(res["defer_and_fuse"], c)
    # fusion may reorder float arithmetic (seen on GPU): close, not bitwise equal
    torch.testing.assert_close(res["defer_and_fuse"], res["strict"])


def test_training_loop_compiles_nothing_after_second_step_and_reports_item():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1)).to(TPU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8, device=TPU), torch.randn(32, 1, device=TPU)
    compiles = []
    from torchtpu.eager import defer

    # as in a fresh process: a model of the same ops trained earlier in this process (by
    # another test) would make this one's first steps replay as a shape variant
    defer.forget_families()
    with torch.tpu.set_eager_mode(EM.DEFER_AND_FUSE):
        torchtpu.reset_metrics()
        for _ in range(20):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            loss.item()  # the sync we expect to see reported
            compiles.append(torchtpu.metrics()["compiles"])
    m = torchtpu.metrics()
    assert compiles[-1] == compiles[1], compiles  # no new segment after step 2
    # the same cut points every step (forward | backward | optimizer, see eager.autograd),
    # and from the third step on every segment is a cache hit
    per_step = m["segments_run"] // 20
    assert m["segments_run"] == 20 * per_step and per_step >= 1
    assert m["segment_cache_hits"] >= 18 * per_step
    assert m["segment_cuts"].get("backward", 0) == 20
    rows = torchtpu.explain_syncs()
    assert rows[0]["cause"] == "item" and rows[0]["count"] == 20
    assert rows[0]["line"].endswith(f"{__file__}:{_line_of('loss.item()  # the sync')}")


def _line_of(text):
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if text in line and "_line_of" not in line:
                return i
    raise AssertionError(text)


def test_defer_data_dependent_shape_is_a_sync():
    with torch.tpu.set_eager_mode(EM.DEFER_AND_FUSE):
        torchtpu.reset_metrics()
        x = torch.arange(10.0, device=TPU) - 4
        nz = x[x > 0]
        assert nz.shape == (5,)
        assert torch.equal(nz.cpu(), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert any("nonzero" in c or "materialize" in c or "data_dependent" in c
               for c in torchtpu.metrics()["host_syncs"])


def test_defer_gives_dead_intermediates_no_tensor_storage():
    # What this measures: bytes of live tpu tensor storages (torch.tpu.max_memory_allocated),
    # not device memory: a fused segment's dead intermediates never get a storage buffer.
    # Device memory is measured by `python -m torchtpu.bench eager` (peak RSS / PJRT).
    peaks = {}
    for mode in ("strict", "defer_and_fuse"):
        x = torch.randn(256, 256, device=TPU)
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        base = torch.tpu.memory_allocated()
        with torch.tpu.set_eager_mode(mode):
            y = ((x * 2 + 1).exp() * x).sum()
            y.item()
        peaks[mode] = torch.tpu.max_memory_allocated() - base
        del x, y
    assert peaks["defer_and_fuse"] < peaks["strict"]


def test_rng_streams_same_in_every_mode():
    draws = {}
    for mode in ("strict", "debug", "defer_and_fuse"):
        with torch.tpu.set_eager_mode(mode):
            torch.manual_seed(42)
            a = torch.randn(16, device=TPU)
            b = torch.nn.functional.dropout(torch.ones(32, device=TPU), 0.5)
            draws[mode] = (a.cpu(), b.cpu())
    for mode in ("debug", "defer_and_fuse"):
        assert torch.equal(draws[mode][0], draws["strict"][0])
        assert torch.equal(draws[mode][1], draws["strict"][1])


def test_debug_log_ops(capfd):
    from torchtpu.eager.modes import CONFIG

    with torch.tpu.set_eager_mode(EM.DEBUG):
        CONFIG.log_ops = True
        try:
            torch.ones(3, device=TPU).exp()
        finally:
            CONFIG.log_ops = False
    err = capfd.readouterr().err
    assert "aten.exp" in err and "[3]" in err


def test_sync_site_skips_generated_code_frames():
    # a sync reached through exec-made code (a dataclass method, a wrapper a library
    # installed) is reported at the user's line that called it, not "<string>:N"
    ns = {}
    exec("def read(t):\n    return t.item()\n", ns)
    t = torch.ones(1, device=TPU)
    torchtpu.reset_metrics()
    ns["read"](t)  # the generated frame's caller
    rows = torchtpu.explain_syncs()
    assert rows[0]["line"].endswith(f"{__file__}:{_line_of('the generated frame')}"), rows


def test_sync_site_of_a_user_script_in_a_folder_named_torchtpu(tmp_path):
    # a checkout named "torchtpu" holds the user's own code: its lines are user lines
    import subprocess
    import sys

    d = tmp_path / "torchtpu"
    d.mkdir()
    script = d / "user.py"
    script.write_text("import torch, torchtpu\nt = torch.ones(1, device='tpu')\n"
                      "torchtpu.reset_metrics()\nt.item()\n"
                      "print(torchtpu.explain_syncs()[0]['line'])\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == f"{script}:4"


def _decode_like(dev, steps, grow=True):
    """A decoding-like loop: attention of one query over a cache that grows by a row
    each step (``grow``) or stays put, with a host read per step, as generate() does."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 16, generator=g).to(dev)
    cache = torch.randn(8, 16, generator=g).to(dev)
    outs = []
    for _ in range(steps):
        row = torch.tanh(q * 0.5 + cache[-1:])
        cache = torch.cat([cache, row], 0) if grow else torch.cat([cache[1:], row], 0)
        w = torch.softmax(q @ cache.T / 4.0, -1)
        q = w @ cache
        outs.append(q.sum().item())
    return outs


@pytest.mark.parametrize("grow", [True, False])
def test_defer_replays_a_churning_family_instead_of_compiling_each_step(grow):
    # A segment family whose shapes change every step (a growing KV cache) runs its ops
    # through the per-op executables from its second shape on, instead of compiling one
    # fused program per step (MoE generate() was 10x slower than STRICT); a loop with
    # fixed shapes keeps fusing and hits the segment cache.
    want = _decode_like("cpu", 12, grow)
    with torch.tpu.set_eager_mode(EM.DEFER_AND_FUSE):
        torchtpu.reset_metrics()
        got = _decode_like(TPU, 12, grow)
        m = torchtpu.metrics()
        torchtpu.reset_metrics()
        again = _decode_like(TPU, 12, grow)
        m2 = torchtpu.metrics()
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want))
    assert again == got
    adapt = m["defer_adaptive"]
    if grow:
        assert adapt["segments_replayed"] >= 10, adapt
        assert m["segment_cache_misses"] - adapt["segments_replayed"] <= 2, m
        # the second run: every per-op executable and fused segment exists already
        assert m2["compiles"] == 0 and m2["cache_misses"] == 0, m2
    else:
        # the first steps differ (the cache starts as an input, then is a step's result):
        # at most those replay before the repeating step compiles and then hits
        assert adapt["segments_replayed"] <= 2, adapt
        assert m["segment_cache_hits"] >= 8, m
        assert m2["segment_cache_hits"] >= 11 and m2["compiles"] <= 1, m2


def test_defer_compiles_a_churning_family_once_its_shapes_repeat():
    # after a churning start, a loop that runs the same shapes step after step fuses again
    with torch.tpu.set_eager_mode(EM.DEFER_AND_FUSE):
        _decode_like(TPU, 4, grow=True)
        torchtpu.reset_metrics()
        got = _decode_like(TPU, 10, grow=False)
        m = torchtpu.metrics()
    torch.testing.assert_close(torch.tensor(got), torch.tensor(_decode_like("cpu", 10, False)))
    assert m["segment_cache_hits"] >= 6, m


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_threads_recording_at_once_get_their_own_values(mode):
    """Several Python threads running ops at once: each gets the values CPU gives.  In
    DEFER_AND_FUSE a thread that meets another thread's pending segment runs it; before
    recording was serialized, a thread could append to a segment another thread had just
    run ("stale deferred value", or None read as a number)."""
    import threading

    errors = []

    def work(i):
        try:
            for _ in range(15):
                y = torch.full((4, 4), float(i), device="tpu")
                got = (y * 2 + i).sum().item()
                if got != 48 * i:
                    errors.append(f"thread {i}: {got} != {48 * i}")
        except Exception as e:  # noqa: BLE001 - reported below with its type
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    with torch.tpu.set_eager_mode(mode):
        for _ in range(2):
            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    assert errors == []


def test_defer_loop_without_sync_runs_bounded_segments(monkeypatch):
    """A DEFER_AND_FUSE loop that never syncs nor cuts runs a segment every
    ``SEGMENT_LIMIT`` ops (a bounded XLA compile; the limit was 20,000 ops, a 10-minute,
    20 GB compile for training steps), counted under ``segment_cuts["segment_limit"]``,
    with CPU's values."""
    from torchtpu.eager import defer

    monkeypatch.setattr(defer, "SEGMENT_LIMIT", 40)
    xc = torch.linspace(-1, 1, 16)
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        xt = xc.to("tpu")
        m0 = torchtpu.metrics()["segment_cuts"].get("segment_limit", 0)
        for _ in range(50):  # 100 ops
            xc = torch.tanh(xc * 1.5) + 0.1
            xt = torch.tanh(xt * 1.5) + 0.1
            assert defer.pending_ops() < 40
        cuts = torchtpu.metrics()["segment_cuts"].get("segment_limit", 0) - m0
        torch.testing.assert_close(xt.cpu(), xc)
    assert cuts >= 2
