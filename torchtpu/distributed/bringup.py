"""Bringing up JAX's multi-process runtime (``jax.distributed``) for ``tpu_dist``.

Every collective on tpu tensors is one XLA computation over the PJRT devices of the
group's processes, so all processes must share one JAX runtime: ``jax.distributed.
initialize(coordinator, num_processes=world_size, process_id=rank)``.  JAX allows that
only *before* its backend is started in the process (the first ``jax.devices()``), so:

* ``import torch`` (which autoloads torchtpu), ``torch.device("tpu")`` and
  ``torch.accelerator.current_accelerator()`` never start the JAX backend;
* ``init_process_group`` of the default group calls :func:`ensure` with the group's
  rendezvous store: rank 0 picks a free port for JAX's coordination service, publishes
  ``host:port`` in the store, every rank reads it and joins.  The host is the TCPStore's
  host (rank 0's machine under ``env://`` and ``torchrun``), else ``MASTER_ADDR``, else
  ``127.0.0.1``.
* ``dist.init_process_group()`` itself asks ``torch._C._get_accelerator()``, whose
  availability hook counts PJRT devices and so starts the backend, as does a user's
  ``torch.tpu.is_available()`` / ``device_count()``.  While no tpu tensor has been
  allocated yet, :func:`ensure` drops that backend (``jax.extend.backend.
  clear_backends()``) and the runtime's cached device list, then joins.
* If a tpu tensor already exists (its buffer lives on the old backend) and the world
  has more than one process, :func:`ensure` raises ``RuntimeError`` saying so.

JAX process ``i`` is global rank ``i`` of the default group.  Each process's collectives
run on one of its local PJRT devices: ``init_process_group(device_id=tpu:k)``'s, else
the one ``LOCAL_RANK`` picks when the process sees several (one process per chip on a
TPU host), else the current one; it becomes the current device (:func:`select_device`).  On the CPU platform JAX's collectives run over gloo
(``jax_cpu_collectives_implementation``).
"""

from __future__ import annotations

import datetime
import os
import socket

from torchtpu._device import runtime

_KEY = "tpu_dist/jax_coordinator"

# (world_size, rank) of the running jax.distributed runtime, once brought up by us
_state: dict = {}


def _backend_started() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def _distributed_client():
    from jax._src import distributed

    return distributed.global_state.client


def _store_host(store) -> str | None:
    while store is not None:
        host = getattr(store, "host", None)
        if host:
            return host
        store = getattr(store, "underlying_store", None)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def ensure(store, rank: int, world_size: int, timeout: datetime.timedelta) -> None:
    """Make sure ``jax.distributed`` spans ``world_size`` processes with this one as
    ``rank`` (a no-op when it already does, or when ``world_size == 1``).

    Args:
        store: the default group's rendezvous store (``torch.distributed.Store``).
        rank, world_size: this process's global rank and the number of processes.
        timeout: the process group's timeout, used for the coordinator exchange and
            JAX's initialization.

    Raises:
        RuntimeError: the JAX backend was already started in this process without
            ``jax.distributed`` (so its devices cannot be shared), or JAX's runtime spans
            a different number of processes / another rank numbering.
    """
    jax = runtime.jax()
    if _distributed_client() is not None:
        n, me = jax.process_count(), jax.process_index()
        if (n, me) != (world_size, rank):
            raise RuntimeError(
                f"tpu_dist: JAX's multi-process runtime already spans {n} processes with this "
                f"one as process {me}, but the process group has world_size={world_size}, "
                f"rank={rank}; tpu_dist maps global rank i to JAX process i"
            )
        return
    if world_size == 1:
        return
    if _backend_started():
        _restart_backend_or_raise(world_size)
    _initialize(jax, store, rank, world_size, timeout)


def _restart_backend_or_raise(world_size: int) -> None:
    """Forget a JAX backend that only answered device queries (no tpu tensor yet)."""
    from torchtpu._tensor import storage
    from torchtpu.eager import defer

    # DEFER_AND_FUSE: tensors recorded but not run yet hold no device buffer, but they
    # belong to this runtime all the same
    if storage.ALLOCATOR.num_allocs == 0 and not defer.pending_ops():
        import jax.extend.backend

        jax.extend.backend.clear_backends()
        runtime.platform.cache_clear()
        runtime.devices.cache_clear()
        return
    raise RuntimeError(
        "tpu_dist: tpu tensors were created in this process before init_process_group, so "
        f"its JAX runtime cannot join the {world_size}-process runtime any more; call "
        "dist.init_process_group() before creating tpu tensors"
    )


def _set_collective_timeout(secs: int) -> None:
    """Make XLA's CPU collectives give up after the group's ``timeout`` (a rank that
    never calls the collective: the others' program fails after it, and the call raises
    ``RuntimeError``), unless ``XLA_FLAGS`` already sets it.  XLA reads its flags once,
    at its first compilation in the process, which comes after the bring-up (no tpu
    tensor exists before it)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_collective_timeout_seconds" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_collective_timeout_seconds={secs}".strip()


def _initialize(jax, store, rank: int, world_size: int, timeout) -> None:
    if rank == 0:
        host = _store_host(store) or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        addr = f"{host}:{_free_port()}"
        store.set(_KEY, addr)
    else:
        store.wait([_KEY], timeout)
        addr = store.get(_KEY).decode()
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    secs = max(1, int(timeout.total_seconds()))
    _set_collective_timeout(secs)
    # JAX's default heartbeat timeout (100 s) would keep a survivor of a dead rank alive,
    # then abort it, minutes after the group's own timeout: use the group's timeout (at
    # least 10 s, so a busy process's heartbeat thread is not missed).  The shutdown
    # barrier (at exit every process waits for all the others) keeps at least JAX's
    # default, 300 s: when it times out JAX aborts *every* process, so with the group's
    # timeout a rank that finished early aborted the others while they still worked.  A
    # dead rank does not hold it up: its heartbeat timeout ends the barrier.
    beat = min(max(10, secs), 100)
    if "JAX_ENABLE_PREEMPTION_SERVICE" not in os.environ:
        # JAX's preemption service catches SIGTERM (to let a job reach a sync point before
        # a preemption): a rank then ignored ``kill`` and torchrun's SIGTERM to the
        # survivors of a failed rank.  PyTorch processes end on SIGTERM.
        jax.config.update("jax_enable_preemption_service", False)
    jax.distributed.initialize(
        addr, num_processes=world_size, process_id=rank, initialization_timeout=secs,
        heartbeat_timeout_seconds=beat, shutdown_timeout_seconds=max(300, secs),
    )
    _state.update(world_size=world_size, rank=rank, coordinator=addr)


def local_device_index(count: int, env=None) -> int | None:
    """The local ``tpu`` device index ``LOCAL_RANK`` picks on a host with ``count``
    devices: ``LOCAL_RANK`` itself when the process sees several devices (one process
    per chip, as ``torchrun --nproc-per-node`` starts them), 0 when it sees one (JAX
    restricted to the process's own chip, or the CPU platform), None when
    ``LOCAL_RANK`` is not set.

    Raises:
        RuntimeError: ``LOCAL_RANK`` is not a number, or names a device the host does
            not have.
    """
    env = os.environ if env is None else env
    raw = env.get("LOCAL_RANK")
    if raw is None or raw == "":
        return None
    try:
        k = int(raw)
    except ValueError:
        raise RuntimeError(f"tpu_dist: LOCAL_RANK={raw!r} is not a number") from None
    if count <= 1:
        return 0
    if not 0 <= k < count:
        raise RuntimeError(
            f"tpu_dist: LOCAL_RANK={k} but this process sees {count} tpu devices "
            f"(tpu:0 .. tpu:{count - 1}); start at most {count} processes per host")
    return k


def select_device(device=None) -> int:
    """Make this process's collective device current and return its index: ``device``
    (``init_process_group(device_id=...)``) if given, else the one ``LOCAL_RANK`` picks
    (:func:`local_device_index`), else the current device (``torch.tpu.set_device``),
    as ``torch.cuda.set_device(local_rank)`` does for nccl.

    Raises:
        RuntimeError: the index is out of range (CUDA's wording).
    """
    from torchtpu._device import state

    if device is not None and getattr(device, "index", None) is not None:
        index = device.index
    else:
        index = local_device_index(runtime.device_count())
        if index is None:
            index = state.current_device
    runtime.jax_device(index)  # raises when out of range
    state.set_current_device(index)
    return index


def share_devices(store, rank: int, world_size: int, index: int, timeout) -> bool:
    """Publish this process's collective device (``tpu:index``) in the default group's
    store and read every rank's, for :func:`process_devices`.  Returns True when the
    ranks' devices changed (programs built for the old ones must then be dropped)."""
    dev = runtime.jax_device(index)
    if world_size == 1:
        mapping = {runtime.jax().process_index(): dev.id}
    else:
        store.set(f"tpu_dist/device/{rank}", str(dev.id))
        keys = [f"tpu_dist/device/{r}" for r in range(world_size)]
        store.wait(keys, timeout)
        mapping = {r: int(store.get(k)) for r, k in enumerate(keys)}
    if _state.get("devices") == mapping:
        return False
    _state["devices"] = mapping
    return True


def process_devices() -> dict:
    """``{JAX process index: the PJRT device its collectives use}`` for the ``tpu``
    platform: the devices the ranks chose at ``init_process_group``
    (:func:`share_devices`), else each process's first device."""
    devs = runtime.jax().devices(runtime.platform())
    chosen = _state.get("devices")
    if chosen:
        by_id = {d.id: d for d in devs}
        return {p: by_id[i] for p, i in chosen.items()}
    out = {}
    for d in devs:
        out.setdefault(d.process_index, d)
    return out
