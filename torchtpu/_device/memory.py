"""``torch.tpu.memory``: memory queries shaped like ``torch.cuda.memory``.

Where the numbers come from:

* bytes held by ``tpu`` tensors (``memory_allocated`` and friends): our own count of live
  ``tpu`` storages (:data:`torchtpu._tensor.storage.ALLOCATOR`), the same on every platform;
* device capacity and free memory (``mem_get_info``, ``get_device_properties().total_memory``):
  the PJRT device's ``memory_stats()`` (``bytes_limit`` / ``bytes_in_use``) on TPU and GPU;
  the CPU PJRT platform reports none, and its device memory *is* the host's memory, so there
  the host's ``MemTotal`` / ``MemAvailable`` (``/proc/meminfo``; ``psutil`` or ``sysconf``
  elsewhere) are returned, as ``torch.cuda`` does for integrated GPUs sharing host RAM.

The functions are defined here and re-exported by :mod:`torchtpu._device.tpu_module`, so
``torch.tpu.memory.X`` and ``torch.tpu.X`` are the same objects, as for
``torch.cuda.memory``.
"""

from __future__ import annotations

import gc
import os
import pickle

from torchtpu._device import runtime
from torchtpu._device.state import to_index

__all__ = [
    "empty_cache", "host_memory_info", "ipc_collect", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved",
    "memory_snapshot", "memory_stats", "memory_summary", "reset_accumulated_memory_stats",
    "reset_max_memory_allocated", "reset_peak_memory_stats", "utilization",
    "_record_memory_history", "_snapshot", "_dump_snapshot",
]


# ------------------------------------------------------ bytes held, PJRT stats


def _pjrt_memory_stats(index) -> dict:
    try:
        return runtime.jax_device(index).memory_stats() or {}
    except Exception:
        return {}


def memory_allocated(device=None) -> int:
    """Bytes held by live ``tpu`` storages on ``device`` (``torch.cuda.memory_allocated``)."""
    from torchtpu._tensor.storage import ALLOCATOR

    return ALLOCATOR.allocated.get(to_index(device), 0)


def max_memory_allocated(device=None) -> int:
    """Peak of :func:`memory_allocated` since start or the last reset (bytes)."""
    from torchtpu._tensor.storage import ALLOCATOR

    return ALLOCATOR.peak.get(to_index(device), 0)


def memory_reserved(device=None) -> int:
    """Bytes the PJRT allocator holds (platform-reported; else ``memory_allocated``)."""
    stats = _pjrt_memory_stats(to_index(device))
    return int(stats.get("bytes_reserved", stats.get("bytes_in_use", memory_allocated(device))))


def max_memory_reserved(device=None) -> int:
    stats = _pjrt_memory_stats(to_index(device))
    return int(stats.get("peak_bytes_in_use", max_memory_allocated(device)))


def reset_peak_memory_stats(device=None) -> None:
    from torchtpu._tensor.storage import ALLOCATOR

    idx = to_index(device)
    ALLOCATOR.peak[idx] = ALLOCATOR.allocated.get(idx, 0)


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_stats(device=None) -> dict:
    """Allocator statistics with ``torch.cuda.memory_stats`` key names (bytes)."""
    idx = to_index(device)
    cur = memory_allocated(idx)
    peak = max_memory_allocated(idx)
    d = {
        "allocated_bytes.all.current": cur,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": memory_reserved(idx),
        "reserved_bytes.all.peak": max_memory_reserved(idx),
    }
    for k, v in _pjrt_memory_stats(idx).items():
        d[f"pjrt.{k}"] = v
    return d


def empty_cache() -> None:
    """Release cached executables' temporaries (PJRT frees buffers as tensors die)."""
    gc.collect()


# ----------------------------------------------------------------- host memory


def host_memory_info() -> tuple[int, int]:
    """(available, total) bytes of host RAM.

    Linux: ``MemAvailable`` and ``MemTotal`` of ``/proc/meminfo`` (what ``psutil``'s
    ``virtual_memory().available/.total`` report); elsewhere ``psutil`` if installed, else
    ``sysconf`` (free pages as "available").
    """
    try:
        with open("/proc/meminfo") as f:
            info = {}
            for line in f:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
        total = info["MemTotal"]
        avail = info.get("MemAvailable", info.get("MemFree", 0))
        return avail, total
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:
        pass
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _device_memory(index: int) -> tuple[int, int]:
    """(free, total) bytes of ``tpu:index``: PJRT's numbers, or the host's on the CPU
    platform (whose device memory is host memory).  (0, 0) for a non-CPU platform whose
    PJRT plugin reports nothing."""
    stats = _pjrt_memory_stats(index)
    total = int(stats.get("bytes_limit", 0) or 0)
    if total:
        return max(total - int(stats.get("bytes_in_use", 0)), 0), total
    if runtime.platform() == "cpu":
        return host_memory_info()
    return 0, 0


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of a ``tpu`` device, like ``torch.cuda.mem_get_info``.

    TPU/GPU: PJRT's ``bytes_limit`` and ``bytes_limit - bytes_in_use``.  CPU platform: the
    host's available and total RAM (see the module docstring).

    Raises:
        RuntimeError: the device index is out of range.
        ValueError: ``device`` is not a ``tpu`` device.
    """
    idx = to_index(device)
    runtime.jax_device(idx)  # range check, as torch.cuda does
    return _device_memory(idx)


def reset_accumulated_memory_stats(device=None) -> None:
    """Like ``torch.cuda.reset_accumulated_memory_stats``: we keep no accumulated
    counters other than the peak, which is reset (``reset_peak_memory_stats``)."""
    reset_peak_memory_stats(device)


def ipc_collect() -> None:
    """``torch.cuda.ipc_collect``: frees memory kept for tensors shared with other
    processes.  ``tpu`` tensors are never shared between processes (they are pickled
    through the host), so there is nothing to collect; kept for API parity."""


# ---------------------------------------------------------------- utilization

_last_cpu_times: list = []


def _host_cpu_busy_percent() -> int:
    """Host CPU busy percentage since the previous call (since boot on the first call),
    from ``/proc/stat``; 0 where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])
    prev_idle, prev_total = _last_cpu_times or (0, 0)
    _last_cpu_times[:] = [idle, total]
    dt = total - prev_total
    if dt <= 0:
        return 0
    return int(round(100 * (dt - (idle - prev_idle)) / dt))


def utilization(device=None) -> int:
    """Percent of time the device was busy (``torch.cuda.utilization``), an int 0..100.

    CPU platform: the host CPUs' busy percentage since the previous call (the CPU PJRT
    device runs on them).  TPU/GPU: PJRT exposes no utilization counter, so 0 (use the
    vendor's tools, e.g. ``nvidia-smi`` or ``tpu-info``).

    Raises:
        RuntimeError: the device index is out of range.
    """
    runtime.jax_device(to_index(device))
    if runtime.platform() == "cpu":
        return max(0, min(100, _host_cpu_busy_percent()))
    return 0


# ------------------------------------------------------------ summary, snapshot


def _fmt(n: int) -> str:
    for unit in ("B  ", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:6.0f} {unit}" if unit == "B  " else f"{n:6.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A printable table of the device's memory, like ``torch.cuda.memory_summary``.

    Rows: bytes of live ``tpu`` tensors (current, peak), bytes the PJRT allocator holds
    (current, peak), the number of live storages, and the device's free / total memory
    (:func:`mem_get_info`).  ``abbreviated`` is accepted for compatibility (the table is
    already short).

    Raises:
        RuntimeError: the device index is out of range.
    """
    idx = to_index(device)
    free, total = mem_get_info(idx)
    stats = memory_stats(idx)
    n_live = sum(1 for s in _live_storages() if s.index == idx)
    width = 75
    line = "|" + "=" * (width - 2) + "|"
    sep = "|" + "-" * (width - 2) + "|"

    def row(name, cur, peak):
        return f"| {name:<33}| {cur:>16} | {peak:>16} |"

    platform = runtime.platform()
    lines = [
        line,
        f"| {'PyTorch tpu memory summary, device ID ' + str(idx) + ' (' + platform + ')':<{width - 4}} |",
        sep,
        row("Metric", "Cur Usage", "Peak Usage"),
        line,
        row("Allocated memory (tpu tensors)", _fmt(stats["allocated_bytes.all.current"]),
            _fmt(stats["allocated_bytes.all.peak"])),
        row("Reserved memory (PJRT)", _fmt(stats["reserved_bytes.all.current"]),
            _fmt(stats["reserved_bytes.all.peak"])),
        row("Live storages", str(n_live), ""),
        sep,
        row("Device memory free", _fmt(free), ""),
        row("Device memory total", _fmt(total), ""),
        line,
    ]
    if platform == "cpu":
        lines.insert(-1, f"| {'(CPU platform: device memory is host memory)':<{width - 4}} |")
    return "\n".join(lines) + "\n"


def _live_storages():
    """Every live ``StorageData`` (found through the garbage collector: this is a
    debugging query, kept off the allocation path)."""
    from torchtpu._tensor.storage import StorageData

    return [o for o in gc.get_objects() if type(o) is StorageData and o.counted]


def _run_pending() -> None:
    from torchtpu.eager import defer

    if defer.pending_ops():
        defer.flush("memory_snapshot")


def memory_snapshot() -> list[dict]:
    """Live ``tpu`` storages as ``torch.cuda.memory_snapshot`` segments (all devices).

    One segment per storage (PJRT allocates one buffer per array), with one
    ``active_allocated`` block; ``address`` is a stable id of the storage, not a device
    pointer.  The format is the one PyTorch's ``torch.cuda._memory_viz`` reads
    (``segsum``, ``segment_plot``).  In DEFER_AND_FUSE a pending segment runs first (a
    sync point, cause ``"memory_snapshot"``): recorded values hold no device buffer
    until then, and values that died before it never get one.
    """
    _run_pending()
    segs = []
    for s in _live_storages():
        addr = id(s)
        n = int(s.nbytes)
        segs.append({
            "device": s.index,
            "address": addr,
            "total_size": n,
            "allocated_size": n,
            "active_size": n,
            "requested_size": n,
            "stream": 0,
            "segment_type": "large" if n > 1 << 20 else "small",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": [{
                "address": addr,
                "size": n,
                "requested_size": n,
                "state": "active_allocated",
                "frames": [],
            }],
        })
    segs.sort(key=lambda d: (d["device"], d["address"]))
    return segs


def _snapshot(device=None) -> dict:
    """``torch.cuda.memory._snapshot``: ``{"segments": memory_snapshot(),
    "device_traces": [...]}``, one list of events per device, filled while
    :func:`_record_memory_history` is on (``alloc``, ``free_requested``, ``free_completed``,
    ``segment_alloc``, ``segment_free``, each with ``addr``, ``size``, ``stream``,
    ``time_us`` and, with ``stacks="python"``/``"all"``, ``frames``)."""
    _run_pending()
    n = max(runtime.device_count(), 1)
    traces = [list(_history["traces"].get(i, ())) for i in range(n)]
    segs = memory_snapshot()
    frames = _history["frames"]
    for seg in segs:
        f = frames.get(seg["address"])
        if f:
            seg["frames"] = seg["blocks"][0]["frames"] = f
    return {"segments": segs, "device_traces": traces}


# -------------------------------------------------------------- memory history

_history: dict = {"on": False, "stacks": False, "max_entries": 0, "traces": {}, "frames": {}}


def _frames() -> list[dict]:
    import traceback

    return [{"filename": f.filename, "line": f.lineno, "name": f.name}
            for f in reversed(traceback.extract_stack()[:-3])]


def _record(index: int, actions, addr: int, size: int) -> None:
    import time

    h = _history
    trace = h["traces"].setdefault(index, [])
    t = int(time.time() * 1e6)
    frames = h["frames"].get(addr, []) if h["stacks"] else []
    if actions[0] in ("segment_alloc",):
        if h["stacks"]:
            frames = h["frames"][addr] = _frames()
    for action in actions:
        trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                      "time_us": t, "frames": frames})
    if actions[-1] == "segment_free":
        h["frames"].pop(addr, None)
    if h["max_entries"] and len(trace) > h["max_entries"]:
        del trace[: len(trace) - h["max_entries"]]


def _record_memory_history(enabled="all", context="all", stacks="all",
                           max_entries: int = 0, device=None, **kwargs) -> None:
    """Record every ``tpu`` storage allocation and free, like
    ``torch.cuda.memory._record_memory_history``, for :func:`_snapshot` /
    :func:`_dump_snapshot` (readable by PyTorch's ``memory_viz`` and its web page).

    ``enabled=None`` stops recording (and clears the history), ``"state"`` or ``"all"``
    starts it; ``stacks="python"`` or ``"all"`` keeps each allocation's Python stack
    (``"cpp"`` records none here); ``max_entries`` > 0 keeps the newest events only.  Each
    storage is its own segment (PJRT allocates one buffer per array), so an allocation is
    recorded as ``segment_alloc`` + ``alloc`` and a free as ``free_requested`` +
    ``free_completed`` + ``segment_free``.  Costs nothing while off: the recording hooks
    are installed on the storage class only while it is on.

    Raises:
        ValueError: ``enabled`` is not None, "state" or "all".
    """
    from torchtpu._tensor.storage import StorageData

    if enabled not in (None, "state", "all", True, False):
        raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
    h = _history
    if not enabled:
        if h["on"]:
            StorageData.__init__, StorageData.resolve, StorageData.__del__ = h["orig"]
        h.update(on=False, traces={}, frames={})
        return
    h["stacks"] = stacks in ("python", "all") and enabled == "all"
    h["max_entries"] = int(max_entries or 0)
    if h["on"]:
        return
    orig_init, orig_resolve, orig_del = h["orig"] = (
        StorageData.__init__, StorageData.resolve, StorageData.__del__)
    alloc = ("segment_alloc", "alloc")
    free = ("free_requested", "free_completed", "segment_free")

    def __init__(self, arr, shape, dtype, index, nbytes):
        orig_init(self, arr, shape, dtype, index, nbytes)
        if self.counted:
            _record(index, alloc, id(self), nbytes)

    def resolve(self, value):
        was = self.counted
        orig_resolve(self, value)
        if not was and self.counted:
            _record(self.index, alloc, id(self), self.nbytes)

    def __del__(self):
        try:
            if self.counted and h["on"]:
                _record(self.index, free, id(self), self.nbytes)
        except Exception:  # interpreter shutdown
            pass
        orig_del(self)

    StorageData.__init__, StorageData.resolve, StorageData.__del__ = __init__, resolve, __del__
    h["on"] = True


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickle :func:`_snapshot` to ``filename`` (readable by PyTorch's memory_viz)."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)
