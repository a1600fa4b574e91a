"""``torch.tpu`` memory queries shaped like ``torch.cuda``'s, with real numbers.

On the CPU PJRT platform (where these tests run) the device's memory is the host's, so
``mem_get_info`` / ``total_memory`` are checked against the host's own numbers, read here
independently (``sysconf``, ``psutil``).
"""

import os
import pickle

import pytest
import torch
import torch.cuda._memory_viz as memory_viz

cpu_platform = pytest.mark.skipif(
    torch.tpu.get_device_properties(0).platform != "cpu", reason="CPU PJRT platform only"
)


@cpu_platform
def test_mem_get_info_is_host_memory_on_cpu_platform():
    free, total = torch.tpu.mem_get_info()
    assert total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < free <= total
    psutil = pytest.importorskip("psutil")
    avail = psutil.virtual_memory().available
    assert abs(free - avail) < 0.1 * total  # both are MemAvailable, read a moment apart


def test_total_memory_matches_mem_get_info():
    props = torch.tpu.get_device_properties(0)
    assert props.total_memory == torch.tpu.mem_get_info(0)[1] > 0
    assert (props.major, props.minor) == torch.tpu.get_device_capability(0)
    assert torch.tpu.mem_get_info("tpu:0")[1] == torch.tpu.mem_get_info(torch.device("tpu"))[1]
    # torch.accelerator's query goes to the same place
    assert torch.accelerator.get_memory_info(0)[1] == props.total_memory


def test_empty_cache_collects_no_garbage_as_on_cuda(monkeypatch):
    # (before: a gc.collect() per call; vLLM calls empty_cache at shutdown, where two
    # full collections of a serving process's heap made its engine overrun vLLM's 5 s
    # shutdown grace and get force-killed)
    import gc

    t = torch.ones(1024, device="tpu")
    del t
    before = torch.tpu.memory_allocated()

    def no_collect(*a):
        raise AssertionError("empty_cache ran gc.collect()")

    monkeypatch.setattr(gc, "collect", no_collect)
    torch.tpu.empty_cache()
    torch.accelerator.empty_cache()
    assert torch.tpu.memory_allocated() == before


def test_accelerator_calls_without_a_device_work_as_on_cuda():
    # vLLM's model loader calls torch.accelerator.empty_cache() with no argument; it
    # raised TypeError (the tpu route passed a device index to torch.tpu.empty_cache)
    t = torch.ones(1024, device="tpu")
    del t
    assert torch.accelerator.empty_cache() is None
    # (PyTorch's empty_host_cache reached no host allocator for tpu: a segfault)
    assert torch.accelerator.empty_host_cache() is None
    torch.accelerator.synchronize()
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated()


def test_mem_get_info_bad_device_raises_like_cuda():
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.tpu.mem_get_info(torch.tpu.device_count() + 3)
    with pytest.raises(ValueError, match="Expected a tpu device"):
        torch.tpu.mem_get_info("cpu")


def test_memory_summary_and_snapshot_see_a_new_tensor():
    # earlier tests' tensors held in reference cycles must not be freed mid-test by the
    # garbage collector (seen in the full run: allocated ended 160 bytes below `before`)
    import gc

    gc.collect()
    gc.disable()
    try:
        _memory_summary_and_snapshot_see_a_new_tensor()
    finally:
        gc.enable()


def _memory_summary_and_snapshot_see_a_new_tensor():
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.memory_allocated()
    x = torch.ones(512, 1024, device="tpu")  # 2 MiB
    nbytes = x.untyped_storage().nbytes()
    assert nbytes == x.cpu().untyped_storage().nbytes() == 2 * 1024 * 1024
    assert torch.tpu.memory_allocated() - before == nbytes
    summary = torch.tpu.memory_summary()
    assert "Allocated memory" in summary and "device ID 0" in summary
    assert f"{(before + nbytes) / 2**20:.2f} MiB" in summary

    sizes = [s["total_size"] for s in torch.tpu.memory_snapshot() if s["device"] == 0]
    assert sizes.count(nbytes) >= 1 and sum(sizes) == torch.tpu.memory_allocated()
    snap = torch.tpu.memory._snapshot()
    # PyTorch's own memory_viz reads it
    text = memory_viz.segsum(pickle.loads(pickle.dumps(snap)))
    assert "segments:" in text
    n_before = sizes.count(nbytes)
    del x
    sizes = [s["total_size"] for s in torch.tpu.memory_snapshot() if s["device"] == 0]
    assert sizes.count(nbytes) == n_before - 1
    assert torch.tpu.memory_allocated() == before


def test_dump_snapshot(tmp_path):
    x = torch.zeros(3, device="tpu")  # noqa: F841
    path = tmp_path / "snap.pickle"
    torch.tpu.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert {"segments", "device_traces"} <= snap.keys()
    assert any(s["total_size"] == 12 for s in snap["segments"])


def test_cuda_shaped_namespaces():
    import torch.tpu.memory as tm
    from torch.tpu.amp import GradScaler, autocast
    from torch.tpu.memory import mem_get_info

    assert mem_get_info is torch.tpu.mem_get_info
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "memory_stats", "memory_summary", "memory_snapshot",
                 "mem_get_info", "reset_peak_memory_stats", "reset_max_memory_allocated",
                 "reset_accumulated_memory_stats", "empty_cache", "_snapshot", "_dump_snapshot"):
        assert hasattr(torch.cuda.memory, name), name  # a torch.cuda.memory name
        assert getattr(tm, name) is getattr(torch.tpu, name, getattr(tm, name)), name
    for name in ("utilization", "ipc_collect", "memory_summary", "memory_snapshot"):
        assert hasattr(torch.cuda, name) and callable(getattr(torch.tpu, name)), name
    assert isinstance(GradScaler(), torch.amp.GradScaler)
    with autocast():
        y = torch.ones(2, 2, device="tpu") @ torch.ones(2, 2, device="tpu")
    assert y.dtype == torch.get_autocast_dtype("tpu")
    assert torch.tpu.ipc_collect() is None


def test_utilization_bad_device_raises_like_cuda():
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.tpu.utilization(torch.tpu.device_count() + 3)


class _FakePjrtDevice:
    """A PJRT device as JAX presents it, with the figures the test chooses."""

    def __init__(self, stats, local_hardware_id=0):
        self.stats = stats
        self.id = 0
        self.local_hardware_id = local_hardware_id
        self.device_kind = "fake"

    def memory_stats(self):
        return self.stats


@pytest.fixture
def fake_platform(monkeypatch):
    """Make device 0 a fake PJRT device of a chosen platform: ``fake_platform(name,
    stats)`` returns the device."""
    from torchtpu._device import runtime

    def use(name, stats=None, **kw):
        dev = _FakePjrtDevice(stats, **kw)
        monkeypatch.setattr(runtime, "platform", lambda: name)
        monkeypatch.setattr(runtime, "jax_device", lambda index: dev)
        return dev

    return use


def test_utilization_is_refused_on_tpu(fake_platform):
    fake_platform("tpu")
    with pytest.raises(NotImplementedError,
                       match="not available on the tpu platform: PJRT reports no utilization"):
        torch.tpu.utilization()


def test_utilization_on_gpu_reads_nvml(fake_platform, monkeypatch):
    import sys
    import types

    handles = []
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: handles.append(i) or ("handle", i)
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(
        gpu=37 if h == ("handle", 5) else -1, memory=3)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    fake_platform("gpu", local_hardware_id=1)  # CUDA device 1 = the machine's GPU 5
    assert torch.tpu.utilization() == 37 and handles == [5]
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    with pytest.raises(NotImplementedError, match="on the gpu platform.*pynvml"):
        torch.tpu.utilization()


@cpu_platform
def test_utilization_on_cpu_is_host_busy_percent(tmp_path, monkeypatch):
    """The CPU platform's utilization is the host CPUs' busy share of the time between
    two calls, from /proc/stat's aggregate line (here a file the test writes)."""
    from torchtpu._device import memory

    stat = tmp_path / "stat"
    monkeypatch.setattr(memory, "_PROC_STAT", str(stat), raising=False)
    monkeypatch.setattr(memory, "_last_cpu_times", [])
    #                 user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert torch.tpu.utilization() == 20  # since boot: 200 busy of 1000
    stat.write_text("cpu  160 0 140 760 140 0 0 0 0 0\n")
    assert torch.tpu.utilization() == 50  # 100 busy of 200 since the previous call
    stat.write_text("cpu  360 0 140 760 140 0 0 0 0 0\n")
    assert torch.tpu.utilization() == 100
    monkeypatch.setattr(memory, "_PROC_STAT", str(tmp_path / "missing"))
    import sys

    monkeypatch.setitem(sys.modules, "psutil", None)
    with pytest.raises(NotImplementedError, match="cpu platform"):
        torch.tpu.utilization()


def _host_busy_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


@cpu_platform
def test_utilization_on_cpu_matches_proc_stat():
    """On the real host: the value is the busy share of the interval between two calls,
    as /proc/stat read around the same moments gives it (while this process keeps one CPU
    busy)."""
    import time

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    busy0, total0 = _host_busy_jiffies()
    torch.tpu.utilization()
    end = time.perf_counter() + 0.6
    n = 0
    while time.perf_counter() < end:
        n += 1
    u = torch.tpu.utilization()
    busy1, total1 = _host_busy_jiffies()
    expected = 100 * (busy1 - busy0) / (total1 - total0)
    assert isinstance(u, int) and 0 <= u <= 100
    assert abs(u - expected) <= 10, (u, expected)


@cpu_platform
def test_reserved_memory_is_not_labelled_pjrt_on_cpu_platform():
    """The CPU PJRT client reports no memory_stats(): the reserved figures are the live
    tpu tensors' bytes and the summary says so, not "PJRT"."""
    x = torch.ones(1000, device="tpu")  # noqa: F841
    torch.tpu.synchronize()
    assert torch.tpu.memory_reserved() == torch.tpu.memory_allocated() > 0
    assert torch.tpu.max_memory_reserved() == torch.tpu.max_memory_allocated()
    rows = [r for r in torch.tpu.memory_summary().splitlines() if "Reserved" in r]
    assert len(rows) == 1 and "PJRT" not in rows[0] and "live tpu tensors" in rows[0], rows


def test_reserved_memory_reads_pjrt_memory_stats(fake_platform):
    """TPU/GPU: memory_reserved and its peak are the PJRT device's own figures."""
    gib = 2**30
    # TPU-like: buffers in use plus memory the runtime reserved for programs
    fake_platform("tpu", {"bytes_in_use": 3 * gib, "peak_bytes_in_use": 5 * gib,
                          "bytes_reserved": 2 * gib, "peak_bytes_reserved": 2 * gib,
                          "bytes_limit": 16 * gib, "pool_bytes": -1})
    assert torch.tpu.memory_reserved() == 5 * gib
    assert torch.tpu.max_memory_reserved() == 7 * gib
    stats = torch.tpu.memory_stats()
    assert stats["reserved_bytes.all.current"] == 5 * gib
    assert stats["pjrt.bytes_limit"] == 16 * gib
    assert torch.tpu.mem_get_info() == (13 * gib, 16 * gib)
    summary = torch.tpu.memory_summary()
    row = [r for r in summary.splitlines() if "Reserved" in r][0]
    assert "PJRT in use + reserved" in row and "5.00 GiB" in row and "7.00 GiB" in row
    # GPU-like: the BFC allocator's pool, however much of it is in use
    fake_platform("gpu", {"bytes_in_use": gib, "peak_bytes_in_use": 2 * gib,
                          "pool_bytes": 8 * gib, "peak_pool_bytes": 9 * gib,
                          "bytes_reserved": 0, "bytes_limit": 100 * gib})
    assert torch.tpu.memory_reserved() == 8 * gib
    assert torch.tpu.max_memory_reserved() == 9 * gib
    assert "PJRT pool_bytes" in torch.tpu.memory_summary()


def test_reserved_memory_unreported_on_tpu_raises(fake_platform):
    """A TPU/GPU plugin without memory_stats(): no number is made up."""
    fake_platform("tpu", None)
    for f in (torch.tpu.memory_reserved, torch.tpu.max_memory_reserved):
        with pytest.raises(NotImplementedError, match="on the tpu platform"):
            f()
    assert "reserved_bytes.all.current" not in torch.tpu.memory_stats()
    row = [r for r in torch.tpu.memory_summary().splitlines() if "Reserved" in r][0]
    assert "n/a" in row


def test_peak_reset_like_cuda():
    x = torch.ones(256, 1024, device="tpu")
    del x
    assert torch.tpu.max_memory_allocated() >= 1024 * 1024
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()


def test_record_memory_history_readable_by_memory_viz(tmp_path):
    torch.tpu.memory._record_memory_history(max_entries=1000)
    try:
        a = torch.ones(1024, device="tpu")  # 4 KiB
        b = torch.zeros(256, 256, device="tpu")  # 256 KiB
        torch.tpu.synchronize()  # both exist on the device, in every eager mode
        c = torch.ones(333, device="tpu")  # noqa: F841  (DEFER_AND_FUSE: never run)
        del a, c
        snap = torch.tpu.memory._snapshot()
        path = tmp_path / "hist.pickle"
        torch.tpu.memory._dump_snapshot(str(path))
    finally:
        torch.tpu.memory._record_memory_history(enabled=None)
    events = snap["device_traces"][0]
    allocs = [e for e in events if e["action"] == "alloc"]
    frees = [e for e in events if e["action"] == "free_completed"]
    assert 4096 in [e["size"] for e in allocs] and 256 * 256 * 4 in [e["size"] for e in allocs]
    assert 4096 in [e["size"] for e in frees]
    # DEFER_AND_FUSE: `c` died before its segment ran, so it never had a device buffer
    deferred = torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_AND_FUSE
    assert (333 * 4 in [e["size"] for e in allocs]) is not deferred
    assert any(f["name"] == "test_record_memory_history_readable_by_memory_viz"
               for e in allocs for f in e["frames"])
    text = memory_viz.trace(pickle.loads(path.read_bytes()))  # PyTorch's reader
    assert "Device 0" in text and "free completed" in text
    assert "<html>" in memory_viz.trace_plot(snap)
    # off again: no history, allocation path restored
    assert torch.tpu.memory._snapshot()["device_traces"][0] == []
    from torchtpu._tensor.storage import StorageData
    assert StorageData.__init__.__qualname__ == "StorageData.__init__"
    del b
