"""The Dynamo backend ``"tpu"``: Dynamo -> AOTAutograd -> one JAX executable per graph.

``torch.compile(fn, backend="tpu")`` hands each Dynamo FX graph to :func:`tpu_backend`,
which runs AOTAutograd (forward and backward partitioned by PyTorch's min-cut
rematerialization partitioner, functionalized, decomposed to the ops our lowering table
has) and turns each resulting ATen graph into a :class:`~torchtpu.compile.graph.
GraphExecutable`.
"""

from __future__ import annotations

import re
import time

from torchtpu import _metrics
from torchtpu.compile.decompositions import decompositions
from torchtpu.compile.graph import graph_ids

M = _metrics.METRICS


def _compiler(kind, dump_prefix=None, cacheable=False):
    def compile_graph(gm, example_inputs):
        from torchtpu.compile import staged

        M.compile["graphs_compiled"] += 1
        prefix = None
        if dump_prefix is not None:  # TORCHTPU_DUMP_DIR (torchtpu.compile.dump)
            from torchtpu.compile import dump

            prefix = f"{dump_prefix}.{kind}"
            dump.write(prefix + ".fx.txt", dump.fx_text(gm))
        eager = _eager_collective_graph(gm)
        if eager is not None:
            return eager
        if cacheable:  # AOTAutogradCache stores it (torchtpu.compile.graph_cache)
            from torchtpu.compile.graph_cache import TpuOutputCode, deferred_executable

            # the backward is compiled with the forward here (graph_cache.active): an op
            # it cannot lower raises at the first backward, as with AOTAutograd's lazy
            # backward compile, not when the forward is compiled
            ex = deferred_executable(gm, f"{kind}{next(graph_ids)}", kind == "backward")
            return TpuOutputCode(ex, kind)
        ex = staged.build(gm, f"{kind}{next(graph_ids)}", dump_prefix=prefix)

        def run(args):
            return ex(args)

        run._boxed_call = True  # AOTAutograd passes one list of inputs
        run.graph_executable = ex
        return run

    return compile_graph


def _eager_collective_graph(gm):
    """For an ATen graph whose functional collectives cannot be one SPMD executable
    (``torchtpu.compile.collectives.unsupported_reason``: several process groups, uneven
    all_to_all, point-to-point ops): a boxed callable running the graph op by op in
    eager (each collective a ``tpu_dist`` call), counted in
    ``metrics()["compile"]["eager_collective_graphs"]``; None for any other graph."""
    import logging

    from torchtpu.compile import collectives as coll
    from torchtpu.compile.graph import _is_cpu

    nodes = [n for n in coll.graph_collectives(gm.graph.nodes)
             if not _is_cpu(n.meta.get("val"))]
    why = coll.unsupported_reason(nodes) if nodes else None
    if why is None:
        return None
    logging.getLogger("torchtpu.compile").info(
        "torchtpu.compile: graph run op by op in eager: %s", why)
    M.compile["eager_collective_graphs"] += 1

    def run(args):
        return list(gm(*args))

    run._boxed_call = True
    return run


_last_recompile = [None]  # CompileContext last counted (one frame compile, one count)
_COMPILE_ID_PREFIX = re.compile(r"^[!\d/_\[\]]+: ")


def recompile_reason() -> str:
    """The guard failure that made Dynamo compile the current frame again, as Dynamo
    records it for the compilation in progress (``recompile_reason`` of its metrics
    context, the first of ``torch._dynamo.guards.get_and_maybe_log_recompilation_reasons``
    -- the text ``TORCH_LOGS=recompiles`` prints, e.g. ``tensor 'x' dtype mismatch.
    expected Float, actual Int``), without the failed entry's compile id prefix
    (``"0/0: "``) and the user stack; ``"unknown"`` when PyTorch gives none."""
    try:
        from torch._dynamo.utils import get_metrics_context

        ctx = get_metrics_context()
        text = ctx._metrics.get("recompile_reason") if ctx.in_progress() else None
    except Exception:  # another PyTorch version: the count still works
        text = None
    if not text:
        return "unknown"
    text = text.split("\nUser stack trace:")[0].strip()
    return _COMPILE_ID_PREFIX.sub("", text, count=1) or "unknown"


def _count_recompile():
    try:
        from torch._guards import CompileContext

        ctx = CompileContext.try_get()
        cid = CompileContext.current_compile_id()
    except Exception:
        return
    # compile ids restart after torch._dynamo.reset(): the context object tells frame
    # compiles apart
    if cid is not None and getattr(cid, "frame_compile_id", 0) and ctx is not _last_recompile[0]:
        _last_recompile[0] = ctx
        M.compile["recompiles"] += 1
        M.compile["recompile_reasons"][recompile_reason()] += 1


def tpu_backend(gm, example_inputs, **kwargs):
    """Dynamo backend for graphs on ``tpu`` tensors (``torch.compile(backend="tpu")``).

    ``gm``: Dynamo's FX graph (torch-level ops); ``example_inputs``: its fake inputs.
    Returns the compiled callable.  Ops without a lowering raise ``NotImplementedError``
    naming the op when the graph is compiled (``torch._dynamo`` wraps it in a
    ``BackendCompilerFailed`` whose cause is that error); so do data-dependent shapes
    (an op whose output shape or offset depends on tensor values, or a decomposition
    that branches on one)."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import config as functorch_config

    _count_recompile()
    t0 = time.perf_counter()
    c = M.compile
    before = c["lowering_seconds"] + c["xla_seconds"]
    from torchtpu.compile import dump

    prefix = dump.new_prefix()  # None unless TORCHTPU_DUMP_DIR is set
    if prefix is not None:
        dump.write(prefix + ".dynamo.fx.txt", dump.fx_text(gm))
    cache_dir = None
    if prefix is None:
        from torchtpu.compile import executable_cache, graph_cache

        if graph_cache.usable(gm, example_inputs):
            cache_dir = executable_cache.directory()
    fw = _compiler("forward", prefix, cache_dir is not None)
    if cache_dir is not None:
        # AOTAutograd looks its cache up only for a compiler of this type
        from torch._functorch.aot_autograd import SerializableAOTDispatchCompiler

        from torchtpu.compile.graph_cache import TpuOutputCode

        fw = SerializableAOTDispatchCompiler(TpuOutputCode, fw)
    backend = aot_autograd(
        fw_compiler=fw,
        bw_compiler=_compiler("backward", prefix, cache_dir is not None),
        inference_compiler=_compiler("inference", prefix, cache_dir is not None),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=decompositions(),
        keep_inference_input_mutations=True,
    )
    try:
        # (no CSE pass of AOTAutograd's partitioner: it imports Inductor's pattern
        # matcher and with it all of Inductor's lowerings, ~1 s of a process's first
        # compile; XLA eliminates common subexpressions in each program anyway)
        with functorch_config.patch(cse=False):
            if cache_dir is None:
                return backend(gm, example_inputs)
            with graph_cache.active(cache_dir):
                return backend(gm, example_inputs)
    except Exception as e:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        if isinstance(e, GuardOnDataDependentSymNode):
            # AOTAutograd (a decomposition) branched on a value read from a tensor
            # (narrow with a tensor start, ...): a graph of static shapes cannot take it
            raise NotImplementedError(
                f"torchtpu: a torch.compile graph on the tpu device branches on a value that "
                f"depends on tensor values, which one XLA executable with static shapes "
                f"cannot take: {str(e).splitlines()[0]}") from e
        raise
    finally:
        c["tracing_seconds"] += (time.perf_counter() - t0) - (
            c["lowering_seconds"] + c["xla_seconds"] - before)
