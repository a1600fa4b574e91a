"""Counters for every cache and every sync point (read with ``torchtpu.metrics()``)."""

from __future__ import annotations

import collections
import copy
import os
import sys
import threading

_lock = threading.Lock()


# Functions returning [(attribute, count)] to add to METRICS when it is read, each count
# given once: counters kept where incrementing them is cheaper (the C++ op kernels).
_SOURCES: list = []


def add_counter_source(fn) -> None:
    """Register ``fn() -> [(attribute name, int)]``: counts since its last call, added to
    :data:`METRICS` by :func:`metrics` (and dropped by :func:`reset_metrics`)."""
    _SOURCES.append(fn)


class Metrics:
    """Process-wide counters.

    Attributes:
        ops_dispatched: ATen ops that reached the tpu backend.
        lowered_ops: ops run through a compiled per-op executable.
        hot_path_calls: of those, calls that took strict eager's hot path
            (``torchtpu.eager.hotpath``: executable known from the call's hot key).
        stitched_ops: of ``lowered_ops``, STRICT ops recorded into a segment of stitched
            compiled graphs instead of launched (``eager.keying.SHAPE_ONLY``: autograd's
            loss seed).
        decomposed_ops: ops run through a PyTorch decomposition.
        view_ops: view ops (metadata only, no device work) that went through Python;
            ``as_strided``/``view`` run in C++ once the native helper is loaded
            (``torchtpu._tensor.native``) and are not counted.
        cache_hits / cache_misses: per-op executable cache lookups.
        executable_evictions: per-op executables and DeferAndFuse segments dropped from
            their bounded caches (``torchtpu._device.executable_limit``).
        compiles: XLA compilations; compile_seconds: wall time spent in them (seconds).
            These count the compiles torchtpu times itself (per-op tiers, fused
            segments, compiled graphs); ``xla`` below counts every executable.
        xla: every XLA executable built in this process, whoever asked for it, from
            JAX's own compile events (``/jax/core/compile/backend_compile_duration``;
            per-op executables deserialized from torchtpu's own signature cache are
            counted in ``signature_cache["hits"]`` instead):
            ``compiled`` / ``compile_seconds`` (compiled by XLA), ``loaded`` /
            ``load_seconds`` (taken from JAX's persistent cache instead), and
            ``by_kind`` (dict kind -> count of both): ``op`` (a per-op executable's
            first compile), ``op_tier_up`` (its full-tier recompile), ``op_donating``
            (the variant of a hot in-place signature that donates its old buffers),
            ``bucket`` (shape-bucket executables), ``segment`` (DeferAndFuse),
            ``graph`` (torch.compile), ``other`` (transfers, casts, anything else).
        quick_compiles / quick_compile_seconds: those at the quick tier (a signature's
            first use, see ``torchtpu.eager.tiers``); tier_ups / tier_up_seconds: the
            recompiles at the full tier when a signature is used again.
        host_syncs: Counter of host synchronizations by cause ("item", "to_cpu", ...).
        fallbacks: Counter of ops run on CPU through the opt-in CPU fallback, by op name.
        transfers_to_device_bytes / transfers_to_host_bytes: host<->device copies (bytes).
        segments_run / segment_ops: DeferAndFuse segments executed and ops they held.
        segment_cache_hits / segment_cache_misses: compiled-segment cache lookups.
        segment_cuts: Counter of segments started early without a host sync, by cause
            ("backward" / "backward_end": a backward pass starts / ends;
            "thread_switch": another thread records; "segment_limit").
        donated_buffers: segment inputs handed to XLA for reuse (in-place updates).
        debug_waits: ops the DEBUG eager mode waited for before dispatching the next.
        foreach_in_order: in-place ``_foreach_*_`` calls whose lists alias so that the
            element order shows, run element by element (``torchtpu.ops.foreach``)
            instead of as one executable.
        defer_adaptive: DEFER_AND_FUSE's churn handling (``torchtpu.eager.defer``):
            ``segments_replayed`` / ``ops_replayed`` (segments of a family that keeps
            meeting new shapes, run op by op through per-op executables instead of
            compiled fused), ``fused_variants`` (a family's second and later shape
            variants that were compiled fused).
        op_executables: per-op executables built (their first call: a compile or a load
            from the signature cache) by op, most first (``{"aten.cat.default": 12, ...}``;
            ``executables`` of shape buckets included).
        growth: tensors that grow by ``torch.cat`` each step (a KV cache, generated ids)
            held with spare capacity (``torchtpu.eager.growth``): ``started`` (cat
            chains switched to a capacity array), ``appends`` (cats written into spare
            capacity at a runtime offset), ``regrows`` (capacity doubled),
            ``attention_calls`` (attention run over the capacity with a length mask),
            ``cuts`` (reads that needed the exact array, cut on the device).
        padded: padded sequences (``torchtpu.eager.padded``): ``transfers`` (host
            transfers padded to a capacity), ``runs`` (ops run on capacity arrays with
            the length as a runtime value), ``masks`` (results zeroed past the length
            on the device), ``appends`` (cats along the padded dim written at the
            length), ``cuts`` (reads of the exact array cut on the device) and
            ``host_cuts`` (from a padded transfer's host copy: a transfer, no sync),
            ``families_off`` (transfer families no longer padded: their tensors kept
            being cut on the device),
            ``cut_ops`` (by op: the ops that read a padded storage without a rule).
        async_compile: STRICT first calls compiled on worker threads
            (``torchtpu.eager.async_compile``): ``jobs`` (first calls), ``queued_runs``
            (calls run on a worker behind a pending value or compile), ``waits`` /
            ``wait_seconds`` (the calling thread waited for a pending value; not a host
            sync), ``compile_seconds`` (of the jobs, also in ``compile_seconds``),
            ``errors`` (compiles that failed; raised where their values are read).
        sync_sites: Counter of (cause, "file:line") — the user's line behind each sync.
        compile: torch.compile on tpu (``torchtpu.compile``): ``graphs_compiled`` (FX
            graphs handed to the backend, forward and backward count separately),
            ``tracing_seconds`` (AOTAutograd inside the backend call, plus Dynamo's own
            tracing when PyTorch reports it), ``lowering_seconds`` (our FX -> JAX
            interpretation and StableHLO emission), ``xla_seconds`` (XLA compilation),
            ``executables`` (one per graph and input layout; with stitching, one per
            DeferAndFuse segment structure holding graph calls, its seconds counted in
            ``xla_seconds``), ``cache_hits`` (calls that reused an executable or a
            stitched node), ``graph_calls``, ``recompiles`` (Dynamo compiled a frame
            again for the ``tpu`` backend after a guard failed), ``recompile_reasons``
            (dict: the guard failure behind each of those recompiles, as Dynamo words it
            for ``TORCH_LOGS=recompiles`` without the compile id, e.g. ``"tensor 'x'
            dtype mismatch. expected Float, actual Int"`` -> count), ``donated_buffers``
            (old buffers of inputs a graph writes, e.g. optimizer state, handed to XLA
            to be updated in place), ``donation_copies`` (of those, buffers something
            else still held -- another tensor's storage, a user's array --: copied first,
            the copy donated), ``graph_cache_hits`` (of ``graphs_compiled``, graphs loaded
            from the on-disk graph cache instead of traced by AOTAutograd,
            ``torchtpu.compile.graph_cache``), ``executable_cache_hits`` (of
            ``executables``, those loaded from that cache instead of traced, lowered and
            compiled), ``collectives`` (functional collectives lowered into
            compiled executables: the graphs that hold them run as one SPMD program over
            the group's devices, ``torchtpu.compile.collectives``), and
            ``eager_collective_graphs`` (graphs whose collectives could not be lowered --
            several process groups in one graph, uneven ``all_to_all_single`` -- and so
            run op by op in eager), ``launch_free_calls`` (of ``graph_calls``, calls of a
            graph with nothing to compute -- every output an input or a view of one, as
            the ``out.detach()`` graph after a graph break --: no executable launched),
            ``staged_graphs`` (graphs with data-dependent nodes -- ``item()``,
            ``nonzero``... captured by Dynamo -- cut into compiled stretches between eager
            sync nodes, ``torchtpu.compile.staged``), ``eager_stages`` (sync stages
            run: each a host sync), ``seq_bucket_calls`` (calls of a decoding-step graph
            run on a bucketed capacity of its growing cache, ``torchtpu.compile.
            seq_buckets``) and ``seq_bucket_moves`` (cache inputs moved to a new
            capacity on the device for such a call), ``graph_launches`` (of
            ``graph_calls``, calls that launched the graph's own executable) and
            ``stitched_calls`` (of ``graph_calls``, calls recorded into the pending
            DeferAndFuse segment, to run fused with the graphs and ops around them:
            ``torchtpu.compile.graph``'s stitching; ``segments_run`` counts those
            launches).
        persistent_cache: JAX's on-disk compilation cache (``_device.persistent_cache``):
            ``hits`` (executables loaded instead of compiled), ``misses`` and
            ``load_seconds``.
        signature_cache: the eager per-op executables stored under their op signature
            (``eager.signature_cache``): ``hits`` (loaded without tracing, lowering or
            compiling; not counted in ``compiles``), ``stores``, ``load_seconds`` and
            ``structure_mismatches`` (calls whose input structure the signature missed:
            run through ``jax.jit`` instead; a bug to report).
        collectives: ``torch.distributed`` calls on the ``tpu_dist`` backend by path and
            collective: ``{"xla": {"allreduce": n, ...}, "gloo": {...}, "cpu": {...}}``
            ("xla": one XLA computation; "gloo": tpu tensors staged through host memory
            to gloo; "cpu": cpu tensors on gloo; "compiled": a functional collective
            run inside a torch.compile executable, counted per call of the graph by
            ``_c10d_functional`` op name).
        sdpa: ``F.scaled_dot_product_attention`` calls on tpu by the kernel that
            computed them (``torchtpu.ops.sdpa``; counted when traced in a compiled
            graph): ``pallas`` (JAX's Pallas flash attention, TPU), ``cudnn`` (cuDNN
            through ``jax.nn.dot_product_attention``, GPU), ``xla_blockwise`` (the
            blockwise XLA kernel: CPU, masks, dropout, shapes the platform kernel does
            not take), ``math`` (PyTorch's composite kernel), and ``fused_failures``
            (forward and backward calls whose platform kernel refused them -- raised
            when traced -- and that ran the blockwise kernel instead, also counted
            under ``xla_blockwise``).
    """

    def __init__(self):
        self.reset()

    def fold(self):
        """Add the counts kept outside this object (:func:`add_counter_source`)."""
        for source in _SOURCES:
            for name, n in source():
                setattr(self, name, getattr(self, name) + n)

    def reset(self):
        for source in _SOURCES:
            source()  # (dropped)
        self.ops_dispatched = 0
        self.lowered_ops = 0
        self.hot_path_calls = 0
        self.stitched_ops = 0
        self.decomposed_ops = 0
        self.view_ops = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.executable_evictions = 0
        self.compiles = 0
        self.compile_seconds = 0.0
        self.xla = {"compiled": 0, "compile_seconds": 0.0, "loaded": 0, "load_seconds": 0.0,
                    "by_kind": collections.Counter()}
        self.quick_compiles = 0
        self.quick_compile_seconds = 0.0
        self.tier_ups = 0
        self.tier_up_seconds = 0.0
        self.host_syncs = collections.Counter()
        self.fallbacks = collections.Counter()
        self.transfers_to_device_bytes = 0
        self.transfers_to_host_bytes = 0
        self.segments_run = 0
        self.segment_ops = 0
        self.segment_cache_hits = 0
        self.segment_cache_misses = 0
        self.segment_cuts = collections.Counter()
        self.donated_buffers = 0
        self.debug_waits = 0
        self.foreach_in_order = 0
        self.defer_adaptive = {"segments_replayed": 0, "ops_replayed": 0, "fused_variants": 0}
        self.sync_sites = collections.Counter()
        self.compile = {
            "graphs_compiled": 0, "tracing_seconds": 0.0, "lowering_seconds": 0.0,
            "xla_seconds": 0.0, "executables": 0, "cache_hits": 0, "graph_calls": 0,
            "recompiles": 0, "recompile_reasons": collections.Counter(),
            "donated_buffers": 0, "donation_copies": 0, "graph_cache_hits": 0,
            "executable_cache_hits": 0, "collectives": 0, "eager_collective_graphs": 0,
            "launch_free_calls": 0,
            "staged_graphs": 0,
            "eager_stages": 0,
            "seq_bucket_calls": 0,
            "seq_bucket_moves": 0,
            "graph_launches": 0,
            "stitched_calls": 0,
            # storages a stitched step made whose device-side check then failed: reading
            # one raises the check's error (eager.defer.poison)
            "poisoned_storages": 0,
        }
        self.persistent_cache = {"hits": 0, "misses": 0, "load_seconds": 0.0}
        self.signature_cache = {"hits": 0, "stores": 0, "load_seconds": 0.0,
                                "structure_mismatches": 0}
        self.collectives = collections.Counter()
        self.sdpa = {"pallas": 0, "cudnn": 0, "xla_blockwise": 0, "math": 0,
                     "fused_failures": 0}
        self.shape_buckets = {"runs": 0, "hot_signatures": 0, "recurring_signatures": 0,
                              "churning_ops": 0, "host_pads": 0, "device_pads": 0,
                              "device_cuts": 0, "not_padded": 0, "factory_runs": 0}
        self.growth = {"started": 0, "appends": 0, "regrows": 0, "attention_calls": 0,
                       "cuts": 0}
        self.padded = {"transfers": 0, "runs": 0, "masks": 0, "appends": 0, "cuts": 0,
                       "host_cuts": 0, "families_off": 0, "cut_ops": collections.Counter()}
        self.op_executables = collections.Counter()
        self.async_compile = {"jobs": 0, "queued_runs": 0, "waits": 0, "wait_seconds": 0.0,
                              "compile_seconds": 0.0, "errors": 0}

    def sync(self, cause: str):
        self.host_syncs[cause] += 1
        self.sync_sites[(cause, _user_line())] += 1

    def snapshot(self) -> dict:
        self.fold()
        with _lock:
            d = copy.deepcopy(self.__dict__)
        d["host_syncs"] = dict(d["host_syncs"])
        d["host_syncs_total"] = sum(d["host_syncs"].values())
        d["fallbacks"] = dict(d["fallbacks"])
        d["op_executables"] = dict(d["op_executables"].most_common())
        d["padded"]["cut_ops"] = dict(d["padded"]["cut_ops"].most_common())
        d["segment_cuts"] = dict(d["segment_cuts"])
        d["sync_sites"] = {f"{c} @ {line}": n for (c, line), n in d["sync_sites"].items()}
        d["compile"]["recompile_reasons"] = dict(d["compile"]["recompile_reasons"])
        d["xla"]["by_kind"] = dict(d["xla"]["by_kind"])
        coll: dict = {}
        for (path, name), n in d["collectives"].items():
            coll.setdefault(path, {})[name] = n
        d["collectives"] = coll
        if d["segments_run"]:
            d["ops_per_segment"] = d["segment_ops"] / d["segments_run"]
        return d


_kind = threading.local()


class compile_kind:
    """``with compile_kind("op"):`` -- XLA executables built in the block are counted
    under that kind in ``metrics()["xla"]["by_kind"]`` (innermost block wins)."""

    __slots__ = ("kind", "prev")

    def __init__(self, kind: str):
        self.kind = kind

    def __enter__(self):
        self.prev = getattr(_kind, "v", None)
        _kind.v = self.kind

    def __exit__(self, *exc):
        _kind.v = self.prev
        return False


def on_jax_event(event: str, **kwargs) -> None:
    """JAX monitoring listener: remembers a persistent-cache hit of the compile under way."""
    if event == "/jax/compilation_cache/cache_hits":
        _kind.hit = True


def on_jax_duration(event: str, seconds: float, **kwargs) -> None:
    """JAX monitoring listener: counts each executable built (``metrics()["xla"]``)."""
    if event != "/jax/core/compile/backend_compile_duration":
        return
    x = METRICS.xla
    if getattr(_kind, "hit", False):
        _kind.hit = False
        x["loaded"] += 1
        x["load_seconds"] += seconds
    else:
        x["compiled"] += 1
        x["compile_seconds"] += seconds
    x["by_kind"][getattr(_kind, "v", None) or "other"] += 1


_INTERNAL = (f"{os.sep}torch{os.sep}", f"{os.sep}jax{os.sep}",
             f"{os.sep}jaxlib{os.sep}", "<frozen ", f"{os.sep}numpy{os.sep}",
             f"{os.sep}contextlib.py", f"{os.sep}threading.py")
# this package's own directory (not any path with a "torchtpu" folder in it: a user's
# checkout named torchtpu holds the user's own code, tests and examples)
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _internal(fn: str) -> bool:
    """Whether a frame's file is torch's, this package's, jax's or numpy's own (kept per
    file name: every counted sync point walks a few frames)."""
    hit = _INTERNAL_FILES.get(fn)
    if hit is None:
        if len(_INTERNAL_FILES) > 10_000:
            _INTERNAL_FILES.clear()
        hit = _INTERNAL_FILES[fn] = fn.startswith(_PACKAGE_DIR) or any(p in fn for p in _INTERNAL)
    return hit


_INTERNAL_FILES: dict = {}


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the calling function point at
    the innermost frame outside torch, this package, jax and numpy: the user's line, where
    CPU PyTorch's warnings point (``warnings.warn(msg, stacklevel=user_stacklevel())``)."""
    f = sys._getframe(1)  # the caller: warn's stacklevel 1
    level = 1
    while f is not None:
        if not _internal(f.f_code.co_filename):
            return level
        f = f.f_back
        level += 1
    return 1


def _user_line() -> str:
    """"file:line" of the innermost frame outside torch, this package, jax and numpy, and not
    generated code (a ``"<string>"`` file: a dataclass method, an ``exec``-made wrapper
    some library installed), which no user can open."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith("<") and not _internal(fn):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return "?"


METRICS = Metrics()


def metrics() -> dict:
    """A snapshot of torchtpu's counters as a plain dict (see :class:`Metrics`)."""
    return METRICS.snapshot()


def explain_syncs() -> list:
    """Every host sync since the last reset, grouped by cause and the user's source line,
    most frequent first: ``[{"cause", "line", "count"}]``.  Use it to find an accidental
    ``.item()`` or ``print`` inside a training loop."""
    rows = [{"cause": c, "line": line, "count": n}
            for (c, line), n in METRICS.sync_sites.items()]
    return sorted(rows, key=lambda r: -r["count"])


_BEFORE_RESET: list = []  # callables run by reset_metrics() first


def before_reset(fn) -> None:
    """Run ``fn()`` at the start of every :func:`reset_metrics` (a layer above that has
    work in flight whose counts must land before the reset: ``eager.async_compile``)."""
    _BEFORE_RESET.append(fn)


def reset_metrics() -> None:
    """Zero every counter.  Compiles still running on a worker (``eager.async_compile``)
    are waited for first, so their seconds are not counted after the reset."""
    for fn in _BEFORE_RESET:
        fn()
    METRICS.reset()
