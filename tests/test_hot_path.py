"""Strict eager's per-op hot path (``torchtpu.eager.hotpath``): a call whose executable is
known from its hot key runs without the general path.  Each test checks that the hot path
really ran (``metrics()["hot_path_calls"]``) and that its values equal CPU PyTorch's, on
the cases where a wrong hot key would pick a wrong executable or wrong inputs."""

from __future__ import annotations

import os
import subprocess
import sys

import _budget
import pytest
import torch

import torchtpu
from torchtpu.eager import hotpath

pytestmark = pytest.mark.usefixtures("strict_mode", "hot_impl", "sync_first_calls",
                                      "fresh_shape_buckets")


@pytest.fixture(params=["native", "python"], autouse=False)
def hot_impl(request):
    """Each test with the C++ form of the hot path (built here if need be; skipped where
    the C++ helper cannot be built) and with its Python form."""
    if request.param == "native":
        from torchtpu._tensor import native

        try:
            native.module()
        except NotImplementedError as e:
            pytest.skip(f"no C++ helper here: {e}")
    prev = hotpath.set_native(request.param == "native")
    yield request.param
    hotpath.set_native(prev)


def _hot_calls() -> int:
    return torchtpu.metrics()["hot_path_calls"]


def _twice_then_hot(fn, *cpu_args):
    """Run ``fn`` on tpu copies of ``cpu_args`` three times (the first call builds, the
    second writes the hot entry, the third takes the hot path); return the third result
    and assert it took the hot path."""
    dev = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    fn(*dev)
    fn(*dev)
    h0 = _hot_calls()
    out = fn(*dev)
    assert _hot_calls() > h0, "the call did not take the hot path"
    return out


def test_repeated_op_takes_the_hot_path_and_matches_cpu():
    a, b = torch.randn(5, 7), torch.randn(5, 7)
    out = _twice_then_hot(torch.add, a, b)
    torch.testing.assert_close(out.cpu(), a + b)
    assert out.device.type == "tpu" and out.shape == (5, 7) and out.is_contiguous()


def test_hot_path_is_bypassed_when_switched_off():
    prev = hotpath.set_enabled(False)
    try:
        a = torch.randn(4, 4, device="tpu")
        for _ in range(3):
            a + a
        h0 = _hot_calls()
        out = a + a
        assert _hot_calls() == h0
    finally:
        hotpath.set_enabled(prev)
    torch.testing.assert_close(out.cpu(), a.cpu() * 2)


def test_python_numbers_are_runtime_inputs_not_part_of_the_entry():
    x = torch.randn(6)
    t = x.to("tpu")
    for _ in range(2):
        t * 2.0
    h0 = _hot_calls()
    for s in (3.0, -1.5, 0.25, 7.0):
        torch.testing.assert_close((t * s).cpu(), x * s)
    assert _hot_calls() - h0 == 4
    # an int scalar is another signature (integer tensors stay integer)
    i = torch.arange(6)
    ti = i.to("tpu")
    for s in (2, 3, 5):
        assert torch.equal((ti * s).cpu(), i * s)
    # and a float scalar on an int tensor promotes, as on CPU
    torch.testing.assert_close((ti * 0.5).cpu(), i * 0.5)


def test_aliasing_is_part_of_the_hot_key():
    x, y = torch.randn(8), torch.randn(8)
    tx, ty = x.to("tpu"), y.to("tpu")
    for _ in range(3):
        tx + ty
    h0 = _hot_calls()
    # the same shapes, but one storage read twice: another executable's inputs
    torch.testing.assert_close((tx + tx).cpu(), x + x)
    torch.testing.assert_close((tx - tx).cpu(), x - x)
    for _ in range(3):
        r = tx - tx
        torch.testing.assert_close(r.cpu(), torch.zeros(8))
    torch.testing.assert_close((tx - ty).cpu(), x - y)
    assert _hot_calls() > h0


def test_signed_zero_and_nan_constants_stay_apart():
    x = torch.tensor([float("nan"), -0.0, 0.0, 2.0])
    t = x.to("tpu")
    for v in (0.0, -0.0, 0.0, -0.0, 0.0, -0.0):
        # a constant argument: -0.0 == 0.0 in Python, but not as the executable's constant
        got = torch.nan_to_num(t, nan=v).cpu()
        want = torch.nan_to_num(x, nan=v)
        assert torch.equal(torch.signbit(got), torch.signbit(want)), (v, got, want)
        # a runtime number: -0.0 + 0.0 is +0.0, -0.0 + -0.0 is -0.0
        got = (t + v).cpu()
        assert torch.equal(torch.signbit(got), torch.signbit(x + v)), (v, got)
    for v in (float("nan"), float("nan"), float("nan")):
        got = torch.nan_to_num(t, posinf=v).cpu()
        torch.testing.assert_close(got, torch.nan_to_num(x, posinf=v), equal_nan=True)


def test_views_are_keyed_by_their_geometry_and_offset():
    x = torch.randn(6, 8)
    t = x.to("tpu")
    for _ in range(3):
        t + 1
    # a transposed, an offset, a strided and a reshaped view of the same storage: each
    # its own entry, never the whole-storage one
    for _ in range(3):
        torch.testing.assert_close((t.t() + 1).cpu(), x.t() + 1)
        torch.testing.assert_close((t[2:] + 1).cpu(), x[2:] + 1)
        torch.testing.assert_close((t[:, ::2] + 1).cpu(), x[:, ::2] + 1)
        torch.testing.assert_close((t.view(8, 6) + 1).cpu(), x.view(8, 6) + 1)
        torch.testing.assert_close(t.view(-1).neg().cpu(), x.view(-1).neg())
    # rows at each offset: one executable (the offset is a runtime input), one entry per
    # offset, each reading its own row
    h0 = _hot_calls()
    for _ in range(2):
        for i in range(6):
            torch.testing.assert_close((t[i] * 2).cpu(), x[i] * 2)
            torch.testing.assert_close((t[i, 1:] * 2).cpu(), x[i, 1:] * 2)
    assert _hot_calls() - h0 >= 12
    # in place through a view at each offset
    y = x.clone()
    ty = y.to("tpu")
    for _ in range(2):
        for i in range(6):
            ty[i].mul_(3.0)
            y[i].mul_(3.0)
    torch.testing.assert_close(ty.cpu(), y)


def test_in_place_ops_and_donation_on_the_hot_path():
    x = torch.randn(300, 300)  # large enough that hot in-place signatures donate
    y = torch.randn(300, 300)
    tx, ty = x.clone().to("tpu"), y.to("tpu")
    alias = tx.view(-1)  # another view of the written storage sees every update
    h0 = _hot_calls()
    d0 = torchtpu.metrics()["donated_buffers"]
    for _ in range(12):
        tx.add_(ty, alpha=0.5)
        x.add_(y, alpha=0.5)
        tx.mul_(0.9)
        x.mul_(0.9)
    torch.testing.assert_close(tx.cpu(), x)
    torch.testing.assert_close(alias.cpu(), x.view(-1))
    assert _hot_calls() - h0 >= 12
    assert torchtpu.metrics()["donated_buffers"] > d0


def test_out_arguments_on_the_hot_path():
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    ta, tb = a.to("tpu"), b.to("tpu")
    out = torch.empty(4, 3, device="tpu")
    h0 = _hot_calls()
    for _ in range(4):
        torch.mul(ta, tb, out=out)
    torch.testing.assert_close(out.cpu(), a * b)
    assert _hot_calls() > h0


def test_default_dtype_and_matmul_precision_are_part_of_the_hot_key(hot_impl):
    i = torch.arange(5)
    ti = i.to("tpu")
    for _ in range(3):
        assert (ti / 2).dtype == torch.float32
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        r = ti / 2
        assert r.dtype == torch.float64
        torch.testing.assert_close(r.cpu(), i / 2)
    finally:
        torch.set_default_dtype(saved)
    assert (ti / 2).dtype == torch.float32
    n = 8 if hot_impl == "native" else 9  # (shapes no other test compiled)
    a, b = torch.randn(n, n), torch.randn(n, n)
    ta, tb = a.to("tpu"), b.to("tpu")
    for _ in range(3):
        torch.testing.assert_close((ta @ tb).cpu(), a @ b)
    # another precision is another executable (XLA:CPU may compute the same values, so
    # the test watches the executable cache: the call must not reuse the hot entry)
    torch.set_float32_matmul_precision("medium")
    try:
        m0 = torchtpu.metrics()["cache_misses"]
        torch.testing.assert_close((ta @ tb).cpu(), a @ b, atol=5e-2, rtol=5e-2)
        assert torchtpu.metrics()["cache_misses"] == m0 + 1
    finally:
        torch.set_float32_matmul_precision("highest")


def test_device_checks_still_raise_on_the_hot_path():
    x = torch.randn(5, 3)
    t = x.to("tpu")
    good = torch.tensor([0, 4, 1], device="tpu")
    for _ in range(3):
        torch.testing.assert_close(torch.index_select(t, 0, good).cpu(), x[[0, 4, 1]])
    bad = torch.tensor([0, 9, 1], device="tpu")  # same signature as ``good``
    with pytest.raises(IndexError):
        torch.index_select(t, 0, bad).cpu()
    torch.testing.assert_close(torch.index_select(t, 0, good).cpu(), x[[0, 4, 1]])


def test_eviction_forgets_the_evicted_executables_entries(monkeypatch):
    from torchtpu._device import executable_limit
    from torchtpu.eager import executables, executor

    hotpath.drop_all()  # (earlier tests' sin and cos entries)
    a = torch.randn(3, 3)
    ta = a.to("tpu")
    for _ in range(3):
        ta.sin()
        ta.cos()
    sin_plan = executor._PLANS[torch.ops.aten.sin.default]
    cos_plan = executor._PLANS[torch.ops.aten.cos.default]
    assert sin_plan.hot and cos_plan.hot
    (sin_ex, _), = sin_plan.hot.values()
    executables.CACHE.move_to_end(sin_ex.key, last=False)  # the next one evicted
    monkeypatch.setattr(executable_limit, "MAX_EXECUTABLES", len(executables.CACHE))
    ta.tan()  # a new executable: the cache evicts sin's, and only its entries go
    assert sin_ex.key not in executables.CACHE
    assert not sin_plan.hot
    assert cos_plan.hot  # (before: every table was dropped at every eviction)
    h0 = _hot_calls()
    torch.testing.assert_close(ta.cos().cpu(), a.cos())
    assert _hot_calls() == h0 + 1
    torch.testing.assert_close(ta.sin().cpu(), a.sin())  # compiled or loaded again
    executables.clear_cache()
    assert not any(hotpath._TABLES)


def test_tensor_list_ops_on_the_hot_path():
    xs = [torch.randn(2, 3), torch.randn(4, 3)]
    txs = [x.to("tpu") for x in xs]
    for _ in range(2):
        torch.cat(txs)
    h0 = _hot_calls()
    torch.testing.assert_close(torch.cat(txs).cpu(), torch.cat(xs))
    torch.testing.assert_close(torch.cat([txs[1], txs[0]]).cpu(), torch.cat([xs[1], xs[0]]))
    torch.testing.assert_close(torch.cat([txs[0], txs[0]]).cpu(), torch.cat([xs[0], xs[0]]))
    assert _hot_calls() > h0


def test_training_loop_runs_on_the_hot_path():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    dev_model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 3))
    dev_model.load_state_dict(model.state_dict())
    dev_model.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dopt = torch.optim.AdamW(dev_model.parameters(), lr=1e-2)
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    dx, dy = x.to("tpu"), y.to("tpu")
    h0 = _hot_calls()
    for _ in range(6):
        for m, o, xx, yy in ((model, opt, x, y), (dev_model, dopt, dx, dy)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(xx), yy).backward()
            o.step()
    for p, q in zip(model.parameters(), dev_model.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), atol=1e-5, rtol=1e-5)
    assert _hot_calls() - h0 > 50


def test_environment_switch_turns_it_off(hot_impl):
    if hot_impl == "python":  # (~14 s of processes, whose hot path this fixture does not set)
        pytest.skip("the processes pick their hot path themselves: run once, with [native]")
    code = ("import torch, torchtpu\n"
            "a = torch.ones(3, device='tpu')\n"
            "for _ in range(5): b = a + a\n"
            "print(torchtpu.metrics()['hot_path_calls'], b.cpu().tolist())\n")
    env = dict(os.environ, TORCHTPU_EAGER_MODE="strict")
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        check=True).stdout.split(maxsplit=1)
    env["TORCHTPU_HOT_PATH"] = "0"
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split(maxsplit=1)
    assert int(on[0]) > 0 and int(off[0]) == 0
    assert on[1] == off[1] == "[2.0, 2.0, 2.0]\n"


def _default_ops():
    from torchtpu.conformance.opinfo import op_id, select_opinfos

    sys.path.insert(0, os.path.dirname(__file__))
    try:
        from test_opinfo import DEFAULT_OPS
    finally:
        sys.path.pop(0)
    by_id = {op_id(op): op for op in select_opinfos()}
    ops = [n for n in DEFAULT_OPS if torch.float32 in by_id[n].supported_dtypes("cpu")]
    if not _budget.FULL:
        # every sixteenth op in the default run (make test's time budget; test_opinfo runs
        # them all once); TORCHTPU_FULL_TESTS=1 runs each
        ops = ops[::16]
    return [pytest.param(by_id[n], id=n) for n in ops]


_DEFAULT_OPS = _default_ops()
# the Python form of the hot path (where the C++ helper cannot be built) runs every other
# op of that subset in the default run (make test's time budget)
_PYTHON_FORM_OPS = {p.id for p in _DEFAULT_OPS[::2]}
_SWEEP_HOT = []  # hot-path calls of each op's second run


@pytest.mark.parametrize("op", _DEFAULT_OPS)
def test_opinfo_samples_again_on_the_hot_path(op, hot_impl, request):
    """The OpInfo sweep's samples (the default subset, 2 per op), run twice in STRICT: the
    second run's calls find their executables through the hot path, and must still equal
    CPU on every sample."""
    from torchtpu.conformance.opinfo import check_op

    if (hot_impl == "python" and not _budget.FULL
            and request.node.callspec.id.split("-", 1)[-1] not in _PYTHON_FORM_OPS):
        pytest.skip("the Python form runs every other op of the subset (TORCHTPU_FULL_TESTS=1: all)")

    (first,) = check_op(op, [torch.float32], 2, compiled=False)
    if first.status != "pass":
        pytest.skip(f"first run: {first.status} (the sweep itself reports it)")
    h0 = _hot_calls()
    (again,) = check_op(op, [torch.float32], 2, compiled=False)
    _SWEEP_HOT.append(_hot_calls() - h0)
    bad = [(r["index"], r["sample"], r["detail"]) for r in again.samples
           if r["status"] not in ("pass", "skipped")]
    assert again.status == "pass", bad


def test_opinfo_sweep_used_the_hot_path():
    """(after the sweep above, in the same process) most ops' second runs took it."""
    if len(_SWEEP_HOT) < 20:
        pytest.skip("the sweep did not run in this process")
    assert sum(1 for n in _SWEEP_HOT if n > 0) > len(_SWEEP_HOT) // 2, _SWEEP_HOT


def test_defer_and_fuse_records_through_the_hot_path():
    """DEFER_AND_FUSE finds the executable to record through the same tables (pending
    values are admitted inputs); the fused results equal CPU, and a later STRICT call of
    a signature only ever recorded compiles it first (no uncompiled executable called)."""
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    tx, tw = x.to("tpu"), w.to("tpu")
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        h0 = _hot_calls()
        y = tx
        for _ in range(6):
            y = torch.tanh(y @ tw) * 0.5 + y
        got = y.cpu()
        assert _hot_calls() - h0 >= 10
    want = x
    for _ in range(6):
        want = torch.tanh(want @ w) * 0.5 + want
    torch.testing.assert_close(got, want)
    # recorded only: a signature first met in DEFER_AND_FUSE (a new shape), then STRICT
    z, tz = torch.randn(7, 5), None
    tz = z.to("tpu")
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        for _ in range(3):
            r = torch.sinh(tz)
        r.cpu()
    torch.testing.assert_close(torch.sinh(tz).cpu(), torch.sinh(z))
    torch.testing.assert_close(torch.sinh(tz).cpu(), torch.sinh(z))


def _plan_calls(monkeypatch) -> list:
    """The ops whose ``LoweredPlan.__call__`` runs from now on in this test, in order."""
    from torchtpu.eager import executor

    entered = []
    real = executor.LoweredPlan.__call__

    def counting(self, args, kwargs):
        entered.append(self.op)
        return real(self, args, kwargs)

    monkeypatch.setattr(executor.LoweredPlan, "__call__", counting)
    return entered


def test_cpp_kernels_finish_hot_calls_without_the_python_plan(hot_impl, monkeypatch):
    """Once the C++ helper is loaded, each lowered op's PrivateUse1 kernel is C++: a hot
    call runs its HotPlan without entering ``LoweredPlan.__call__``; with the Python form
    selected every call goes through it.  Arguments equal to their defaults (``alpha=1``),
    keyword-only arguments (``dtype=``) and memory formats reach the plan as the Python
    kernels gave them: the values match CPU and the calls stay on the hot path."""
    a, b = torch.randn(6, 5), torch.randn(6, 5)
    x = torch.randn(2, 3, 4, 5)
    ta, tb, tx = a.to("tpu"), b.to("tpu"), x.to("tpu")
    calls = [
        (lambda p, q, r: torch.add(p, q), lambda: a + b),
        (lambda p, q, r: torch.add(p, q, alpha=1), lambda: a + b),
        (lambda p, q, r: torch.add(p, q, alpha=2.5), lambda: a + 2.5 * b),
        (lambda p, q, r: torch.sum(p, dim=1, dtype=torch.float64),
         lambda: a.sum(dim=1, dtype=torch.float64)),
        (lambda p, q, r: r.clone(memory_format=torch.channels_last),
         lambda: x.clone(memory_format=torch.channels_last)),
        (lambda p, q, r: p * 3.0, lambda: a * 3.0),
    ]
    for fn, _ in calls:  # build, then write the hot entries
        fn(ta, tb, tx)
        fn(ta, tb, tx)
    entered = _plan_calls(monkeypatch)
    h0 = _hot_calls()
    for fn, want in calls:
        got = fn(ta, tb, tx)
        torch.testing.assert_close(got.cpu(), want())
        assert got.stride() == want().stride()
    assert _hot_calls() - h0 == len(calls)
    if hot_impl == "native":
        assert entered == [], f"went through the Python plan: {entered}"
    else:
        assert len(entered) == len(calls)


def test_cpp_kernels_record_defer_and_fuse_calls_without_the_python_plan(hot_impl,
                                                                          monkeypatch):
    """DEFER_AND_FUSE: a call whose executable the tables know is recorded by the C++
    kernel itself (no ``LoweredPlan.__call__``); the fused results equal CPU's, also with
    calls that write a tensor (``out=``, in-place through ``add.out``) in the segment."""

    a, b = torch.randn(6, 5), torch.randn(6, 5)
    ta, tb = a.to("tpu"), b.to("tpu")

    def step(p, q, o):
        r = torch.mul(p, q)
        torch.add(r, q, alpha=2.0, out=o)
        o.add_(p)
        return torch.sum(o * r, dim=1)

    with torch.tpu.set_eager_mode("defer_and_fuse"):
        for _ in range(2):  # build and write the hot entries
            step(ta, tb, torch.zeros(6, 5, device="tpu")).cpu()
        entered = _plan_calls(monkeypatch)
        h0 = _hot_calls()
        o = torch.zeros(6, 5, device="tpu")  # (an empty one is no hot-path input)
        got = step(ta, tb, o)
        got_cpu, o_cpu = got.cpu(), o.cpu()
    hot = _hot_calls() - h0
    oc = torch.zeros(6, 5)
    want = step(a, b, oc)
    torch.testing.assert_close(got_cpu, want)
    torch.testing.assert_close(o_cpu, oc)
    assert hot == 5
    # (out= and in-place calls reach the PrivateUse1 fallback, not an op's own kernel)
    from torchtpu import _device

    own = {op for _, op in _device.DIRECT_KERNELS}
    entered = [op for op in entered if op in own]
    if hot_impl == "native":
        assert entered == [], f"went through the Python plan: {entered}"
    else:
        assert [op for op in entered if op is not torch.ops.aten.zeros.default] == [
            torch.ops.aten.mul.Tensor, torch.ops.aten.mul.Tensor, torch.ops.aten.sum.dim_IntList]


def test_hot_outputs_are_counted_in_device_memory_and_freed(hot_impl):
    """The hot path makes its output storages itself (in C++ for the native form, with
    the device-byte accounting of ``StorageData`` and its ``__del__``): memory_allocated
    grows by each output's bytes, the peak follows, and freeing the outputs gives the
    bytes back; the storages are fixed-size tpu storages as PyTorch's own
    ``_construct_storage_from_data_pointer`` makes them, and the values match CPU."""
    a = torch.randn(32, 8)
    ta = a.to("tpu")
    _twice_then_hot(lambda x: x * 2.0, a)
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    h0 = _hot_calls()
    outs = [ta * 2.0 for _ in range(5)]
    assert _hot_calls() - h0 == 5
    assert torch.tpu.memory_allocated() - base == 5 * a.numel() * 4
    assert torch.tpu.max_memory_allocated() - base == 5 * a.numel() * 4
    st = outs[0].untyped_storage()
    assert st.device == torch.device("tpu", 0) and st.nbytes() == a.numel() * 4
    assert not st.resizable()
    assert len({o.untyped_storage().data_ptr() for o in outs}) == 5
    for o in outs:
        torch.testing.assert_close(o.cpu(), a * 2.0)
    del outs, o, st
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.max_memory_allocated() - base == 5 * a.numel() * 4


def test_hot_path_counts_reach_metrics_and_reset_drops_them(hot_impl):
    """The C++ kernels keep their counters in C++ and ``metrics()`` adds them when read:
    every hot call is counted once (as a hot-path call, a cache hit, a lowered op and a
    dispatched op), and ``reset_metrics()`` drops the counts not yet read."""
    a = torch.randn(4, 4)
    ta = a.to("tpu")
    _twice_then_hot(lambda x: x + x, a)
    torchtpu.reset_metrics()
    for _ in range(7):
        ta + ta
    m = torchtpu.metrics()
    assert m["hot_path_calls"] == 7 and m["cache_hits"] == 7
    assert m["lowered_ops"] == 7 and m["ops_dispatched"] == 7
    m = torchtpu.metrics()  # (read twice: counted once)
    assert m["hot_path_calls"] == 7
    for _ in range(3):
        ta + ta
    torchtpu.reset_metrics()
    assert torchtpu.metrics()["hot_path_calls"] == 0


def test_alpha_check_still_runs_for_explicit_alphas_on_the_hot_path(hot_impl):
    """The C++ hot path skips ``add``'s alpha check only while alpha is the default: an
    explicit alpha that does not fit the integer dtype still raises CPU's error on a hot
    signature, an explicit ``alpha=1`` computes as the default, and other alphas compute
    as CPU."""
    a = torch.arange(6, dtype=torch.int8).reshape(2, 3)
    _twice_then_hot(lambda x, y: torch.add(x, y), a, a)
    _twice_then_hot(lambda x, y: torch.add(x, y, alpha=3), a, a)
    ta = a.to("tpu")
    for alpha in (300, 2.5):
        with pytest.raises(RuntimeError) as cpu:
            torch.add(a, a, alpha=alpha)
        with pytest.raises(RuntimeError) as tpu:
            torch.add(ta, ta, alpha=alpha)
        assert str(tpu.value) == str(cpu.value)
    for alpha in (1, 3, -2):
        assert torch.equal(torch.add(ta, ta, alpha=alpha).cpu(), torch.add(a, a, alpha=alpha))
        assert torch.equal(torch.sub(ta, ta, alpha=alpha).cpu(), torch.sub(a, a, alpha=alpha))
    assert torch.equal((ta + ta).cpu(), a + a)
