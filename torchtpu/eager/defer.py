"""DeferAndFuse: record ops, run them later as one fused XLA computation.

In ``DEFER_AND_FUSE`` mode the strict executor (``executor.LoweredPlan``) still does all
per-op work on the host — argument checks, PyTorch's meta kernel, the output tensors with
their shapes, dtypes and strides — but instead of running the op's executable it calls
:func:`record`, which appends the op to the current :class:`Segment` and returns
:class:`~torchtpu._tensor.storage.Lazy` placeholders that the output storages hold.

A segment runs (:func:`flush`) when a value must exist: a host read (``item``,
``.cpu()``, ``print``, ``bool()``), a data-dependent shape (``nonzero``...),
``torch.tpu.synchronize()``, a mode change, the segment-size limit, or a CPU-fallback op.
It becomes one ``jax.jit`` function of the segment's live inputs that composes the
recorded per-op functions (the same lowerings strict mode compiles one by one).  Only
values still held by a storage when the segment runs are outputs: dead intermediates
never reach device memory, and XLA fuses the rest.  Compiled segments are cached by
structure — the sequence of per-op executables (each keyed by op, shapes, dtypes, views
and static arguments) and how their inputs are wired — never by values, so a training
loop compiles in its first steps and then only hits the cache.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
import weakref

import numpy as np

from torchtpu import _metrics
from torchtpu._device import executable_limit as _executable_limit
from torchtpu._device import runtime
from torchtpu._tensor import storage as _st
from torchtpu.eager import executables as _ex
from torchtpu.eager import inflight

M = _metrics.METRICS
# ops; a longer segment runs early (cause "segment_limit").  XLA's compile of a segment
# grows faster than its length: on XLA:CPU, segments of small-MLP training steps took 27 s
# and 1.9 GB at 1,000 ops, 39 s and 3 GB at 2,000, over 10 minutes and 20 GB at 20,000
# (the limit before); so a loop that never syncs or cuts (no backward, no host read)
# compiles bounded pieces.  (TORCHTPU_DEFER_SEGMENT_LIMIT sets it.)
SEGMENT_LIMIT = int(os.environ.get("TORCHTPU_DEFER_SEGMENT_LIMIT", "1000"))
# End the pending segment (asynchronously, not a host sync) when a backward pass starts
# and ends: see torchtpu.eager.autograd.  TORCHTPU_DEFER_CUT_AT_BACKWARD=0 turns it off.
CUT_AT_BACKWARD = os.environ.get("TORCHTPU_DEFER_CUT_AT_BACKWARD", "1") != "0"

_current = None
# Recording and running segments, one thread at a time: a thread that meets another
# thread's pending segment runs it (flush "thread_switch"); without the lock a thread
# could append to a segment another thread had just run (its values never computed:
# "stale deferred value"), because JAX calls inside record/flush release the GIL.
_LOCK = threading.RLock()
_CACHE = _executable_limit.LRUCache(share=0.25)  # compiled segments, bounded
_get_ident = threading.get_ident
# sys.getrefcount of a segment input held by nobody else: the inputs list + the call's
# own argument reference.
_REFS_IF_UNUSED = 2
# XLA on some platforms cannot reuse every donated buffer; that is fine.
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


class Segment:
    """Ops recorded since the last flush (on one device)."""

    __slots__ = ("index", "thread", "inputs", "input_ids", "dyn", "nodes", "key", "lazies",
                 "graphs", "written", "restores", "guard")

    def __init__(self, index, thread):
        self.index = index
        self.thread = thread  # the recording thread (autograd's device thread or the user's)
        self.inputs = []  # concrete JAX arrays read by the segment
        self.input_ids = {}  # id(array) -> position in inputs
        self.dyn = []  # host scalars / RNG key data, in op order
        self.nodes = []  # (traced fn, input refs, number of dyn values, executables.Executable)
        self.key = []  # structure, for the compiled-segment cache
        self.lazies = []  # weakref to each node output's Lazy, with (node, out)
        self.graphs = set()  # serials of the compiled-graph nodes recorded (record_graph)
        # positions in inputs of arrays whose storage a graph rewrote, or an in-place op
        # wrote when large (DONATE_MIN_BYTES): donated whatever else holds them then
        self.written = set()
        # (storage, its new Lazy, its old value: an input position or an earlier Lazy of
        # this segment) per storage a graph rewrote: put back if the segment fails
        self.restores = []
        # the graphs' device-side check flags, (node, out) each, and their rewritten
        # storages, ((node, out) of the new value, old value's input position or (node, out))
        self.guard = ([], [])


def _out_avals(ex, arrays, dyn):
    jax = runtime.jax()

    def aval(a):
        if a is None:
            return None
        return jax.ShapeDtypeStruct(a.shape, a.dtype)

    return jax.eval_shape(ex.traced, [aval(a) for a in arrays], list(dyn))


def record(ex, c):
    """Append one op (executable ``ex`` with gathered call ``c``: its ``index``,
    ``arrays`` and ``dyn``) to the segment and return the Lazy values standing for its
    results."""
    return record_arrays(ex, c.arrays, c.dyn, c.index)


_Lazy = _st.Lazy
_wref = weakref.ref


def record_arrays(ex, arrays, dyn, index=None):
    """:func:`record` of a call given as the storages' ``arrays`` (JAX arrays, Lazy
    values or None), the host scalars ``dyn`` and its tpu ``index`` (default: the
    executable's device).  The hot path's form: the C++ kernels call it for every
    recorded op."""
    global _current
    if index is None:
        index = ex.device_index
    with _LOCK:  # one thread at a time: see _LOCK
        seg = _current
        if seg is None or seg.index != index or seg.thread != _get_ident():
            if seg is not None:
                if seg.index != index:
                    flush("device_change")
                else:
                    # another thread records (user threads, or a backward on autograd's
                    # worker thread): segments are per thread of control
                    flush("thread_switch", sync=False)
            seg = _current = Segment(index, _get_ident())
        if ex.out_avals is None:
            ex.out_avals = _out_avals(ex, arrays, dyn)
        ids = seg.input_ids
        inputs = seg.inputs
        refs = []
        for a in arrays:  # (Segment.ref, inlined: the per-op path)
            if a is None:
                refs.append(None)
                continue
            if a.__class__ is _Lazy:
                if a.value is not None:
                    a = a.value
                elif a.seg is seg:
                    refs.append((a.node, a.out))
                    continue
                elif a.error is not None:  # its segment failed, or its step's check did
                    _st.settle(a)  # (raises the story)
                else:  # cannot happen: a live value of a flushed segment has its value
                    raise RuntimeError("torchtpu internal error: stale deferred value")
            k = ids.get(id(a))
            if k is None:
                k = ids[id(a)] = len(inputs)
                inputs.append(a)
            refs.append(k)
        refs = tuple(refs)
        if ex.writes:  # an in-place op: its large written inputs are donated (see flush)
            for j in ex.writes:
                k = refs[j]
                if k.__class__ is int and inputs[k].nbytes >= _ex.DONATE_MIN_BYTES:
                    seg.written.add(k)
        if dyn:
            seg.dyn.extend(dyn)
        nodes = seg.nodes
        node = len(nodes)
        nodes.append((ex.traced, refs, len(dyn), ex))
        seg.key.append((ex.serial, refs))
        outs = []
        lazies = seg.lazies
        i = 0
        for av in ex.out_avals:
            lz = _Lazy(seg, node, i, av.shape, av.dtype)
            outs.append(lz)
            lazies.append((_wref(lz), node, i))
            i += 1
        if node + 1 >= SEGMENT_LIMIT:
            flush("segment_limit", sync=False)
        return outs


def record_graph(ex, arrays, dyn, index, written=(), sdatas=(), n_new=0, checks=False):
    """Record a compiled graph's call (``torchtpu.compile.graph``'s stitching) as one
    node: ``ex`` the graph's executable for this input layout (an
    :class:`~torchtpu.eager.executables.Executable` whose ``traced`` is the graph's pure
    function), ``arrays`` its storage arrays (concrete or Lazy values of the pending
    segment), ``dyn`` its host values and RNG keys.  A graph already recorded in the
    pending segment starts a new one first (cause ``"step_boundary"``, not a host sync):
    a training loop's segment is one step, whose structure repeats, so its fused program
    is compiled once.  ``written``: the positions in ``arrays`` of the storages the graph
    writes, ``sdatas`` those storages (``StorageData``), given their new values here (the
    graph's results after its ``n_new`` new storages); their old arrays are donated when
    the segment runs, copied first where something else still holds them (so the donated
    inputs, part of the compiled program's key, are the same from the first step on), and
    put back if the segment fails to compile or run.  ``checks``: the graph's last result
    is its device-side check flags; when one of a segment's graph flags is set, every
    storage its graphs rewrote keeps its old value (the program selects it), so a step
    whose loss fails a check (a target out of range) updates nothing, as on CPU, which
    raises before the update.  Returns the Lazy values of the graph's results."""
    with _LOCK:
        seg = _current
        if seg is not None and ex.serial in seg.graphs:
            flush("step_boundary", sync=False)
        outs = record_arrays(ex, arrays, dyn, index)
        seg = _current
        if seg is not None:  # (None: the segment limit ran it already)
            seg.graphs.add(ex.serial)
            if checks:
                seg.guard[0].append((outs[-1].node, outs[-1].out))
        ids = seg.input_ids if seg is not None else None
        for j, sd, lz in zip(written, sdatas, outs[n_new:]):
            if lz.value is not None:  # (its segment ran already)
                sd.arr = lz.value
                continue
            k = ids.get(id(arrays[j]))
            old = sd.arr if k is None else k
            if k is not None:
                seg.written.add(k)
                seg.guard[1].append(((lz.node, lz.out), k))
            elif old.__class__ is _Lazy and old.seg is seg:  # rewritten twice in the segment
                seg.guard[1].append(((lz.node, lz.out), (old.node, old.out)))
            seg.restores.append((_wref(sd), lz, old))
            sd.arr = lz
            lz.owner = _wref(sd)  # (counted and resolved when the segment runs)
        return outs


def starts_step(ex) -> bool:
    """Whether recording compiled graph ``ex`` (:func:`record_graph`) starts a new
    segment: the pending one holds it already (the next training step)."""
    seg = _current
    return seg is not None and ex.serial in seg.graphs


def holds_graphs() -> bool:
    """Whether the pending segment holds a compiled graph's call: a backward pass then
    does not end it (the forward graph, the backward graph and the optimizer update run
    as one program)."""
    seg = _current
    return seg is not None and bool(seg.graphs)


def pending_ops() -> int:
    """Number of ops recorded and not run yet."""
    return 0 if _current is None else len(_current.nodes)


def flush(cause: str = "flush", sync: bool = True) -> None:
    """Run the pending segment, if any.

    ``sync=True``: a sync point, counted under ``cause`` in ``metrics()["host_syncs"]``
    (the caller then waits for a value).  ``sync=False``: a segment boundary the executor
    chose; the segment is dispatched asynchronously and counted in
    ``metrics()["segment_cuts"]``."""
    global _current
    with _LOCK:  # (reentrant: running a segment may record)
        seg = _current
        if seg is None:
            return
        _current = None
        if not seg.nodes:
            return
        live = []
        for wr, node, out in seg.lazies:
            lz = wr()
            if lz is not None:
                live.append((lz, node, out))
        # Donation: an input buffer nobody but this segment still references (its storage
        # was overwritten in the segment, e.g. a parameter updated in place) is given to
        # XLA, which may write the result into it instead of allocating.
        inflight.clear_last()  # (it would hold references to the inputs)
        inputs = seg.inputs
        seg.inputs = None
        donate = tuple(i for i in range(len(inputs))
                       if sys.getrefcount(inputs[i]) <= _REFS_IF_UNUSED or i in seg.written)
        if seg.written:  # (written inputs are donated: copied first where shared)
            own(inputs, seg.written, _REFS_IF_UNUSED)
        skey = tuple(seg.key)
        if seg.guard[0] and seg.guard[1]:
            skey = (skey, tuple(seg.guard[0]), tuple(seg.guard[1]))
        live_keys = tuple((n, o) for _, n, o in live)
        key = (skey, live_keys, donate)
        fn = _CACHE.get(key)
        outs = live_keys  # the values the program returns (a superset of the live ones)
        if fn is None and seg.graphs:
            fn, outs = _graph_variant(skey, live_keys, donate)
        M.segments_run += 1
        M.segment_ops += len(seg.nodes)
        M.donated_buffers += len(donate)
        if sync:
            M.sync(cause)
        else:
            M.segment_cuts[cause] += 1
        made = _made(seg, live) if seg.guard[0] else None
        try:
            _run(seg, key, skey, outs, live, live_keys, inputs, donate, fn)
        except BaseException as e:
            _failed(seg, inputs, live, e)
            raise
        if made:
            _watch(seg, live, made)


def _run(seg, key, skey, outs, live, live_keys, inputs, donate, fn) -> None:
    """Compile (or find) and run segment ``seg``'s program; its values to ``live``."""
    # (a segment guarding compiled graphs' device checks is never replayed: replaying
    # runs its ops one by one, and only the fused program keeps the rewritten storages'
    # old values when a check fails -- see record_graph)
    if fn is None and not (seg.guard[0] and seg.guard[1]) and _churning(seg, key):
        # a family that keeps meeting new shapes: its ops run one by one through their
        # per-op executables (shared with STRICT and across steps), no fused compile
        M.segment_cache_misses += 1
        M.defer_adaptive["segments_replayed"] += 1
        M.defer_adaptive["ops_replayed"] += len(seg.nodes)
        results = _replay(seg, inputs, [(n, o) for _, n, o in live])
        if seg.guard[0]:  # (its flags are live: the pending checks hold them)
            pos = {(n, o): i for i, (_, n, o) in enumerate(live)}
            _stick(seg.index, [results[pos[f]] for f in seg.guard[0] if f in pos])
        inflight.dispatched(results)
        _assign(live, results)
        return
    dset = set(donate)
    donated = [inputs[i] for i in donate]
    kept = [a for i, a in enumerate(inputs) if i not in dset]
    del inputs
    # a segment with graph checks reads and extends the device's failed-check flag
    extra = (sticky_flag(seg.index),) if seg.guard[0] else ()
    if fn is None:
        M.segment_cache_misses += 1
        fn = _CACHE.put((skey, outs, donate),
                        _build(seg, list(outs), donate, len(donated) + len(kept)))
        if seg.graphs:
            _VARIANTS.setdefault((skey, donate), []).append(outs)
        t0 = time.perf_counter()
        with _metrics.compile_kind("segment"):
            results = fn(donated, kept, _pack(seg.dyn, fn.groups), *extra)
        dt = time.perf_counter() - t0
        M.compiles += 1
        M.compile_seconds += dt
        if seg.graphs:  # compiled graphs' program (torchtpu.compile.graph's stitching)
            M.compile["executables"] += 1
            M.compile["xla_seconds"] += dt
    else:
        M.segment_cache_hits += 1
        _CACHE.move_to_end((skey, outs, donate))
        results = fn(donated, kept, _pack(seg.dyn, fn.groups), *extra)
    if extra:
        _STICKY[seg.index] = results[-1]
        results = results[:-1]
    inflight.dispatched(results)
    if outs is not live_keys:  # a program returning more: the live ones, in order
        pos = {k: i for i, k in enumerate(outs)}
        results = [results[pos[k]] for k in live_keys]
    _assign(live, results)


# Segments holding compiled graphs (stitched training steps): a step's structure repeats,
# but which of its results are still referenced when it runs depends on the user's code
# (``out = step()`` keeps the last loss, ``step()`` drops it), and each such pattern
# would compile the whole step again.  So a program returning a superset of the live
# values serves a segment too, and a new pattern is compiled returning the union of its
# values and those of the last program of the same structure: at most a few compiles.
_VARIANTS: dict = {}  # (structure, donated inputs) -> [returned (node, out) tuples]


def _graph_variant(skey, live_keys, donate):
    """``(program, returned values)`` of a cached program for segment structure ``skey``
    with donated inputs ``donate`` that returns every value of ``live_keys``; else
    ``(None, values to compile for)``: ``live_keys`` united with the last program's."""
    variants = _VARIANTS.get((skey, donate))
    if not variants:
        return None, live_keys
    need = set(live_keys)
    for outs in reversed(variants):
        if need <= set(outs):
            fn = _CACHE.get((skey, outs, donate))
            if fn is not None:
                return fn, outs
    if len(variants) > 8:
        del variants[0]
    return None, tuple(sorted(need | set(variants[-1])))


def _failed(seg, inputs, live, error) -> None:
    """Segment ``seg`` failed to compile or run (``error``): each storage a graph rewrote
    gets its old array back (the parameters and optimizer state of a failed step stay
    usable, as after a failed launch), and every other value it was to compute raises
    ``error``'s story when read (``storage.settle``), instead of leaving a storage that
    holds nothing.  Its device-side checks are dropped: the failure is raised here, not
    once more at the next sync point by a check whose flags were never computed."""
    for ref, lz, old in reversed(seg.restores):
        sd = ref()
        if sd is not None and sd.arr is lz:
            sd.arr = inputs[old] if old.__class__ is int else old
    lost = set()
    for lz, _, _ in live:
        if lz.value is None:
            lz.seg = None
            lz.error = error
            lost.add(id(lz))
    if lost:
        for flags, _, _ in [c for c in inflight.PENDING_CHECKS if id(c[0]) in lost]:
            inflight.drop_check(flags)


# A segment with compiled graphs' device-side checks keeps, when a check fails, the old
# values of the storages its graphs rewrote (_build's guard).  The storages it *made* (a
# first step's momentum buffers, new ``.grad`` tensors, the loss) have no old value: CPU
# raised before creating them.  They are poisoned when the check is found failed
# (``host_reads.check_pending`` calls :func:`poison`): reading one raises the check's
# error, instead of handing out values computed from the failed step.
_MADE = weakref.WeakKeyDictionary()  # a segment's check flags (Lazy) -> its made storages

# A failed check is raised at the next sync point, so steps recorded after the failing one
# and before that sync run too, where CPU never ran them (it raised first): they must
# change nothing either, though their own checks pass.  Every segment with graph checks
# takes the device's *failed-check flag* (a bool scalar on the device: whether a check
# failed since the checks were last verified) and returns it or-ed with its own flags;
# its guard uses that, so a step after a failed one keeps the old values of what it
# rewrote, and what it made is poisoned with the failure (``host_reads.check_pending``
# poisons every segment's made storages from the first failed check on).  Verifying the
# checks resets it (:func:`checks_verified`).  No host wait: the flag stays on the device.
_STICKY: dict = {}  # device index -> bool[] JAX array, absent: no failure since the reset
_FALSE: dict = {}  # device index -> bool[] False on it
_OR = None


def sticky_flag(index):
    """Device ``index``'s failed-check flag: a bool scalar JAX array on it, true when a
    stitched segment's device-side check failed since the checks were last verified."""
    f = _STICKY.get(index)
    if f is None:
        f = _FALSE.get(index)
        if f is None:
            jax = runtime.jax()
            f = _FALSE[index] = jax.device_put(np.bool_(False), runtime.jax_device(index))
    return f


def _stick(index, flags) -> None:
    """Or the check ``flags`` (bool[n] JAX arrays) of a segment run op by op into device
    ``index``'s failed-check flag."""
    global _OR
    if _OR is None:
        jax = runtime.jax()
        _OR = jax.jit(lambda s, fs: s | jax.numpy.any(
            jax.numpy.stack([jax.numpy.any(f) for f in fs])))
    if flags:
        _STICKY[index] = _OR(sticky_flag(index), flags)


def checks_verified() -> None:
    """Every pending device-side check was read (``host_reads.check_pending``): no step
    recorded from now on follows an unreported failure."""
    _STICKY.clear()


def _made(seg, live):
    """The storages that will hold values of segment ``seg`` and had none before it:
    ``[(storage, Lazy)]``, taken before the segment runs.  (A storage made while a
    segment records holds a Lazy value and is not counted yet; an older one is counted:
    a graph's rewrite of it gets its old value back from the guard.)"""
    made = []
    for lz, _, _ in live:
        o = lz.owner
        sd = o() if o is not None else None
        if sd is not None and sd.arr is lz and not sd.counted:
            made.append((sd, lz))
    return made


def _watch(seg, live, made) -> None:
    """After segment ``seg`` ran: remember its ``made`` storages (:func:`_made`), weakly,
    with their shapes and dtypes, under each of its graphs' check flags."""
    watched = [(_wref(sd), lz.shape, lz.dtype) for sd, lz in made]
    if not watched:
        return
    keys = set(seg.guard[0])
    for lz, n, o in live:
        if (n, o) in keys:
            _MADE[lz] = watched


def poison(flags, error) -> int:
    """Check flags ``flags`` (the Lazy a stitched segment's graph returned) were found
    set, or a check of a segment before it was: every storage that segment made raises
    ``error``'s story when read (``storage.settle``), as a value of a segment that failed
    (whatever it holds now: a later step that failed with it kept or recomputed its
    failed value).  Returns how many storages were poisoned."""
    watched = _MADE.pop(flags, None) if flags.__class__ is _Lazy else None
    n = 0
    for sref, shape, dtype in watched or ():
        sd = sref()
        if sd is None or (sd.arr.__class__ is _Lazy and sd.arr.node is _st.POISONED):
            continue
        bad = _Lazy(None, _st.POISONED, 0, shape, dtype)
        bad.error = error
        bad.owner = sref
        sd.arr = bad
        if sd.counted:  # (its buffer is gone)
            sd.counted = False
            _st.ALLOCATOR.free(sd.index, sd.nbytes)
        n += 1
    M.compile["poisoned_storages"] += n
    return n


_COPY = None


def own(arrays, positions, refs_if_unused) -> None:
    """Make ``arrays[i]`` safe to donate for each ``i`` in ``positions``: an array held by
    more than ``refs_if_unused`` references (counted as ``sys.getrefcount`` sees them
    here: the list's, the call's own, and those the caller's owner adds) -- another
    storage sharing it (the by-value cache of small host transfers), a user's ``to_jax``
    result -- is replaced in ``arrays`` by a copy (one dispatch for all), which the
    program then takes as a donated buffer.  Counted in
    ``metrics()["compile"]["donation_copies"]``."""
    global _COPY
    shared = [i for i in positions if sys.getrefcount(arrays[i]) > refs_if_unused]
    if not shared:
        return
    if _COPY is None:
        jax = runtime.jax()
        _COPY = jax.jit(lambda xs: [jax.numpy.copy(x) for x in xs])
    M.compile["donation_copies"] += len(shared)
    for i, x in zip(shared, _COPY([arrays[i] for i in shared])):
        arrays[i] = x


def _assign(live, results):
    for (lz, _, _), r in zip(live, results):
        lz.value = r
        lz.seg = None
        owner = lz.owner() if lz.owner is not None else None
        if owner is not None and owner.arr is lz:
            owner.resolve(r)


# ------------------------------------------------------------------ churn: adaptive fusion
#
# A fused segment is compiled once per structure.  A *family* of segments -- the same ops
# in the same order -- that keeps arriving with new shapes (each decoding step of
# ``generate()`` reads a longer KV cache; a batch of a new length) would compile one whole
# program per step: seconds each, where STRICT compiles only the few per-op executables
# whose shapes changed.  So when a family misses the segment cache with its
# ``CHURN_VARIANTS``-th distinct shape variant, that segment's ops run one by one through
# their per-op executables (``_replay``: the ones STRICT uses, cached by signature, so a
# later step with the same shapes compiles nothing) instead of compiling a fused program.
# A replayed segment whose structure repeats one of the last ``_RECENT`` replayed ones (a
# loop that now runs the same shapes step after step) is compiled fused after all.
# ``metrics()["defer_adaptive"]`` counts; ``TORCHTPU_DEFER_CHURN_VARIANTS=0`` turns the
# mechanism off (always fuse).
CHURN_VARIANTS = int(os.environ.get("TORCHTPU_DEFER_CHURN_VARIANTS", "2"))
_RECENT = 4
_FAMILIES: dict = {}  # family (op names) -> signature tuples compiled fused (bounded)
_recent: list = []  # cache keys of the last _RECENT replayed segments


def forget_families() -> None:
    """Forget the segment families seen so far (their shape variants and the recently
    replayed structures): the next segment of any family is compiled fused, as in a fresh
    process.  (A model whose ops, in order, match a family another model already compiled
    with other shapes has its first steps replayed until its structure repeats.)"""
    _FAMILIES.clear()
    _recent.clear()


def _churning(seg, key) -> bool:
    """Whether the missed segment ``seg`` (cache key ``key``) is one more shape variant
    of a family that already compiled ``CHURN_VARIANTS - 1`` others, and not a repeat of
    a recently replayed one.  True: replay it; False: compile it."""
    if CHURN_VARIANTS <= 0:
        return False
    family = tuple(node[3].name for node in seg.nodes)
    sigs = tuple(node[3].serial for node in seg.nodes)
    seen = _FAMILIES.get(family)
    if seen is None:
        if len(_FAMILIES) > 1024:
            _FAMILIES.clear()
        seen = _FAMILIES[family] = set()
    if sigs in seen:
        return False  # the same shapes again (other liveness or donation): not churn
    h = hash(key)
    if len(seen) + 1 >= CHURN_VARIANTS and h not in _recent:
        _recent.append(h)
        if len(_recent) > _RECENT:
            del _recent[0]
        return True
    if len(seen) > 64:
        seen.clear()
    seen.add(sigs)
    if len(seen) > 1:
        M.defer_adaptive["fused_variants"] += 1
    return False


def _replay(seg, inputs, live):
    """Run ``seg``'s ops one by one through their per-op executables; the ``live``
    (node, output) values, as the fused program would return them."""
    from torchtpu.eager import executables

    dyn = seg.dyn
    nodes = seg.nodes
    keep = set(live)
    last = {}  # node output -> the last node reading it: dropped after that node runs,
    for n, (_, refs, _, _) in enumerate(nodes):  # as STRICT drops dead intermediates
        for r in refs:
            if r.__class__ is tuple:
                last[r] = n
    vals = {}
    d = 0
    for n, (_, refs, ndyn, ex) in enumerate(nodes):
        arrays = [None if r is None else (inputs[r] if r.__class__ is int else vals[r])
                  for r in refs]
        outs = executables.run_executable(ex, arrays, dyn[d:d + ndyn])
        d += ndyn
        del arrays
        for i, o in enumerate(outs):
            k = (n, i)
            if k in keep or k in last:
                vals[k] = o
        for r in refs:
            if r.__class__ is tuple and last.get(r) == n and r not in keep:
                vals.pop(r, None)
    # (a first call compiled on a worker left pending values: the segment's live values
    # are arrays, as the fused program's are)
    return executables.concrete_outputs(tuple(vals[k] for k in live))


def _dyn_layout(dyn):
    """How a segment's host scalars (and RNG key data) travel: one flat array per dtype
    (``groups``: dtype -> entry positions) instead of one transfer each, and where each
    entry sits in its array (``layout``: (group, offset, size, shape))."""
    groups: dict = {}
    offsets: dict = {}
    layout = []
    for i, a in enumerate(dyn):
        k = a.dtype.str
        groups.setdefault(k, []).append(i)
        off = offsets.get(k, 0)
        layout.append((k, off, a.size, a.shape))
        offsets[k] = off + a.size
    return groups, layout


def _pack(dyn, groups):
    return {k: np.concatenate([dyn[i].reshape(-1) for i in idx]) for k, idx in groups.items()}


class _Compiled:
    """A compiled segment: ``fn(donated, kept, packed_dyn)``, and its dyn packing."""

    __slots__ = ("jitted", "groups")

    def __init__(self, jitted, groups):
        self.jitted = jitted
        self.groups = groups

    def __call__(self, donated, kept, packed, *sticky):
        return self.jitted(donated, kept, packed, *sticky)


def _guard_plan(nodes, flags, rewrites, live):
    """How a segment with graph checks keeps its rewritten storages' old values when a
    check fails (see :func:`_build`): ``(post, keys)``, the nodes to run inside a
    loop of 0 or 1 trips (every node whose results a rewrite takes, but not one the
    flags depend on, and every node after one of those) and the live results they give
    (each one a rewritten storage's new value), or None where the results are selected
    instead (a post node gives a live result that is not a rewrite)."""
    news = {new for new, _ in rewrites}
    pre = set()
    todo = [f[0] for f in flags]
    while todo:  # the nodes the flags depend on
        n = todo.pop()
        if n in pre:
            continue
        pre.add(n)
        todo.extend(r[0] for r in nodes[n][1] if r is not None and r.__class__ is not int)
    post = set()
    for n, (_, refs, _, _) in enumerate(nodes):
        if n in pre:
            continue
        if any(k[0] == n for k in news) or any(
                r is not None and r.__class__ is not int and r[0] in post for r in refs):
            post.add(n)
    if not post:
        return None
    keys = [k for k in live if k.__class__ is not int and k[0] in post]
    if any(k not in news for k in keys):
        return None
    return post, keys


# A failed check keeps the old values through a loop of 0 or 1 trips around the nodes
# that rewrite storages (XLA updates the donated buffers in place) rather than through
# selects after them (which made XLA copy each donated buffer first: 15 copies in a small
# MLP's AdamW step).  Off: the selects (TORCHTPU_GUARD_LOOP=0).
GUARD_LOOP = os.environ.get("TORCHTPU_GUARD_LOOP", "1") != "0"


def _build(seg, live, donate, n_inputs):
    jax = runtime.jax()
    from jax.sharding import SingleDeviceSharding

    nodes = list(seg.nodes)
    dset = set(donate)
    kept_idx = [i for i in range(n_inputs) if i not in dset]
    groups, layout = _dyn_layout(seg.dyn)
    flags, rewrites = seg.guard if seg.guard[0] else ((), ())
    plan = _guard_plan(nodes, flags, rewrites, live) if rewrites and GUARD_LOOP else None
    starts = []
    d = 0
    for _, _, ndyn, _ in nodes:
        starts.append(d)
        d += ndyn

    def run_nodes(ns, dyn, lookup, into):
        """Trace nodes ``ns`` in order, their inputs from ``lookup``, results into ``into``."""
        for n in ns:
            traced, refs, ndyn, _ = nodes[n]
            outs = traced([None if r is None else lookup(r) for r in refs],
                          dyn[starts[n]:starts[n] + ndyn])
            for i, o in enumerate(outs):
                into[(n, i)] = o

    def run(donated, kept, packed, sticky=None):
        dyn = [packed[k][off:off + size].reshape(shape) for k, off, size, shape in layout]
        inputs = [None] * n_inputs
        for i, a in zip(donate, donated):
            inputs[i] = a
        for i, a in zip(kept_idx, kept):
            inputs[i] = a
        vals = {}

        def outer(r):
            return inputs[r] if r.__class__ is int else vals[r]

        post = plan[0] if plan is not None else ()
        run_nodes([n for n in range(len(nodes)) if n not in post], dyn, outer, vals)
        if flags:  # a failed check, here or in a step before the checks were read
            jnp = jax.numpy
            bad = jnp.any(jnp.stack([jnp.any(vals[f]) for f in flags])) | sticky
        if rewrites:  # a failed check: the rewritten storages keep their old values
            if plan is not None:
                try:
                    _guarded_loop(jax, plan, rewrites, bad, run_nodes, dyn, outer, vals)
                except TypeError:  # a storage the update gives another shape: selected
                    run_nodes(sorted(post), dyn, outer, vals)
                    post = ()
            for new, old in rewrites:
                if new[0] not in post:
                    vals[new] = jnp.where(bad, outer(old), vals[new])
        if flags:
            return (*(vals[k] for k in live), bad)
        return tuple(vals[k] for k in live)

    return _Compiled(
        jax.jit(run, out_shardings=SingleDeviceSharding(runtime.jax_device(seg.index)),
                donate_argnums=(0,) if donate else ()),
        groups)


def _guarded_loop(jax, plan, rewrites, bad, run_nodes, dyn, outer, vals):
    """Run the post nodes of ``plan`` (:func:`_guard_plan`) in a ``lax.while_loop`` of one
    trip, or none when ``bad``: the loop carries the rewritten storages, starting from
    their old values, so their new values are written into the donated buffers."""
    post, keys = plan
    olds = dict(rewrites)
    roots = []
    for k in keys:  # the storage's value before the segment's first post-node rewrite
        r = olds[k]
        while r.__class__ is not int and r in olds and r[0] in post:
            r = olds[r]
        roots.append(r)
    slot = {r: i for i, r in enumerate(roots)}
    order = sorted(post)

    def body(c):
        i, carried = c
        local = {}

        def lookup(r):
            j = slot.get(r)
            if j is not None:  # (the loop's buffer: updated in place)
                return carried[j]
            if r.__class__ is not int and r[0] in post:
                return local[r]
            return outer(r)

        run_nodes(order, dyn, lookup, local)
        return i + 1, tuple(local[k] for k in keys)

    jnp = jax.numpy
    trips = jnp.where(bad, 0, 1).astype(jnp.int32)
    init = (jnp.int32(0), tuple(outer(r) for r in roots))
    _, out = jax.lax.while_loop(lambda c: c[0] < trips, body, init)
    vals.update(zip(keys, out))


def cache_info() -> dict:
    return {"segments_cached": len(_CACHE)}


# a storage holding a Lazy value of ours runs the pending segment through this
_st.set_materializer(lambda: flush("materialize"))
