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


def test_utilization_is_a_percentage():
    u = torch.tpu.utilization()
    assert isinstance(u, int) and 0 <= u <= 100
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.tpu.utilization(torch.tpu.device_count() + 3)


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
