"""Backward passes that touch ``tpu`` tensors: run on the caller's thread, and mark the
DeferAndFuse segment boundaries of a training step.

PyTorch's autograd engine runs the backward of a non-CPU device on a per-device worker
thread that it creates in C++.  For a Python backend that costs a GIL hand-off and a
fresh Python thread state on every kernel call the worker makes (measured: per-op host
time ~1.5x that of the same op on the main thread), and the engine sizes its per-device
queues from the C++ device guard's device count, which a Python device guard cannot
report (backward on ``tpu:1`` hit an internal assert).  Running the graph task on the
calling thread — PyTorch's own ``torch.autograd.set_multithreading_enabled(False)``
behaviour, the same thread CPU backward uses — avoids both.  Results are unchanged: the
engine executes the same nodes in the same dependency order.

In DEFER_AND_FUSE mode the start and the end of a backward pass also end the pending
segment without a host sync (``metrics()["segment_cuts"]``: "backward" and
"backward_end"): the forward segment is dispatched while the host records the backward,
and the backward segment while it records the optimizer step.  The cut points repeat
every training step, so the compiled-segment cache keeps hitting.  A segment that holds a
compiled graph's call (``torchtpu.compile.graph``'s stitching) is not cut: the forward
graph, the backward graph and the update run as one program.

The first backward pass once tpu devices are in use installs torchtpu's C++ device guard
(:func:`torchtpu._tensor.native.install_device_guard`, built once per machine): with
PyTorch's Python device guard, an exception raised by a tensor or module hook during
``backward()`` aborts the process (the engine's stream guard calls into Python while it
unwinds, with the hook's Python error still set).
"""

from __future__ import annotations

import functools

import torch

from torchtpu._device import runtime

_orig = None
_guard_ready = False


def _has_tpu(t_outputs) -> bool:
    for t in t_outputs:
        if isinstance(t, torch.Tensor):
            if t.device.type == "tpu":
                return True
        else:  # a GradientEdge: (node, output_nr); look at the node's input metadata
            return True  # cannot cheaply tell; running on the caller's thread is safe
    return False


def _engine_run_backward(t_outputs, *args, **kwargs):
    global _guard_ready
    if not _guard_ready and runtime.devices.cache_info().currsize:
        # tpu devices are in use in this process, so this graph may hold tpu nodes even
        # when its outputs are on the CPU (``loss.cpu().backward()``)
        from torchtpu._tensor import native

        native.install_device_guard()  # warns once and goes on where it cannot be built
        _guard_ready = True
    if not _has_tpu(t_outputs):
        return _orig(t_outputs, *args, **kwargs)
    from torchtpu.eager import defer

    # (a segment holding compiled graphs goes on: forward, backward and update stitched)
    cut = defer.CUT_AT_BACKWARD and defer.pending_ops() and not defer.holds_graphs()
    if cut:
        defer.flush("backward", sync=False)
    try:
        with torch.autograd.set_multithreading_enabled(False):
            return _orig(t_outputs, *args, **kwargs)
    finally:  # also when backward raises: every "backward" cut has its "backward_end"
        if defer.CUT_AT_BACKWARD and defer.pending_ops() and not defer.holds_graphs():
            defer.flush("backward_end", sync=False)


def install() -> None:
    """Route ``torch.autograd.backward`` / ``torch.autograd.grad`` through
    :func:`_engine_run_backward` (idempotent)."""
    global _orig
    if _orig is not None:
        return
    import torch.autograd
    import torch.autograd.graph as graph

    _orig = graph._engine_run_backward
    wrapped = functools.wraps(_orig)(_engine_run_backward)
    graph._engine_run_backward = wrapped
    torch.autograd._engine_run_backward = wrapped  # torch.autograd imported the name
