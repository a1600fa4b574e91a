"""Asynchronous first calls: a new signature's XLA compile runs on a worker thread while
the program goes on dispatching ops.

Why: a program's first step (a model's first forward, the first ``generate()``, a
variable-length batch) meets dozens of new signatures in a row, and each one's XLA
compile (~30 ms on XLA:CPU for a per-op program, more for large ones) used to stop the
Python thread until it was done.  The compiles are independent of each other: an op's
executable needs its inputs' shapes and dtypes, not their values.  So STRICT mode traces
and lowers a new signature on the calling thread (errors in the lowering are raised
there, at the op, as before), and hands the XLA compile and the first run to a worker
thread; the op returns at once with results whose values are *pending*
(:class:`torchtpu._tensor.storage.Lazy` with ``node`` :data:`storage.ASYNC`).  The next
ops that are first calls too take pending values as inputs: their own compiles start
meanwhile, and their runs wait on the worker for the values they read.  Compiles overlap
each other (several workers) and the Python thread's tracing; measured on 2 CPU cores,
40 per-op compiles took 24 ms each on two threads against 36-41 ms one after the other.

What waits: anything that needs a pending value's array -- a host read (``.cpu()``,
``.item()``, printing), an op that is not an ordinary per-op call (shape buckets, growth,
collectives, ``torch.compile`` graphs, DeferAndFuse), a call of an executable already
built (a cache hit runs on the calling thread, so it waits for its inputs, and a hit of a
signature still compiling waits for that compile; with ``TORCHTPU_ASYNC_QUEUE_LIMIT=N``
up to N such calls in a row queue on a worker instead, see :data:`QUEUE_LIMIT`),
``torch.tpu.synchronize()``, the memory statistics and switching the eager mode.  Waiting
is not a host sync (no device-to-host copy): it is counted in ``metrics()["async_compile"]``
(``waits``, ``wait_seconds``).

Order and safety: jobs start in submission order (a FIFO queue), and a job only reads
values made by jobs submitted before it, so a job never waits on one that has not
started: no deadlock, whatever the number of workers.  Values are immutable JAX arrays; a
storage written meanwhile holds a new pending value, and an in-place op's donation
(``executables.call_donating``) skips arrays a pending job still holds (its reference
count says so).  A job runs its executable to completion (``block_until_ready``) before
it counts as done, so a finished job's results are on the device.  A compile or run
error is raised where the value is first needed, naming the op.

When it is used: STRICT mode's per-op executables (``executables.first_call``), on every
platform, unless ``TORCHTPU_COMPILE_WORKERS=0`` (the default: one worker per CPU core,
at least 2 and at most 4) or :func:`set_workers` says otherwise.  Not in DEBUG (each op is
checked as it runs) or DeferAndFuse (segments), nor with the opt-in quick compile tier
(``eager.tiers``), which compiles on the calling thread.

Counters (``torchtpu.metrics()["async_compile"]``): ``jobs`` (first calls compiled on a
worker), ``queued_runs`` (calls run on a worker behind a pending value or compile),
``waits`` / ``wait_seconds`` (the calling thread waited for a pending value), ``errors``.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from torchtpu import _metrics
from torchtpu._device import persistent_cache, runtime
from torchtpu._tensor import storage as _st
from torchtpu.eager import tiers as _tiers

M = _metrics.METRICS
Lazy = _st.Lazy
ASYNC = _st.ASYNC


def _default_workers() -> int:
    v = os.environ.get("TORCHTPU_COMPILE_WORKERS")
    if v is not None and v.strip() != "":
        return max(0, int(v))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (no sched_getaffinity: macOS)
        cores = os.cpu_count() or 2
    return min(4, max(2, cores))


_workers = _default_workers()
_pool = None
_lock = threading.Lock()  # counters updated on worker threads
_jobs = collections.deque()  # jobs not known to be finished, in submission order
_compiling = [0]  # first calls whose compile has not finished
_queued = [0]  # runs queued since the last first call
# Runs queued behind compiles since the last first call, past which a call waits for
# its inputs instead (``TORCHTPU_ASYNC_QUEUE_LIMIT``).  Default 0: a call of a compiled
# executable never queues, it waits for its pending inputs.  Measured on 2 cores
# (``bench shapes --varlen``, epoch 1 / epoch 2 with 8 new signatures; ``bench
# generate`` first call): limit 0: 23.9 s / 0.56 s, 4.11 s; limit 16: 22.2 s / 1.03 s,
# 4.02 s; no async: 33.1 s / 0.54 s, 5.37 s.  Queued runs leave a warm loop on the
# general per-op path and a worker thread (no hot path, no donation) for longer than
# they save.
QUEUE_LIMIT = int(os.environ.get("TORCHTPU_ASYNC_QUEUE_LIMIT", "0"))
_jobs_lock = threading.Lock()


def workers() -> int:
    """How many worker threads compile first calls (0: asynchronous first calls off)."""
    return _workers


def set_workers(n: int) -> None:
    """Use ``n`` worker threads for first calls from now on (0 switches asynchronous first
    calls off: every compile runs on the calling thread).  Waits for the jobs in flight.
    ``TORCHTPU_COMPILE_WORKERS`` sets the start-up value (default: the CPU cores, 2 to
    4)."""
    global _workers, _pool
    settle_all()
    with _jobs_lock:  # (another thread may be queueing a job meanwhile)
        old, _pool = _pool, None
        _workers = max(0, int(n))
    if old is not None:
        old.shutdown(wait=True)  # its jobs still run to the end


def enabled() -> bool:
    return _workers > 0


def _get_pool():  # (called holding _jobs_lock)
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max(1, _workers), thread_name_prefix="torchtpu-compile")
    return _pool


class _Job:
    """One unit of worker work: a first call (compile, then run) or a queued run.

    ``outs`` are the :class:`Lazy` results handed out (value set when the job finishes);
    ``wait()`` waits for it and raises its error, if any."""

    __slots__ = ("future", "outs", "name", "compiled", "done", "__weakref__")

    def __init__(self, name):
        self.future = None
        self.outs = ()
        self.name = name
        self.compiled = None  # a first call's executable, once compiled
        self.done = False

    def wait(self):
        f = self.future
        if not f.done():
            t0 = time.perf_counter()
            try:
                f.exception()  # (waits without raising)
            finally:
                with _lock:
                    M.async_compile["waits"] += 1
                    M.async_compile["wait_seconds"] += time.perf_counter() - t0
        err = f.exception()
        if err is not None:
            if isinstance(err, AsyncOpError):  # an input's failure: named by its own op
                raise err
            raise AsyncOpError(
                f"torchtpu: {self.name}: its asynchronous compile or run failed: "
                f"{type(err).__name__}: {err}") from err


class AsyncOpError(RuntimeError):
    """A first call's compile or run failed on a worker thread (``eager.async_compile``):
    raised where one of its results (or a value computed from them) is read, naming the
    op.  The signature compiles again at its next call."""


def _aval(a, sharding):
    """What ``jax.jit(...).lower`` takes for storage array ``a``: the array itself, or for
    a pending value its shape and dtype on the executable's device."""
    if a.__class__ is Lazy:
        return runtime.jax().ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding,
                                              weak_type=a.out)
    return a


def compiling() -> bool:
    """Whether a call with pending inputs should queue on a worker: a first call's
    compile is in flight (its inputs may wait on it) and fewer than :data:`QUEUE_LIMIT`
    calls have queued since the last first call.  Otherwise it waits for its inputs and
    runs on the calling thread: a steady loop that met one new signature goes back to
    the hot path's speed instead of running op after op through a worker (each queued
    run costs a thread hop and the general per-op path)."""
    return _compiling[0] > 0 and _queued[0] < QUEUE_LIMIT


def concrete(outs) -> tuple:
    """``outs`` (an executable's results) with pending values waited for."""
    if any(o.__class__ is Lazy for o in outs):
        return tuple(_st.settle(o) if o.__class__ is Lazy else o for o in outs)
    return outs


def settle_list(arrays) -> None:
    """Replace, in place, the pending values in list ``arrays`` by their arrays."""
    for i, a in enumerate(arrays):
        if a.__class__ is Lazy:
            arrays[i] = _st.settle(a)


def _pending_outputs(job, out_info):
    outs = []
    for i, info in enumerate(out_info):
        lz = Lazy(job, ASYNC, i, tuple(info.shape), info.dtype)
        # Lazy.out of an async value: the result's weak_type (its position is not needed)
        lz.out = bool(getattr(info, "weak_type", False))
        outs.append(lz)
    job.outs = tuple(outs)
    return job.outs


def _finish(job, outs):
    for lz, v in zip(job.outs, outs):
        lz.value = v


def first_call(ex, arrays, dyn, entry, save, options=None):
    """Start ``ex``'s first call (``executables.first_call``): trace and lower it here,
    compile and run it on a worker.  Returns its pending results (a tuple of
    :class:`Lazy`), and sets ``ex.call`` to a caller that queues behind the compile until
    the worker replaces it with the executable.

    ``entry`` / ``save(entry, compiled, check_info, pc_hits_before)``: where to store the compiled
    executable (``eager.signature_cache``), or None.  ``options``: XLA compiler options
    (``eager.tiers.elementwise_options``), None for the defaults.
    Raises whatever tracing and lowering raise (``TypeError``/``ValueError`` of the
    lowering, ``NotImplementedError``), on this thread."""
    jax = runtime.jax()
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(runtime.jax_device(ex.device_index))
    # (ex.jitted: another thread may have made ex.call a queued caller meanwhile)
    jitted = ex.jitted if ex.jitted is not None else ex.call
    avals = [None if a is None else _aval(a, sharding) for a in arrays]
    lowered = jitted.lower(avals, dyn)
    options = _tiers.program_options(options, lowered)
    out_info = jax.tree_util.tree_leaves(lowered.out_info)
    job = _Job(ex.name)
    outs = _pending_outputs(job, out_info)
    if len(_TEMPLATES) >= _TEMPLATE_LIMIT:
        _TEMPLATES.clear()
    _TEMPLATES[ex.serial] = tuple((lz.shape, lz.dtype, lz.out) for lz in outs)
    args = list(arrays)
    pc = M.persistent_cache["hits"]

    def work():
        t0 = time.perf_counter()
        try:
            with _metrics.compile_kind("op"):
                if entry is not None:
                    with persistent_cache.bypassed():
                        compiled = lowered.compile(compiler_options=options)
                else:
                    compiled = lowered.compile(compiler_options=options)
        except BaseException:
            with _lock:
                _compiling[0] -= 1
                M.async_compile["errors"] += 1
            with _jobs_lock:  # the signature's next call compiles again
                if ex.call is queued:
                    ex.call = jitted
                    ex.compiled = False
                if _INFLIGHT.get(ex.serial) is job:
                    del _INFLIGHT[ex.serial]
            raise
        dt = time.perf_counter() - t0
        with _lock:
            _compiling[0] -= 1
            M.compile_seconds += dt
            M.async_compile["compile_seconds"] += dt
        job.compiled = compiled
        if entry is not None:
            save(entry, compiled, ex.check_info, pc)
        with _jobs_lock:  # later calls run it directly
            ex.call = _tiers.direct(compiled)
            _INFLIGHT.pop(ex.serial, None)
        settle_list(args)
        res = _call(ex, compiled, args, dyn)
        jax.block_until_ready(res)
        _finish(job, res)
        job.done = True

    def queued(arrays2, dyn2):
        # a call of this signature while it compiles: run behind the compile (or, past
        # the queue limit, wait for it here)
        if not job.done and _queued[0] < QUEUE_LIMIT:
            return run(ex, arrays2, dyn2, after=job)
        job.wait()
        arrays2 = list(arrays2)
        settle_list(arrays2)
        return _call(ex, job.compiled, arrays2, dyn2)

    def publish():
        # (under _jobs_lock, after the job is queued: no other thread can queue work
        # that waits on this job ahead of it)
        ex.call = queued
        ex.compiled = True
        _INFLIGHT[ex.serial] = job
        with _lock:
            M.async_compile["jobs"] += 1
            M.compiles += 1  # counted when started (its seconds when it ends)
            _compiling[0] += 1
            _queued[0] = 0

    _submit(job, work, publish)
    return outs


def _call(ex, compiled, args, dyn):
    try:
        return compiled(args, dyn)
    except TypeError:
        # an input structure the signature does not capture (executables.through_jit)
        with _lock:
            M.signature_cache["structure_mismatches"] += 1
        ex.call = ex.jitted
        return ex.jitted(args, dyn)


def run(ex, arrays, dyn, after=None):
    """Run ``ex`` on ``arrays``, some of them pending, on a worker (``after``: the job of
    its first call, still compiling): its pending results, as :func:`first_call`'s; None
    when ``ex``'s result shapes are not known here (its first call was not
    asynchronous: the caller waits for the inputs and runs it itself)."""
    template = _TEMPLATES.get(ex.serial)
    if template is None:
        return None
    job = _Job(ex.name)
    outs = []
    for i, (shape, dtype, weak) in enumerate(template):
        lz = Lazy(job, ASYNC, i, shape, dtype)
        lz.out = weak
        outs.append(lz)
    job.outs = tuple(outs)
    args = list(arrays)
    first = [after]

    def find_first():
        # (under _jobs_lock: a first call still compiling is queued ahead of this job)
        if first[0] is None:
            j = _INFLIGHT.get(ex.serial)
            if j is not None and not j.done:
                first[0] = j

    def work():
        f = first[0]
        if f is not None:
            f.future.result()  # its compile and first run; raises their error
            settle_list(args)
            res = _call(ex, f.compiled, args, dyn)
        else:
            settle_list(args)
            res = ex.call(args, dyn)
        runtime.jax().block_until_ready(res)
        _finish(job, res)
        job.done = True

    with _lock:
        M.async_compile["queued_runs"] += 1
        _queued[0] += 1
    _submit(job, work, before=find_first)
    return job.outs


# Executable.serial -> its results' (shape, dtype, weak_type), for runs queued on a worker
_TEMPLATES = {}
# Executable.serial -> the job of its first call while that compiles
_INFLIGHT = {}
_TEMPLATE_LIMIT = 100_000


def _submit(job, work, publish=None, before=None):
    """Queue ``work`` for ``job``.  ``before()`` and ``publish()`` run under the queue's
    lock, just before and just after the job is queued: a job waits only on jobs queued
    ahead of it (so the FIFO workers can never all wait on a job not started), also when
    several user threads dispatch ops at once."""
    _reap()
    with _jobs_lock:
        if before is not None:
            before()
        job.future = _get_pool().submit(work)
        _jobs.append(job)
        if publish is not None:
            publish()


def _reap() -> None:
    """Forget finished jobs at the front of the queue, giving their results' storages
    their arrays."""
    while True:
        with _jobs_lock:
            if not _jobs or not _jobs[0].future.done():
                return
            job = _jobs.popleft()
        if job.future.exception() is None:
            _own(job)


def _own(job) -> None:
    for lz in job.outs:
        ref = lz.owner
        sd = ref() if ref is not None else None
        if sd is not None and sd.arr is lz and lz.value is not None:
            sd.resolve(lz.value)


def unfinished_results() -> list:
    """The pending results (:class:`Lazy`) of every job not finished yet (never waits)."""
    with _jobs_lock:
        jobs = list(_jobs)
    return [lz for job in jobs if not job.done for lz in job.outs]


def pending() -> bool:
    """Whether a job may still be running."""
    _reap()
    return bool(_jobs)


def settle_all() -> None:
    """Wait for every job submitted so far, and give their results' storages their arrays
    (errors are not raised here: they are raised where the failed value is read)."""
    with _jobs_lock:
        jobs = list(_jobs)
    for job in jobs:
        f = job.future
        if not f.done():
            t0 = time.perf_counter()
            try:
                f.exception()  # waits; the error stays with the value
            finally:
                with _lock:
                    M.async_compile["waits"] += 1
                    M.async_compile["wait_seconds"] += time.perf_counter() - t0
    _reap()


_metrics.before_reset(settle_all)  # (a job's seconds land before a metrics reset)


def _before_fork():
    settle_all()


def _after_fork_in_child():
    global _pool
    _pool = None
    _jobs.clear()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
_st.set_settler(settle_all)
