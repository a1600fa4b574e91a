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

JAX process ``i`` is global rank ``i`` of the default group; each process has one local
PJRT device, ``tpu:0``.  On the CPU platform JAX's collectives run over gloo
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

    if storage.ALLOCATOR.num_allocs == 0:
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
    # JAX's defaults (100 s heartbeat, 300 s shutdown barrier) would keep a survivor of a
    # dead rank alive, then abort it, minutes after the group's own timeout: use the
    # group's timeout (at least 10 s, so a busy process's heartbeat thread is not missed).
    beat = min(max(10, secs), 100)
    jax.distributed.initialize(
        addr, num_processes=world_size, process_id=rank, initialization_timeout=secs,
        heartbeat_timeout_seconds=beat, shutdown_timeout_seconds=min(max(10, secs), 300),
    )
    _state.update(world_size=world_size, rank=rank, coordinator=addr)


def process_devices() -> dict:
    """``{JAX process index: its PJRT device}`` for the ``tpu`` platform (one each)."""
    out = {}
    for d in runtime.jax().devices(runtime.platform()):
        out.setdefault(d.process_index, d)
    return out
