"""The one timing rule of every ``torchtpu.bench`` table.

* **Sync rule**: a timed stretch starts after a sync and ends with one (``sync(out)``
  waits for the last step's result: ``.cpu()`` / ``item()`` for torch, ``
  block_until_ready`` for JAX), so queued device work is inside the stretch that queued it.
* **Warm-up until nothing new is built**: steps run until the counters of things built
  lazily -- every XLA executable the process compiles or loads (per-op, their donating
  variants, shape buckets, fused segments, compiled graphs: ``metrics()["xla"]``),
  executable and segment cache misses, signature-cache loads -- have not moved for
  ``stable`` consecutive steps.  A fixed warm-up count left the donating variants of hot
  in-place signatures (built from a signature's 5th call) inside the timed steps.
* **Rounds**: ``rounds`` stretches of ``steps`` steps; the table gives the median step
  time and the min..max over rounds, and how many executables were built while timing
  (0 when the warm-up did its job).
* **Load**: :func:`load_line` goes beside every table.
* **Memory where it lives**: :func:`memory_probe` -- PJRT's own statistics on TPU/GPU
  (``bytes_in_use`` / ``peak_bytes_in_use``); on the CPU platform, where device memory is
  the process's memory, the peak resident set size (``VmHWM``, reset through
  ``/proc/self/clear_refs``) and the bytes of JAX's live arrays.
"""

from __future__ import annotations

import os
import statistics
import time


def build_counters() -> tuple:
    """Counters that move while executables are still being built (torchtpu's
    ``metrics()``): all XLA executables compiled or loaded, per-op and segment cache
    misses, signature-cache loads, compiled-graph executables."""
    import torchtpu

    m = torchtpu.metrics()
    x = m["xla"]
    return (x["compiled"] + x["loaded"], m["cache_misses"], m["segment_cache_misses"],
            m["signature_cache"]["hits"], m["compile"]["executables"])


def warm_up(step, sync, *, min_steps: int = 3, steps: int = 10, stable: int = 2,
            max_rounds: int = 30, counters=build_counters) -> dict:
    """Warm ``step`` up the way it will be timed.

    ``step()`` runs ``min_steps`` times each synced with ``sync`` (at least two past the
    call from which a hot in-place signature donates, :func:`min_warmup_steps`), then in
    rounds of ``steps`` steps ended by one ``sync`` -- the shape of :func:`time_rounds`,
    since DEFER_AND_FUSE cuts its segments where the host syncs -- until ``counters()``
    has not moved for ``stable`` consecutive rounds (at most ``max_rounds`` rounds).

    Returns ``{"steps": n, "settled": bool, "first_call_s": seconds of the first step,
    "values": [sync value of each of the first min_steps steps]}``; ``settled`` False
    means the counters still moved (the caller reports it: the timed numbers then include
    builds)."""
    min_steps = min_warmup_steps(min_steps)
    t0 = time.perf_counter()
    values = [sync(step())]
    first = time.perf_counter() - t0
    for _ in range(min_steps - 1):
        values.append(sync(step()))
    n, quiet, rounds, prev = min_steps, 0, 0, counters()
    while rounds < max_rounds and quiet < stable:
        out = None
        for _ in range(steps):
            out = step()
        sync(out)
        n += steps
        rounds += 1
        cur = counters()
        quiet = quiet + 1 if cur == prev else 0
        prev = cur
    return {"steps": n, "settled": quiet >= stable, "first_call_s": first,
            "values": values}


def min_warmup_steps(requested: int) -> int:
    """The fewest warm-up steps :func:`warm_up` runs for a request of ``requested``:
    at least two past the call from which a hot in-place signature donates (its donating
    variant is built then, ``executables.DONATE_AFTER``)."""
    from torchtpu.eager import executables

    return max(requested, executables.DONATE_AFTER + 2)


def time_rounds(step, sync, *, rounds: int = 5, steps: int = 10,
                counters=build_counters) -> dict:
    """``rounds`` timed stretches of ``steps`` steps, each ended by ``sync`` of the last
    step's result.  Returns ``{"ms_median", "ms_min", "ms_max"}`` (per step, over rounds),
    ``"rounds_ms"`` (each round's per-step ms), ``"built_while_timing"`` (change of
    ``counters()`` during the rounds, summed: 0 when warm) and ``"last"`` (the last
    ``sync`` value)."""
    c0 = counters()
    per = []
    last = None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = None
        for _ in range(steps):
            out = step()
        last = sync(out)
        per.append((time.perf_counter() - t0) / steps * 1e3)
    c1 = counters()
    return {"ms_median": statistics.median(per), "ms_min": min(per), "ms_max": max(per),
            "rounds_ms": per, "built_while_timing": sum(b - a for a, b in zip(c0, c1)),
            "last": last}


def measure(step, sync, *, rounds: int = 5, steps: int = 10, counters=build_counters,
            **warm) -> dict:
    """:func:`warm_up` then :func:`time_rounds` (same ``steps`` per round); the two
    results merged (``warmup`` holds the warm-up's)."""
    w = warm_up(step, sync, steps=steps, counters=counters, **warm)
    r = time_rounds(step, sync, rounds=rounds, steps=steps, counters=counters)
    r["warmup"] = w
    return r


def load_line() -> str:
    """``"load average 1.23 1.10 0.95 on 2 cores"`` (``os.getloadavg``), for every table."""
    a, b, c = os.getloadavg()
    return f"load average {a:.2f} {b:.2f} {c:.2f} on {os.cpu_count()} cores"


def fmt_ms(r: dict) -> str:
    """``"1.234 (1.200..1.300)"``: median and min..max ms per step of :func:`time_rounds`."""
    return f"{r['ms_median']:.3f} ({r['ms_min']:.3f}..{r['ms_max']:.3f})"


# ------------------------------------------------------------------ memory


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class memory_probe:
    """Peak memory of a block, measured where the memory lives.

    ``with memory_probe() as mem: ...`` then ``mem.result``: a dict with

    * ``"where"``: ``"pjrt"`` (TPU/GPU: the device's ``memory_stats()``) or ``"host"``
      (the CPU platform, or a device without statistics);
    * ``"peak_bytes"``: PJRT's ``peak_bytes_in_use`` (its peak is process-wide: not reset
      by the probe, so read it in a fresh process for one workload) or, on the host, the
      growth of the peak resident set (``VmHWM`` after the block minus ``VmRSS`` read on
      entry just after the high-water mark is reset through ``/proc/self/clear_refs``, so
      never negative; None where that is not possible);
    * ``"jax_live_bytes"``: bytes of JAX's live arrays at the end of the block
      (``jax.live_arrays()``);
    * ``"tensor_bytes_peak"``: torchtpu's count of bytes held by live tpu tensor storages
      (``torch.tpu.max_memory_allocated``: values a DEFER_AND_FUSE segment never
      materialized and XLA's temporaries are not in it).
    """

    def __enter__(self):
        import jax
        import torch

        from torchtpu._device import runtime

        self._dev = runtime.jax_device(0)
        self._stats = self._dev.memory_stats() if hasattr(self._dev, "memory_stats") else None
        self._reset = False
        if self._stats is None:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # resets VmHWM to the current RSS
                self._reset = True
            except OSError:
                pass
        # read after the reset: the high-water mark is then at least this RSS (read
        # before it, memory other threads freed in between made the peak negative)
        self._rss0 = _proc_status_kib("VmRSS")
        torch.tpu.reset_peak_memory_stats()
        self._jax = jax
        self.result = None
        return self

    def __exit__(self, *exc):
        import torch

        res = {"tensor_bytes_peak": torch.tpu.max_memory_allocated(),
               "jax_live_bytes": sum(a.nbytes for a in self._jax.live_arrays())}
        stats = self._dev.memory_stats() if self._stats is not None else None
        if stats:
            res.update(where="pjrt", peak_bytes=stats.get("peak_bytes_in_use"))
        else:
            hwm = _proc_status_kib("VmHWM")
            res.update(where="host",
                       peak_bytes=(hwm - self._rss0) * 1024
                       if self._reset and hwm is not None and self._rss0 is not None
                       else None)
        self.result = res
        return False
