"""``ProcessGroupTPU``: the ``torch.distributed.ProcessGroup`` behind ``tpu_dist``.

PyTorch accepts a Python ``ProcessGroup`` subclass from a registered backend's creator
(``torch/distributed/distributed_c10d.py``: "If the type is a subclass of ProcessGroup
then return this process group"); C++ callers (DDP's reducer, functional collectives)
reach its methods through PyTorch's ``PyProcessGroup`` trampoline.  It serves both
devices:

* tpu tensors: each collective XLA can express runs as one XLA computation over the
  group's devices (:mod:`torchtpu.distributed.collectives`), path ``"xla"``;
* calls XLA cannot express (send/recv, gather/scatter/reduce, all_to_all, object
  collectives' byte exchanges): the tpu tensors are staged through host memory and the
  call runs on the group's own gloo process group, path ``"gloo"``;
* cpu tensors: straight to that gloo group, path ``"cpu"``.

``torchtpu.metrics()["collectives"]`` counts the calls per path and collective.

Every call returns a ``Work`` whose future is already complete: the XLA computation is
dispatched asynchronously on the device's queue, and every later op on the result waits
for it there, as later kernels on a CUDA stream wait for an NCCL collective.  An XLA
collective's ``wait()`` reads its cross-rank signature check (:meth:`ProcessGroupTPU._xla`,
:class:`_CheckedWork`), so it waits for the collective.
"""

from __future__ import annotations

import datetime
import os
import sys
import zlib

import numpy as np

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d
from torch._C._distributed_c10d import _create_work_from_future

from torchtpu import _compat, _metrics
from torchtpu._tensor import storage
from torchtpu.distributed import BACKEND, bringup, collectives

M = _metrics.METRICS


def _completed(result) -> dist.Work:
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _failed(name: str, e: Exception) -> RuntimeError:
    """The error for an XLA collective that failed in the runtime (e.g. a rank died:
    XLA's gloo reports the closed connection), as c10d's backends raise it."""
    return RuntimeError(f"tpu_dist {name}: the XLA collective failed: {e}")


class _CheckedWork(dist._Work):
    """The work of XLA collectives whose cross-rank signature check (part of their XLA
    program, :meth:`ProcessGroupTPU._xla`) is still to be read: ``wait()`` reads the
    programs' "signatures differ" flags (so it waits for the collectives) and raises the
    mismatch ``ValueError``, so a synchronous ``dist.all_reduce`` raises in the call;
    ``get_future()`` returns a completed future without waiting (DDP's reducer, which
    only chains on the future, keeps the device queue running ahead).  Each flag is also
    queued as a device-side check, so a mismatch is raised at the next sync point even
    when the work is never waited for."""

    def __init__(self, result, checks):
        super().__init__()
        self._result = result
        self._checks = checks  # [(bad flag, message, (tensor, old array) or None)]

    def wait(self, timeout=None):
        from torchtpu.eager import inflight

        checks, self._checks = self._checks, []
        for bad, msg, _ in checks:
            try:
                differ = bool(np.asarray(bad)[0])
            except (RuntimeError, ValueError) as e:
                raise _failed(msg.name, e) from e
            inflight.drop_check(bad)  # verified here: not again at the next sync
            if differ:
                for _, _, u in checks:
                    if u is not None:
                        _write(*u)  # the tensors as they were before the call
                raise ValueError(str(msg))
        return True

    def is_completed(self):
        return True

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut


class _HostWork(dist._Work):
    """A gloo call on host copies of tpu tensors: ``wait()`` waits for gloo, then writes
    the host results back to their tpu tensors (so ``isend``/``irecv`` pairs posted by
    both ranks before either waits do not deadlock)."""

    def __init__(self, work, pairs):
        super().__init__()
        self._work = work
        self._pairs = pairs
        self._done = False

    def wait(self, timeout=None):
        if not self._done:
            self._work.wait()
            with torch.no_grad():
                for t, c in self._pairs:
                    t.copy_(c)
            self._done = True
        return True

    def is_completed(self):
        return self._done

    def get_future(self):
        self.wait()
        fut = torch.futures.Future()
        fut.set_result([t for t, _ in self._pairs])
        return fut


class _TPUBackendView:
    """What ``ProcessGroupTPU._get_backend(tpu device)`` returns to PyTorch's Python layer:
    the group's gloo backend, as seen by the calls PyTorch makes on the bound device's
    backend, answered for ``tpu_dist``: it supports splitting (``split_group`` calls
    :meth:`ProcessGroupTPU.split_group`, which needs no options: ``options`` is None,
    where gloo's cannot be deep-copied), non-members of a new subgroup take no part in
    making it (``perform_nocolor_split`` does nothing) and there is no communicator to
    connect eagerly.  Anything else is gloo's."""

    supports_splitting = True
    options = None

    def __init__(self, gloo):
        self._gloo = gloo

    def perform_nocolor_split(self, device) -> None:
        pass

    def eager_connect_single_device(self, device) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._gloo, name)


def _is_tpu(t) -> bool:
    return t.device.type == "tpu"


def _array(t: torch.Tensor):
    """The concrete JAX array holding ``t``'s elements in ``t``'s shape, at least 1-D (a
    copy through one dispatched op when ``t`` is a view that is not its whole storage)."""
    if t.dim() == 0:
        t = t.reshape(1)
    sd = storage.data(t)
    if len(storage.view_spec(t, sd)) != 2:
        t = t.clone(memory_format=torch.contiguous_format)
        sd = storage.data(t)
    return sd.get()


def _write(t: torch.Tensor, arr) -> None:
    """Write the JAX array ``arr`` (``t``'s number of elements) into ``t`` (any view).

    When ``t`` is its whole storage (contiguous, the storage's shape and dtype) the
    storage's array is replaced, as an in-place op does (no copy); else through
    ``copy_``.  Either way ``t``'s version counter is bumped, as for an in-place op."""
    sd = storage.data(t)
    if (len(storage.view_spec(t, sd)) == 2 and tuple(arr.shape) == sd.shape
            and sd.arr.__class__ is not storage.Lazy):
        sd.arr = arr
        torch.autograd.graph.increment_version(t)
        return
    src = storage.wrap(arr, t.device.index or 0, t.dtype)
    with torch.no_grad():
        t.copy_(src if src.shape == t.shape else src.view(t.shape))


_CHECK = os.environ.get("TORCHTPU_DIST_CHECK", "1").strip().lower() not in ("0", "off", "false")


def _code(x) -> int:
    return zlib.crc32(str(x).encode()) & 0x7FFFFFFF  # fits an int32


# what a signature row's codes can stand for, to name them in the mismatch error
_NAMES = ("all_reduce", "all_reduce_coalesced", "broadcast", "all_gather",
          "all_gather_into_tensor", "all_gather_into_tensor_coalesced", "reduce_scatter",
          "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced")
_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


class _Mismatch:
    """The message of a signature mismatch, decoded from the gathered rows when it is
    needed (``str()``): each rank's collective, shape, dtype and reduce op / root, e.g.
    ``tpu_dist all_reduce: ranks called collectives with different tensors: rank 0:
    all_reduce [3] torch.float32, SUM; rank 1: all_reduce [4] torch.float32, SUM``."""

    def __init__(self, pg, name: str, rows):
        self.pg, self.name, self.rows = pg, name, rows

    def __str__(self) -> str:
        rows = np.asarray(self.rows)
        names = {_code(n): n for n in _NAMES}
        dtypes = {_code(d): str(d) for d in vars(torch).values()
                  if isinstance(d, torch.dtype)}
        extras = {_code(e): str(e) for e in _OPS + tuple(range(self.pg._size))}
        parts = []
        for r, row in enumerate(rows.tolist()):
            ndim = row[2]
            dims = ["?" if d == -2 else str(d) for d in row[3:3 + min(ndim, 8)]]
            if ndim > 8:
                dims.append("...")
            ex = extras.get(row[11], "?")
            extra_s = f", {ex}" if ex != "0" else ""
            parts.append(f"rank {self.pg._procs[r]}: {names.get(row[0], '?')} "
                         f"[{', '.join(dims)}] {dtypes.get(row[1], '?')}{extra_s}")
        return (f"tpu_dist {self.name}: ranks called collectives with different tensors: "
                + "; ".join(parts))

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _fresh_keys(store, size: int):
    """``store`` under a prefix no earlier group of this name used.

    After ``destroy_process_group()``, a new ``init_process_group()`` in the same
    processes may get the same rendezvous store back (``env://`` keeps one TCPStore server
    per port in the process) and the same group names ("0" for the default group): a
    rank then read the previous group's keys (its gloo addresses, its device table) and
    went on before the others had written theirs: a hang or "Gloo connectFullMesh failed"
    on the second or third re-initialisation.  Each creation of the group adds 1 to a
    counter in the store; the ``size`` members of one creation share ``(count - 1) //
    size`` as a prefix (a creation cannot start before every member has counted the
    previous one: creating a group waits for all its members)."""
    n = store.add("tpu_dist/creations", 1)
    return dist.PrefixStore(f"tpu_dist/{(n - 1) // size}/", store)


class ProcessGroupTPU(dist.ProcessGroup):
    """The ``tpu_dist`` process group of ``size`` ranks (this process is ``rank``).

    Args:
        store: the group's rendezvous store (prefixed by PyTorch per group).
        rank, size: this process's rank in the group, and the group's size.
        global_ranks: the default-group ranks of the members, in group-rank order
            (global rank ``i`` is JAX process ``i``).
        timeout: ``datetime.timedelta`` for gloo calls and bring-up.
    """

    def __init__(self, store, rank: int, size: int, global_ranks, timeout):
        super().__init__(rank, size)
        self._store = store
        self._rank = rank
        self._size = size
        self._procs = tuple(global_ranks)
        self._timeout = timeout
        self._sigs: dict = {}  # signature arrays of _xla's check, by signature
        self._unverified: list = []  # checks of _xla calls not yet given to a work
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size,
                                           timeout)
        # PyTorch asks the group for its per-device C++ backend in a few places
        # (``init_process_group(device_id=...)``: ``pg._get_backend(device_id)``); the
        # gloo group answers for both devices (collectives still go through this class).
        for dev in ("cpu", "tpu"):
            self._register_backend(torch.device(dev), dist.ProcessGroup.BackendType.GLOO,
                                   self._gloo)
        # and for "the group's default backend" (torch 2.15's flight recorder hook, which
        # init_process_group attaches to a group with registered backends, asks for it:
        # "Could not find the default backend type 0" without one)
        self._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        self._tpu_backend = _TPUBackendView(self._gloo)
        self._splits = 0  # split_group calls on this group

    @classmethod
    def create(cls, opts, device=None) -> "ProcessGroupTPU":
        """Build the group from PyTorch's ``_DistributedBackendOptions``; the default
        group (no ``global_ranks_in_group``) first brings up ``jax.distributed``, then
        picks this process's tpu device (``device``: ``init_process_group``'s
        ``device_id``, else ``LOCAL_RANK``: :func:`~torchtpu.distributed.bringup.
        select_device`) and shares every rank's choice through the store."""
        ranks = list(opts.global_ranks_in_group)
        timeout = opts.timeout
        if not isinstance(timeout, datetime.timedelta):
            timeout = datetime.timedelta(seconds=float(timeout))
        store = _fresh_keys(opts.store, opts.group_size)
        if not ranks:
            bringup.ensure(store, opts.group_rank, opts.group_size, timeout)
            index = bringup.select_device(device)
            if bringup.share_devices(store, opts.group_rank, opts.group_size, index,
                                     timeout):
                collectives.clear_caches()
            ranks = list(range(opts.group_size))
        return cls(store, opts.group_rank, opts.group_size, ranks, timeout)

    # ------------------------------------------------------------------ identity
    def getBackendName(self) -> str:
        return BACKEND

    def _get_backend(self, device):
        """PyTorch's Python layer asks the group for its backend of a device
        (``split_group``, ``new_group`` and ``init_process_group(device_id=...)`` ask for
        the bound device's): for ``tpu`` a :class:`_TPUBackendView`, for other devices
        the registered gloo backend.

        From torch 2.14 on, ``new_group`` hands the bound device's backend (its "split
        source") to the creator in a C++ options struct, which holds C++ backends only:
        asked from there (``_get_split_source``), the answer is None, so ``new_group``
        makes the subgroup without a split source, as for a backend that cannot split
        (``tpu_dist`` builds every subgroup from the store and needs none)."""
        if torch.device(device).type == "tpu":
            if _compat.torch_at_least(2, 14) and \
                    sys._getframe(1).f_code.co_name == "_get_split_source":
                return None
            return self._tpu_backend
        return super()._get_backend(device)

    def get_group_store(self):
        """The group's rendezvous store (prefixed per group by PyTorch)."""
        return self._store

    def split_group(self, ranks, timeout=None, opts=None, group_name=None, group_desc=None,
                    device_types=None):
        """``torch.distributed.split_group``'s hook: a new ``tpu_dist`` group of this
        group's ranks ``ranks`` (group ranks of ``self``; the new group ranks them as
        PyTorch does: in sorted order on torch 2.13, in the list's order from 2.14 on), or
        None when this rank is not in ``ranks``.

        Every rank of ``self`` calls it (PyTorch's ``split_group`` is collective over the
        parent); the members rendezvous on the parent's store under ``group_name``.
        Collectives of the new group run over its members' devices (XLA) and its own gloo
        group, as any ``tpu_dist`` group.  Mirrors ``ProcessGroup::splitGroup`` (which
        NCCL implements with ``ncclCommSplit``)."""
        ranks = [int(r) for r in ranks]
        if not _compat.torch_at_least(2, 14):
            ranks.sort()
        # the members' store keys: PyTorch's group name can differ between the members
        # (it de-duplicates a hash of the ranks against each process's own group names),
        # so the keys carry a per-parent count of splits (every rank of the parent calls
        # split_group, in the same order) and the members' global ranks
        self._splits += 1
        if self._rank not in ranks:
            return None
        if group_name is None:
            group_name = "split:" + ",".join(str(self._procs[r]) for r in ranks)
        if timeout is None:
            timeout = self._timeout
        members = [self._procs[r] for r in ranks]
        store = dist.PrefixStore(f"split{self._splits}/{','.join(map(str, members))}/",
                                 self._store)
        pg = ProcessGroupTPU(store, ranks.index(self._rank), len(ranks), members, timeout)
        pg._set_group_name(group_name)
        if group_desc is not None:
            pg._set_group_desc(group_desc)
        return pg

    def __repr__(self):
        return f"ProcessGroupTPU(rank={self._rank}, size={self._size}, ranks={list(self._procs)})"

    # ------------------------------------------------------------------ routing
    def _route(self, name: str, tensors) -> str:
        """``"xla"`` when every tensor is on tpu, ``"cpu"`` when every one is on cpu."""
        kinds = {t.device.type for t in tensors}
        if kinds == {"tpu"}:
            return "xla"
        if kinds <= {"cpu"}:
            return "cpu"
        raise ValueError(
            f"tpu_dist {name}: tensors on {sorted(kinds)}; a collective takes tensors on "
            "one device type (tpu or cpu)"
        )

    def _xla(self, name: str, kind: str, t: torch.Tensor, arr, op=None, arg=None, extra=0):
        """Run XLA collective ``kind`` on this rank's JAX array ``arr`` and return this
        rank's result, checking that every rank called collective ``name`` with the same
        shape and dtype of ``t`` and the same ``extra`` (reduce op / root): with different
        shapes the ranks would run different XLA programs, and the collective would hang
        or return garbage.

        The check is part of the collective's own XLA program
        (:func:`torchtpu.distributed.collectives.run_checked`): the program all-gathers a
        13-integer signature row from every rank and runs the data collective only when
        all rows are equal (every rank takes the same branch, so a mismatch never hangs;
        the skipped collective's result is zeros; ``wait()`` puts back the values an
        all-reduce or broadcast overwrote, an all-gather or reduce-scatter output holds
        zeros).  No host rendezvous: the program's
        "rows differ" flag is read by the returned work's ``wait()`` (:class:`_CheckedWork`,
        :meth:`_done`; a synchronous ``dist.all_reduce`` waits, so it raises in the call)
        and is also queued as a device-side check (``host_reads.report_device_checks``),
        raised at the next sync point (``.cpu()``, ``.item()``,
        ``torch.tpu.synchronize()``) if no ``wait()`` came first.

        ``TORCHTPU_DIST_CHECK=0`` runs the bare collective (no check).

        Raises:
            ValueError: naming the collective and each rank's collective, shape, dtype and
                reduce op / root (every rank raises, at ``wait()`` or at its next sync).
        """
        try:
            if not _CHECK or self._size == 1:
                return collectives.run(kind, self._procs, arr, op, arg)
            key = (name, t.shape, t.dtype, extra)
            sig = self._sigs.get(key)
            if sig is None:
                sig = self._sigs[key] = self._signature(name, t, extra, arr)
            out, rows, bad = collectives.run_checked(kind, self._procs, arr, sig, op, arg)
        except (RuntimeError, ValueError) as e:
            raise _failed(name, e) from e
        from torchtpu.eager import host_reads

        msg = _Mismatch(self, name, rows)
        host_reads.report_device_checks(bad, [(ValueError, msg)], f"tpu_dist {name}")
        # all_reduce / broadcast write their result into ``t``: on a mismatch, wait()
        # puts its old values back
        undo = (t, arr) if kind in ("allreduce", "broadcast") else None
        self._unverified.append((bad, msg, undo))
        return out

    def _done(self, result) -> dist.Work:
        """The work of the XLA collectives just dispatched (their checks: ``_xla``)."""
        if not self._unverified:
            return _completed(result)
        checks, self._unverified = self._unverified, []
        return _CheckedWork(result, checks)

    def _signature(self, name: str, t: torch.Tensor, extra, arr):
        """This rank's signature row for collective ``name`` on ``t`` (collective, dtype,
        rank, 8 dims, reduce op / root, whole shape; int32), as the global array
        :func:`~torchtpu.distributed.collectives.run_checked` takes."""
        shape = tuple(t.shape)
        row = [_code(name), _code(t.dtype), len(shape)]
        row += [d if d < 2 ** 31 else -2 for d in shape[:8]]
        row += [-1] * (3 + 8 - len(row)) + [_code(extra), _code(shape)]
        return collectives.signature_array(self._procs, np.array(row, dtype=np.int32),
                                           arr.device)

    def _count(self, path: str, name: str) -> None:
        M.collectives[(path, name)] += 1

    def _cpu(self, name: str, *args):
        self._count("cpu", name)
        return getattr(self._gloo, name)(*args)

    def _cpu_each(self, name: str, outputs, inputs, opts):
        """A coalesced call on cpu tensors as one gloo call per (output, input) pair
        (gloo has no coalesced form of it)."""
        for o, i in zip(outputs, inputs):
            self._cpu(name, o, i, opts).wait()
        return _completed(list(outputs))

    def _via_host(self, name: str, args: tuple, outputs: tuple) -> dist.Work:
        """Start gloo's ``name`` on host copies of the tpu tensors in ``args``; the
        returned work's ``wait()`` writes the host results of argument positions
        ``outputs`` back to their tpu tensors."""
        self._count("gloo", name)
        pairs = []

        def host(a, pos):
            if isinstance(a, torch.Tensor):
                if a.device.type != "tpu":
                    return a
                c = a.detach().to("cpu")
                if pos in outputs:
                    pairs.append((a, c))
                return c
            if isinstance(a, (list, tuple)):
                return type(a)(host(x, pos) for x in a)
            return a

        hargs = tuple(host(a, i) for i, a in enumerate(args))
        return _HostWork(getattr(self._gloo, name)(*hargs), pairs)

    # ------------------------------------------------------------------ XLA collectives
    @staticmethod
    def _op_name(opts) -> str:
        op = opts.reduceOp.op.name
        if op not in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
            raise NotImplementedError(f"tpu_dist: reduce op {op} is not supported")
        return op

    def allreduce(self, tensors, opts=None):
        return self._allreduce("allreduce", "all_reduce", tensors,
                               opts or _c10d.AllreduceOptions())

    def allreduce_coalesced(self, tensors, opts=None):
        return self._allreduce("allreduce_coalesced", "all_reduce_coalesced", tensors,
                               opts or _c10d.AllreduceCoalescedOptions())

    def _allreduce(self, name, public, tensors, opts):
        """One XLA all-reduce per tensor (``name``: the ProcessGroup method, ``public``:
        the ``torch.distributed`` call named in errors)."""
        if self._route(name, tensors) == "cpu":
            return self._cpu(name, tensors, opts)
        op = self._op_name(opts)
        for t in tensors:
            self._count("xla", name)
            _write(t, self._xla(public, "allreduce", t, _array(t), op, extra=op))
        return self._done(list(tensors))

    def broadcast(self, tensors, opts=None):
        opts = opts or _c10d.BroadcastOptions()
        if self._route("broadcast", tensors) == "cpu":
            return self._cpu("broadcast", tensors, opts)
        for t in tensors:
            self._count("xla", "broadcast")
            _write(t, self._xla("broadcast", "broadcast", t, _array(t), arg=opts.rootRank,
                                extra=opts.rootRank))
        return self._done(list(tensors))

    def _gather_into(self, name, output, input):
        """all_gather_into_tensor: ``output`` is ``(n * d0, ...)`` or ``(n, *input.shape)``."""
        n = self._size
        if output.numel() != n * input.numel() or output.dtype != input.dtype:
            raise ValueError(
                f"tpu_dist {name}: output tensor of shape {tuple(output.shape)} and dtype "
                f"{output.dtype} must hold {n} x the input of shape {tuple(input.shape)} and "
                f"dtype {input.dtype}"
            )
        self._count("xla", name)
        _write(output, self._xla(name, "allgather", input, _array(input)))

    def _allgather_base(self, output, input, opts=None):
        if self._route("_allgather_base", [output, input]) == "cpu":
            return self._cpu("_allgather_base", output, input, opts or _c10d.AllgatherOptions())
        self._gather_into("all_gather_into_tensor", output, input)
        return self._done([output])

    def all_gather_single(self, output, input, opts=None):
        if self._route("all_gather_single", [output, input]) == "cpu":
            return self._cpu("_allgather_base", output, input,
                             opts or _c10d.AllgatherOptions())
        self._gather_into("all_gather_into_tensor", output, input)
        return self._done([output])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        if self._route("all_gather_single_coalesced", list(outputs) + list(inputs)) == "cpu":
            return self._cpu_each("_allgather_base", outputs, inputs,
                                  opts or _c10d.AllgatherOptions())
        for o, i in zip(outputs, inputs):
            self._gather_into("all_gather_into_tensor_coalesced", o, i)
        return self._done(list(outputs))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self.all_gather_single_coalesced(outputs, inputs, opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        flat = [t for lst in output_tensors for t in lst] + list(input_tensors)
        if self._route("allgather", flat) == "cpu":
            return self._cpu("allgather", output_tensors, input_tensors,
                             opts or _c10d.AllgatherOptions())
        n = self._size
        for outs, inp in zip(output_tensors, input_tensors):
            if len(outs) != n:
                raise ValueError(f"tpu_dist all_gather: tensor_list has {len(outs)} "
                                 f"tensors, the group has {n} ranks")
            for o in outs:
                if o.shape != inp.shape or o.dtype != inp.dtype:
                    raise ValueError(
                        f"tpu_dist all_gather: output tensors must match the input's shape "
                        f"{tuple(inp.shape)} and dtype {inp.dtype}, got {tuple(o.shape)} "
                        f"and {o.dtype}")
            self._count("xla", "allgather")
            g = storage.wrap(self._xla("all_gather", "allgather", inp, _array(inp)),
                             inp.device.index or 0, inp.dtype).view((n,) + tuple(inp.shape))
            with torch.no_grad():
                for i, o in enumerate(outs):
                    o.copy_(g[i])
        return self._done(output_tensors)

    def _scatter_into(self, name, output, input, op):
        n = self._size
        if (input.numel() != n * output.numel() or input.dtype != output.dtype
                or input.dim() == 0):
            raise ValueError(
                f"tpu_dist {name}: input tensor of shape {tuple(input.shape)} and dtype "
                f"{input.dtype} must hold {n} x the output of shape {tuple(output.shape)} "
                f"and dtype {output.dtype}")
        self._count("xla", name)
        flat = input.reshape(-1) if input.shape[0] % n else input  # (n * k,)
        _write(output, self._xla(name, "reduce_scatter", input, _array(flat), op, extra=op))

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        if self._route("reduce_scatter_single", [output, input]) == "cpu":
            return self._cpu("_reduce_scatter_base", output, input, opts)
        self._scatter_into("reduce_scatter_tensor", output, input, self._op_name(opts))
        return self._done([output])

    def _reduce_scatter_base(self, output, input, opts=None):
        return self.reduce_scatter_single(output, input, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        if self._route("reduce_scatter_single_coalesced", list(outputs) + list(inputs)) == "cpu":
            return self._cpu_each("_reduce_scatter_base", outputs, inputs, opts)
        op = self._op_name(opts)
        for o, i in zip(outputs, inputs):
            self._scatter_into("reduce_scatter_tensor_coalesced", o, i, op)
        return self._done(list(outputs))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        flat = list(output_tensors) + [t for lst in input_tensors for t in lst]
        if self._route("reduce_scatter", flat) == "cpu":
            return self._cpu("reduce_scatter", output_tensors, input_tensors, opts)
        op = self._op_name(opts)
        n = self._size
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != n or any(i.shape != out.shape or i.dtype != out.dtype for i in ins):
                raise ValueError(
                    f"tpu_dist reduce_scatter: input_list must hold {n} tensors of the "
                    f"output's shape {tuple(out.shape)} and dtype {out.dtype}, got "
                    f"{[(tuple(i.shape), i.dtype) for i in ins]}")
            self._count("xla", "reduce_scatter")
            stacked = torch.stack([i.reshape(-1) for i in ins]).reshape(-1)
            _write(out, self._xla("reduce_scatter", "reduce_scatter", out, _array(stacked),
                                  op, extra=op))
        return self._done(list(output_tensors))

    def barrier(self, opts=None):
        """All ranks reach this point: a 1-element all-reduce on the device, waited for
        on the host (XLA path; gloo's barrier when no tpu device is in use)."""
        self._count("xla", "barrier")
        jax_arr = storage.data(torch.zeros(1, dtype=torch.int32, device="tpu")).get()
        collectives.run("allreduce", self._procs, jax_arr, "SUM").block_until_ready()
        return _completed(None)

    # ------------------------------------------------------------------ through gloo
    def send(self, tensors, dst, tag=0):
        if self._route("send", tensors) == "cpu":
            return self._cpu("send", tensors, dst, tag)
        return self._via_host("send", (tensors, dst, tag), outputs=())

    def recv(self, tensors, src, tag=0):
        if self._route("recv", tensors) == "cpu":
            return self._cpu("recv", tensors, src, tag)
        return self._via_host("recv", (tensors, src, tag), outputs=(0,))

    def recv_anysource(self, tensors, tag=0):
        if self._route("recv_anysource", tensors) == "cpu":
            return self._cpu("recv_anysource", tensors, tag)
        return self._via_host("recv_anysource", (tensors, tag), outputs=(0,))

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.GatherOptions()
        flat = [t for lst in output_tensors for t in lst] + list(input_tensors)
        if self._route("gather", flat) == "cpu":
            return self._cpu("gather", output_tensors, input_tensors, opts)
        return self._via_host("gather", (output_tensors, input_tensors, opts), outputs=(0,))

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.ScatterOptions()
        flat = list(output_tensors) + [t for lst in input_tensors for t in lst]
        if self._route("scatter", flat) == "cpu":
            return self._cpu("scatter", output_tensors, input_tensors, opts)
        return self._via_host("scatter", (output_tensors, input_tensors, opts), outputs=(0,))

    def reduce(self, tensors, opts=None):
        opts = opts or _c10d.ReduceOptions()
        if self._route("reduce", tensors) == "cpu":
            return self._cpu("reduce", tensors, opts)
        return self._via_host("reduce", (tensors, opts), outputs=(0,))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.AllToAllOptions()
        if self._route("alltoall", list(output_tensors) + list(input_tensors)) == "cpu":
            return self._cpu("alltoall", output_tensors, input_tensors, opts)
        return self._via_host("alltoall", (output_tensors, input_tensors, opts), outputs=(0,))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        opts = opts or _c10d.AllToAllOptions()
        args = (output, input, output_split_sizes, input_split_sizes, opts)
        if self._route("all_to_all_single", [output, input]) == "cpu":
            return self._cpu("alltoall_base", *args)
        return self._via_host("alltoall_base", args, outputs=(0,))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                      opts)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        flat = [t for lst in output_lists for t in lst] + list(input_list)
        if self._route("allgather_coalesced", flat) == "cpu":
            return self._cpu("allgather_coalesced", output_lists, input_list,
                             opts or _c10d.AllgatherOptions())
        return self.allgather(output_lists, input_list, opts)
