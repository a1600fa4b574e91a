"""``torch.tpu.memory``: memory queries shaped like ``torch.cuda.memory``.

Where the numbers come from (all in bytes):

* bytes held by live ``tpu`` tensors (``memory_allocated``, ``max_memory_allocated``): our
  own count of live ``tpu`` storages (:data:`torchtpu._tensor.storage.ALLOCATOR`), the
  same on every platform;
* bytes the device's allocator holds (``memory_reserved``, ``max_memory_reserved``): on
  TPU and GPU the PJRT device's ``memory_stats()`` (:func:`memory_reserved` says which
  keys); the CPU PJRT client keeps no pool and reports no ``memory_stats()``: each buffer
  is a host allocation freed with its array, so there the reserved bytes *are* the live
  ``tpu`` tensors' bytes, and are labelled so;
* device capacity and free memory (``mem_get_info``, ``get_device_properties().total_memory``):
  the PJRT device's ``memory_stats()`` (``bytes_limit`` / ``bytes_in_use``) on TPU and GPU;
  the CPU PJRT platform reports none, and its device memory *is* the host's memory, so there
  the host's ``MemTotal`` / ``MemAvailable`` (``/proc/meminfo``; ``psutil`` or ``sysconf``
  elsewhere) are returned, as ``torch.cuda`` does for integrated GPUs sharing host RAM;
* ``utilization``: see :func:`utilization` (host CPU busy percent on the CPU platform,
  NVML on GPU, not available on TPU).

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
    "empty_cache", "empty_host_cache", "host_memory_info", "ipc_collect", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved",
    "memory_snapshot", "memory_stats", "memory_summary", "reset_accumulated_memory_stats",
    "reset_max_memory_allocated", "reset_peak_memory_stats", "utilization",
    "_record_memory_history", "_snapshot", "_dump_snapshot",
]


# ------------------------------------------------------ bytes held, PJRT stats


def _pjrt_memory_stats(index) -> dict:
    """The PJRT device's ``memory_stats()`` (bytes), ``{}`` where the platform reports
    none (the CPU client returns None)."""
    try:
        return runtime.jax_device(index).memory_stats() or {}
    except Exception:
        return {}


def _stat(stats: dict, key: str):
    """``stats[key]`` as an int, or None where PJRT did not set it (absent, or JAX's -1
    for an unset optional field)."""
    v = stats.get(key)
    if v is None:
        return None
    v = int(v)
    return v if v >= 0 else None


def memory_allocated(device=None) -> int:
    """Bytes held by live ``tpu`` storages on ``device`` (``torch.cuda.memory_allocated``):
    our own count, on every platform (pending first calls are waited for first)."""
    from torchtpu._tensor.storage import ALLOCATOR, settle_all

    settle_all()
    return ALLOCATOR.allocated.get(to_index(device), 0)


def max_memory_allocated(device=None) -> int:
    """Peak of :func:`memory_allocated` since start or the last reset (bytes)."""
    from torchtpu._tensor.storage import ALLOCATOR, settle_all

    settle_all()
    return ALLOCATOR.peak.get(to_index(device), 0)


def _reserved(index: int) -> tuple[int, int, str]:
    """(current, peak, source) of the bytes the device's allocator holds; ``source`` names
    where the two numbers come from (the label of :func:`memory_summary`)."""
    stats = _pjrt_memory_stats(index)
    pool = _stat(stats, "pool_bytes")
    if pool is not None:
        peak = _stat(stats, "peak_pool_bytes")
        return pool, pool if peak is None else peak, "PJRT pool_bytes"
    used = _stat(stats, "bytes_in_use")
    if used is not None:
        res = _stat(stats, "bytes_reserved") or 0
        peak_used = _stat(stats, "peak_bytes_in_use")
        peak_res = _stat(stats, "peak_bytes_reserved")
        peak = (used if peak_used is None else peak_used) + (res if peak_res is None else peak_res)
        return used + res, peak, "PJRT in use + reserved"
    plat = runtime.platform()
    if plat == "cpu":
        return memory_allocated(index), max_memory_allocated(index), "= live tpu tensors"
    raise NotImplementedError(
        f"torch.tpu.memory_reserved is not available on the {plat} platform: its PJRT "
        f"device reports no memory_stats()")


def memory_reserved(device=None) -> int:
    """Bytes the device's allocator holds (``torch.cuda.memory_reserved``).

    TPU/GPU: from the PJRT device's ``memory_stats()``: ``pool_bytes`` where the allocator
    keeps a pool (GPU's BFC allocator: what it took from the device, used or not), else
    ``bytes_in_use + bytes_reserved`` (TPU: buffers in use plus the memory the runtime
    reserved for programs).  CPU platform: the CPU PJRT client keeps no pool and reports
    no ``memory_stats()`` (a buffer is a host allocation freed with its array), so the
    bytes of live ``tpu`` tensors, :func:`memory_allocated`.

    Raises:
        NotImplementedError: a TPU/GPU device whose PJRT plugin reports no
            ``memory_stats()``.
        RuntimeError: the device index is out of range.
    """
    idx = to_index(device)
    runtime.jax_device(idx)  # range check, as torch.cuda does
    return _reserved(idx)[0]


def max_memory_reserved(device=None) -> int:
    """Peak of :func:`memory_reserved` (bytes).

    TPU/GPU: PJRT's ``peak_pool_bytes``, else ``peak_bytes_in_use + peak_bytes_reserved``
    (an upper bound when the runtime reserved memory: the two peaks need not have been at
    the same moment); PJRT keeps these since the process started, so
    :func:`reset_peak_memory_stats` does not reset them.  CPU platform:
    :func:`max_memory_allocated`.

    Raises:
        NotImplementedError: a TPU/GPU device whose PJRT plugin reports no
            ``memory_stats()``.
        RuntimeError: the device index is out of range.
    """
    idx = to_index(device)
    runtime.jax_device(idx)
    return _reserved(idx)[1]


def reset_peak_memory_stats(device=None) -> None:
    """Reset :func:`max_memory_allocated` to the current :func:`memory_allocated`.  PJRT's
    own peaks (:func:`max_memory_reserved` on TPU/GPU) cannot be reset."""
    from torchtpu._tensor.storage import ALLOCATOR, settle_all

    settle_all()
    idx = to_index(device)
    ALLOCATOR.peak[idx] = ALLOCATOR.allocated.get(idx, 0)


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_stats(device=None) -> dict:
    """Allocator statistics with ``torch.cuda.memory_stats`` key names (bytes):
    ``allocated_bytes.all.*`` (:func:`memory_allocated` / its peak),
    ``reserved_bytes.all.*`` (:func:`memory_reserved` / its peak; absent where the
    platform reports none), and every PJRT ``memory_stats()`` figure as ``pjrt.<key>``."""
    idx = to_index(device)
    d = {
        "allocated_bytes.all.current": memory_allocated(idx),
        "allocated_bytes.all.peak": max_memory_allocated(idx),
    }
    try:
        d["reserved_bytes.all.current"], d["reserved_bytes.all.peak"], _ = _reserved(idx)
    except NotImplementedError:
        pass
    for k, v in _pjrt_memory_stats(idx).items():
        d[f"pjrt.{k}"] = v
    return d


def empty_cache() -> None:
    """``torch.cuda.empty_cache()`` for tpu: releases the memory an allocator caches for
    reuse.  tpu has no caching allocator (PJRT frees a buffer when the last tensor on it
    dies), so there is nothing to release and this returns at once.  It runs no
    ``gc.collect()`` (CUDA's does not either): vLLM calls it at shutdown and between
    phases, where a full collection of a serving process's heap took 0.6 s a call."""


def empty_host_cache() -> None:
    """``torch.accelerator.empty_host_cache()`` for tpu: nothing to release (a pinned
    tensor's memory is ordinary host memory, freed with the tensor; there is no caching
    host allocator).  PyTorch's own call reached no host allocator for tpu and crashed
    the process."""


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
_PROC_STAT = "/proc/stat"


def _host_cpu_busy_percent() -> int:
    """Percent of the host CPUs' time spent busy (not idle, not waiting for I/O) since
    the previous call (since boot on the first call), all processes together.

    Linux: the aggregate ``cpu`` line of ``/proc/stat`` (busy = total jiffies minus
    ``idle`` and ``iowait``); elsewhere ``psutil.cpu_percent()`` (also since its previous
    call).

    Raises:
        NotImplementedError: neither ``/proc/stat`` nor ``psutil`` is available.
    """
    try:
        with open(_PROC_STAT) as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError, IndexError):
        try:
            import psutil
        except ImportError:
            raise NotImplementedError(
                "torch.tpu.utilization is not available on the cpu platform here: it "
                "reads the host's CPU time from /proc/stat or psutil, and neither is "
                "available") from None
        return int(round(psutil.cpu_percent(interval=None)))
    prev_idle, prev_total = _last_cpu_times or (0, 0)
    _last_cpu_times[:] = [idle, total]
    dt = total - prev_total
    if dt <= 0:  # two calls within one clock tick: nothing was measured in between
        return 0
    return int(round(100 * (dt - (idle - prev_idle)) / dt))


def _nvml_handle(nvml, device):
    """The NVML handle of a PJRT GPU device: its CUDA ordinal (``local_hardware_id``)
    mapped through ``CUDA_VISIBLE_DEVICES`` as CUDA maps it (indices or UUIDs)."""
    ordinal = getattr(device, "local_hardware_id", None)
    if ordinal is None:
        ordinal = device.id
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        entry = entries[ordinal]
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    return nvml.nvmlDeviceGetHandleByIndex(ordinal)


def _gpu_utilization(device) -> int:
    """NVML's GPU utilization (percent of the last sample period, 1/6 s to 1 s depending
    on the GPU, during which a kernel ran), read through ``pynvml`` as ``torch.cuda``
    does."""
    try:
        import pynvml
    except ImportError:
        raise NotImplementedError(
            "torch.tpu.utilization is not available on the gpu platform: PJRT reports no "
            "utilization, and NVML is read through pynvml, which is not installed "
            "(pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001  (no NVIDIA driver: a ROCm GPU...)
        raise NotImplementedError(
            f"torch.tpu.utilization is not available on the gpu platform: PJRT reports no "
            f"utilization and NVML could not start ({e})") from None
    return int(pynvml.nvmlDeviceGetUtilizationRates(_nvml_handle(pynvml, device)).gpu)


def utilization(device=None) -> int:
    """Percent of time the device was busy (``torch.cuda.utilization``), an int 0..100.

    * GPU: NVML's utilization of the GPU behind the PJRT device (through ``pynvml``), the
      number ``torch.cuda.utilization`` reports.
    * CPU platform: the host CPUs' busy percentage since the previous call (since boot on
      the first call), all processes together: the CPU PJRT device runs on them (see
      :func:`_host_cpu_busy_percent`).
    * TPU (and any other platform): not available.

    Raises:
        NotImplementedError: TPU or another platform without a utilization counter
            (PJRT reports none: use the vendor's tools, e.g. ``tpu-info``); GPU without
            ``pynvml`` or NVML; the CPU platform without ``/proc/stat`` or ``psutil``.
        RuntimeError: the device index is out of range.
    """
    d = runtime.jax_device(to_index(device))
    plat = runtime.platform()
    if plat == "cpu":
        return max(0, min(100, _host_cpu_busy_percent()))
    if plat == "gpu":
        return _gpu_utilization(d)
    raise NotImplementedError(
        f"torch.tpu.utilization is not available on the {plat} platform: PJRT reports no "
        f"utilization")


# ------------------------------------------------------------ summary, snapshot


def _fmt(n: int) -> str:
    for unit in ("B  ", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:6.0f} {unit}" if unit == "B  " else f"{n:6.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A printable table of the device's memory, like ``torch.cuda.memory_summary``.

    Rows: bytes of live ``tpu`` tensors (:func:`memory_allocated`, current and peak), bytes
    the device's allocator holds (:func:`memory_reserved`, labelled with where they come
    from: PJRT's ``pool_bytes`` or ``in use + reserved`` on TPU/GPU, ``= live tpu
    tensors`` on the CPU platform, ``n/a`` where the platform reports none), the number of
    live storages, and the device's free / total memory (:func:`mem_get_info`).
    ``abbreviated`` is accepted for compatibility (the table is already short).

    Raises:
        RuntimeError: the device index is out of range.
    """
    idx = to_index(device)
    free, total = mem_get_info(idx)
    stats = memory_stats(idx)
    try:
        res, res_peak, res_source = _reserved(idx)
        res, res_peak = _fmt(res), _fmt(res_peak)
    except NotImplementedError:
        res, res_peak, res_source = "n/a", "n/a", "not reported"
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
        row("Allocated memory (live tensors)", _fmt(stats["allocated_bytes.all.current"]),
            _fmt(stats["allocated_bytes.all.peak"])),
        row(f"Reserved ({res_source})", res, res_peak),
        row("Live storages", str(n_live), ""),
        sep,
        row("Device memory free", _fmt(free), ""),
        row("Device memory total", _fmt(total), ""),
        line,
    ]
    if platform == "cpu":
        lines.insert(-1, f"| {'(CPU platform: device memory is host memory)':<{width - 4}} |")
        if res_source.startswith("="):
            note = "(no PJRT allocator pool: reserved = live tpu tensors)"
            lines.insert(-1, f"| {note:<{width - 4}} |")
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
