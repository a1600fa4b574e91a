"""Asynchronous first calls (``torchtpu.eager.async_compile``): in STRICT mode a new
signature's XLA compile and first run happen on a worker thread while the program goes on.
Values must be CPU PyTorch's whatever the timing; these tests make the compile slow on
purpose (a patched ``Lowered.compile``) so that the pending states are really met."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

import _budget
import pytest
import torch

import torchtpu
from torchtpu._tensor import storage
from torchtpu.eager import async_compile, executables

pytestmark = pytest.mark.usefixtures("strict_mode")

jax = pytest.importorskip("jax")


@pytest.fixture
def workers(monkeypatch, fresh_shape_buckets):
    """Two workers, an empty per-op executable cache and no signature cache (every
    signature is new and compiled here); no op is churning yet, so nothing runs through
    the shape buckets (which wait for their inputs: tests/test_shape_buckets.py)."""
    monkeypatch.setattr(executables._sigcache, "entry", lambda key, index: None)
    prev = async_compile.workers()
    async_compile.set_workers(2)
    executables.clear_cache()
    yield
    async_compile.settle_all()
    async_compile.set_workers(prev)
    executables.clear_cache()  # (no executable of a failed compile outlives the test)


@pytest.fixture
def slow_compile(monkeypatch, workers):
    """Every XLA compile of a first call takes at least 0.15 s longer, and the test can
    hold all compiles until it releases ``gate``: pending values are then surely met."""
    gate = threading.Event()
    gate.set()
    real = jax.stages.Lowered.compile

    def compile_(self, *a, **k):
        if threading.current_thread().name.startswith("torchtpu-compile"):
            time.sleep(0.15)
            assert gate.wait(30), "test gate never opened"
        return real(self, *a, **k)

    monkeypatch.setattr(jax.stages.Lowered, "compile", compile_)
    yield gate
    gate.set()


def _pending(t) -> bool:
    a = storage.data(t).arr
    return a.__class__ is storage.Lazy and a.node is storage.ASYNC and a.value is None


def test_chain_of_new_signatures_is_pending_then_equals_cpu(slow_compile):
    x = torch.randn(37, 19)
    w = torch.randn(19, 23)
    t, tw = x.to("tpu"), w.to("tpu")
    m0 = torchtpu.metrics()
    slow_compile.clear()  # hold every compile: the whole chain is dispatched first
    y = torch.relu(t @ tw)
    z = (y * 3 - 1).softmax(-1)
    s = z.sum(0)
    assert _pending(y) and _pending(z) and _pending(s)
    m1 = torchtpu.metrics()
    assert m1["async_compile"]["waits"] == m0["async_compile"]["waits"]  # nothing waited
    assert m1["async_compile"]["jobs"] - m0["async_compile"]["jobs"] >= 5
    assert m1["host_syncs_total"] == m0["host_syncs_total"]
    slow_compile.set()
    ref_y = torch.relu(x @ w)
    ref_z = (ref_y * 3 - 1).softmax(-1)
    torch.testing.assert_close(s.cpu(), ref_z.sum(0))
    torch.testing.assert_close(y.cpu(), ref_y)
    assert torchtpu.metrics()["async_compile"]["waits"] > m1["async_compile"]["waits"]


def test_in_place_writes_and_views_of_pending_storages(slow_compile):
    x = torch.randn(6, 5)
    t = x.to("tpu")
    slow_compile.clear()
    t.mul_(2)
    v = t[1:4, ::2]  # a view of a pending storage
    v.add_(1)
    u = t.t() @ t
    r = v.exp()
    assert _pending(t)
    slow_compile.set()
    ref = x * 2
    ref[1:4, ::2] += 1
    torch.testing.assert_close(t.cpu(), ref)
    torch.testing.assert_close(u.cpu(), ref.t() @ ref)
    torch.testing.assert_close(r.cpu(), ref[1:4, ::2].exp())


def test_calls_of_a_signature_still_compiling_wait_for_it(slow_compile):
    xs = [torch.randn(11, 7) for _ in range(3)]
    ts = [x.to("tpu") for x in xs]
    slow_compile.clear()
    threading.Timer(0.3, slow_compile.set).start()
    outs = [t.sin() * 2 for t in ts]  # (the default: a second call waits)
    assert torchtpu.metrics()["async_compile"]["waits"] >= 1
    for o, x in zip(outs, xs):
        torch.testing.assert_close(o.cpu(), x.sin() * 2)


def test_calls_of_a_signature_still_compiling_queue_behind_it(slow_compile, monkeypatch):
    monkeypatch.setattr(async_compile, "QUEUE_LIMIT", 64)  # (TORCHTPU_ASYNC_QUEUE_LIMIT)
    xs = [torch.randn(11, 7) for _ in range(4)]
    ts = [x.to("tpu") for x in xs]
    slow_compile.clear()
    outs = [t.sin() * 2 for t in ts]  # one new signature (sin, mul), called four times
    m = torchtpu.metrics()["async_compile"]
    assert m["queued_runs"] >= 3
    slow_compile.set()
    for o, x in zip(outs, xs):
        torch.testing.assert_close(o.cpu(), x.sin() * 2)


def _held_result(slow_compile, op):
    """``op()``'s result with every compile held (released after 10 s at the latest: were
    the op to wait for a held compile, the test fails at its assert instead of hanging),
    and a description of what waited meanwhile (thread name, stack, counters that moved):
    (result, pending, why)."""
    import traceback

    seen = []

    def recording(real):
        def wrapper(*args):
            seen.append((threading.current_thread().name,
                         "".join(traceback.format_stack(limit=20))))
            return real(*args)
        return wrapper

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(async_compile._Job, "wait", recording(async_compile._Job.wait))
        mp.setattr(storage, "_SETTLE_ALL", recording(storage._SETTLE_ALL))
        slow_compile.clear()
        net = threading.Timer(10.0, slow_compile.set)
        net.start()
        m0 = torchtpu.metrics()
        y = op()
        pending = _pending(y)
        m1 = torchtpu.metrics()
        slow_compile.set()
        net.cancel()
    moved = {f"{group}.{k}": (m0[group].get(k), v) for group in ("async_compile", "shape_buckets")
             for k, v in m1[group].items() if m0[group].get(k) != v}
    why = f"counters moved: {moved}; waits: " + "\n".join(f"[{n}]\n{st}" for n, st in seen)
    return y, pending, why


def test_memory_allocated_counts_pending_results(slow_compile):
    # no garbage collection from the base count to the last one: a collection would free
    # earlier tests' storages held in reference cycles (a full-suite run once counted 536
    # bytes less than these tensors)
    gc.collect()
    gc.disable()
    try:
        _memory_allocated_counts_pending_results(slow_compile)
    finally:
        gc.enable()


def _memory_allocated_counts_pending_results(slow_compile):
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    t = torch.ones(64, 32, device="tpu")
    torch.tpu.synchronize()  # (t concrete before the gate closes: nothing waits on it)
    # a new signature: a pending result.  (In full-suite runs it once was not: ``t`` was
    # a padded fill, as earlier tests' token ids had length 64, and the padded rule's
    # mask waited for the held compile; the ``workers`` fixture now forgets those
    # lengths.  ``why`` names who waited, with stacks.)
    y, pending, why = _held_result(slow_compile, lambda: t.cos())
    assert pending, why
    peak_before = torch.tpu.max_memory_allocated()  # (waits for the jobs first)
    counted = torch.tpu.memory_allocated() - base
    assert counted == t.nbytes + y.nbytes
    assert peak_before >= base + t.nbytes + y.nbytes
    del y
    assert torch.tpu.memory_allocated() - base == t.nbytes


def test_synchronize_and_mode_switches_wait_for_pending_values(slow_compile):
    x = torch.randn(9, 9)
    t = x.to("tpu")
    slow_compile.clear()
    y = t.tanh()
    threading.Timer(0.3, slow_compile.set).start()
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        assert not _pending(y)  # the switch waited
        z = y * 2 + 1
        torch.testing.assert_close(z.cpu(), x.tanh() * 2 + 1)
    slow_compile.clear()
    w = t.cosh()
    threading.Timer(0.3, slow_compile.set).start()
    torch.tpu.synchronize()
    assert not async_compile.pending()
    torch.testing.assert_close(w.cpu(), x.cosh())


def test_a_failed_compile_is_raised_where_its_value_is_read(monkeypatch, workers):
    real = jax.stages.Lowered.compile

    def failing(self, *a, **k):  # atan's program fails to compile on a worker
        if threading.current_thread().name.startswith("torchtpu-compile") \
                and "atan" in self.as_text():
            raise ValueError("injected compile failure")
        return real(self, *a, **k)

    monkeypatch.setattr(jax.stages.Lowered, "compile", failing)
    t = torch.randn(5, 3).to("tpu")  # (a transfer: no compile)
    y = t.atan()
    z = y + 1  # reads the failed value: queued behind it, or compiled on a worker too
    monkeypatch.setattr(jax.stages.Lowered, "compile", real)
    with pytest.raises(RuntimeError, match="atan.*injected compile failure"):
        y.cpu()
    with pytest.raises(RuntimeError, match="atan.default: its asynchronous compile or run "
                                           "failed: ValueError: injected"):
        z.cpu()  # (named by the op that failed, not wrapped once more)
    torch.tpu.synchronize()  # does not hang; the error was raised where it was read
    assert torchtpu.metrics()["async_compile"]["errors"] >= 1
    # a failure is not remembered: the signature compiles again at its next call
    x = t.cpu()
    torch.testing.assert_close(t.atan().cpu(), x.atan())
    torch.testing.assert_close((t.atan() + 1).cpu(), x.atan() + 1)


def test_set_workers_from_another_thread_while_dispatching(workers):
    stop = threading.Event()
    errors = []

    def flip():
        while not stop.is_set():
            try:
                async_compile.set_workers(2)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

    th = threading.Thread(target=flip)
    th.start()
    try:
        x = torch.randn(120)
        tx = x.to("tpu")
        for k in range(1, 60):
            torch.testing.assert_close(tx[:k].exp().cpu(), x[:k].exp())
    finally:
        stop.set()
        th.join()
    assert errors == []
    torch.tpu.synchronize()
    assert not async_compile.compiling()


def test_lowering_errors_are_still_raised_at_the_op(workers):
    # PyTorch's own checks and the lowering's run on the calling thread
    a = torch.randn(3, 4, device="tpu")
    b = torch.randn(5, 6, device="tpu")
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(a, b)


def test_the_hot_path_takes_over_once_compiles_end(workers):
    from torchtpu.eager import hotpath

    x, y = torch.randn(8, 8), torch.randn(8, 8)
    tx, ty = x.to("tpu"), y.to("tpu")
    for _ in range(3):
        tx = tx * 0.5 + ty
        x = x * 0.5 + y
    torch.tpu.synchronize()  # the compiles are done
    h0 = torchtpu.metrics()["hot_path_calls"]
    for _ in range(5):
        tx = tx * 0.5 + ty
        x = x * 0.5 + y
    torch.testing.assert_close(tx.cpu(), x)
    if hotpath.ENABLED[0]:
        assert torchtpu.metrics()["hot_path_calls"] - h0 >= 8


@pytest.mark.parametrize("queue_limit", [0, 64])
def test_training_steps_equal_cpu_while_compiles_are_slow(slow_compile, monkeypatch,
                                                          queue_limit):
    monkeypatch.setattr(async_compile, "QUEUE_LIMIT", queue_limit)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    dev = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    dev.load_state_dict(model.state_dict())
    dev.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dopt = torch.optim.AdamW(dev.parameters(), lr=1e-2)
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    dx, dy = x.to("tpu"), y.to("tpu")
    for _ in range(3):
        for m, o, xx, yy in ((model, opt, x, y), (dev, dopt, dx, dy)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(xx), yy).backward()
            o.step()
    for p, q in zip(model.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), atol=1e-5, rtol=1e-5)


def test_donation_never_takes_an_array_a_pending_job_reads(monkeypatch, slow_compile):
    # a hot in-place signature donates its storage's old array; a job still waiting to
    # read that array must keep it (its values would be garbage, or the run would fail)
    monkeypatch.setattr(executables, "DONATE_MIN_BYTES", 0)
    x = torch.randn(64, 64)
    t = x.to("tpu")
    ref = x.clone()
    for _ in range(executables.DONATE_AFTER + 2):
        t.add_(1.5)
        ref.add_(1.5)
    torch.tpu.synchronize()  # add_ is compiled: its next calls donate
    t.add_(1.5)
    ref.add_(1.5)
    d0 = torchtpu.metrics()["donated_buffers"]
    slow_compile.clear()
    s = t.sinh()  # a new signature: its job holds t's array until the compile ends
    want = ref.sinh()
    for _ in range(3):
        t.add_(1.5)
        ref.add_(1.5)
    assert torchtpu.metrics()["donated_buffers"] > d0  # (the later arrays are donated)
    threading.Timer(0.3, slow_compile.set).start()
    torch.testing.assert_close(s.cpu(), want)
    torch.testing.assert_close(t.cpu(), ref)


@pytest.mark.parametrize("queue_limit", [0, 64])
def test_threads_dispatching_at_once(workers, monkeypatch, queue_limit):
    # (queued runs: a job may wait only on jobs queued ahead of it, or the workers
    # deadlock; this test hung before submission and publication shared one lock)
    monkeypatch.setattr(async_compile, "QUEUE_LIMIT", queue_limit)
    errors = []

    def work(i):
        try:
            for k in range(10):
                y = torch.full((3, 4 + k), float(i), device="tpu")
                got = (y * 2 + i).sum().item()
                if got != 3 * i * 3 * (4 + k):
                    errors.append((i, k, got))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


@_budget.full_only  # (a 16 s process; set_workers(0), the same switch, is tested in-process; CI's budget)
def test_environment_variable_switches_it_off():
    code = ("import torch, torchtpu\n"
            "t = torch.ones(3, 5, device='tpu')\n"
            "y = (t.exp() * 2).sum()\n"
            "print(torchtpu.metrics()['async_compile']['jobs'], y.item())\n")
    env = dict(os.environ, TORCHTPU_EAGER_MODE="strict", TORCHTPU_COMPILE_WORKERS="0")
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    env["TORCHTPU_COMPILE_WORKERS"] = "2"
    env["TORCHTPU_CACHE_DIR"] = ""
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        check=True).stdout.split()
    assert int(off[0]) == 0 and int(on[0]) > 0
    assert float(off[1]) == float(on[1]) == pytest.approx(15 * 2 * 2.718281828, rel=1e-6)
