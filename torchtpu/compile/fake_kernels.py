"""Fake-tensor kernels for ``tpu`` inputs where PyTorch's meta kernel is stricter than what
the op accepts on tpu (and on CPU).

Dynamo and AOTAutograd propagate shapes with fake tensors, which run PyTorch's meta
kernels.  ``aten._grouped_mm``'s meta kernel restates the CUDA kernel's checks and refuses
every dtype but bfloat16, while CPU's kernel and torchtpu's lowering compute float32 and
float16 too.  transformers 5.x calls ``torch._grouped_mm`` for its mixture-of-experts
layers whenever the weights are on a device named "tpu", also under ``torch.compile``, so
compiling such a model in float32 failed in Dynamo ("Expected inputs of BF16 type").
Here a fake kernel answers for ``tpu`` inputs of other dtypes, with the lowering's own
meta function (the output of PyTorch's ``_create_grouped_mm_output_tensor`` in the
inputs' dtype, or ``out_dtype``).  Inputs on other devices, and bfloat16 ones, keep PyTorch's meta kernel.

A few ops have no meta kernel at all (``geqrf``, ``histogram``, ``histogramdd``'s pieces,
the fused RNN cells ``_thnn_fused_gru_cell`` / ``_thnn_fused_lstm_cell`` and their backwards,
which ``torch.gru_cell`` / ``lstm_cell`` call on every device but the CPU):
for them PyTorch's fake tensor runs the real kernel on zeros of the fake device ("unsafe
fallback"), which cannot work for ``tpu`` fakes (no tpu storage behind them).  For tpu
inputs their fake results come from the CPU kernel run on zeros of the same shapes
(:func:`_cpu_shaped_fake`): their output shapes do not depend on the input values.  The
RNN cells' come from torchtpu's own decompositions run on the fakes themselves (so
symbolic batch sizes work).

Registered through ``torch._subclasses.fake_impls.register_op_impl`` (PyTorch's own
registry of special fake kernels, private) when that module is imported
(:mod:`torchtpu.compile.routing`'s import hook); where it is missing, nothing changes.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
_installed = False


def _is_grouped_mm(func) -> bool:
    return func is aten._grouped_mm.default


def _grouped_mm_fake(fake_mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Fake result of ``aten._grouped_mm`` on tpu for non-bfloat16 inputs (else
    ``NotImplemented``: PyTorch's meta kernel): the lowering's own meta function
    (``ops.linalg.grouped_mm_meta``, also used by the eager executor)."""
    if mat_a.device.type != "tpu" or (mat_a.dtype is torch.bfloat16
                                      and mat_b.dtype is torch.bfloat16):
        return NotImplemented
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    from torchtpu.ops.linalg import grouped_mm_meta

    with in_kernel_invocation_manager(fake_mode):
        meta = grouped_mm_meta(mat_a, mat_b, offs, bias, out_dtype)
    return FakeTensor(fake_mode, meta, mat_a.device)


def _cpu_shaped_ops() -> set:
    names = [("geqrf", "default"), ("histogram", "bin_ct"), ("histogram", "bins_tensor"),
             ("_histogramdd_bin_edges", "default"), ("_histogramdd_from_bin_cts", "default"),
             ("_histogramdd_from_bin_tensors", "default")]
    out = set()
    for name, ov in names:
        pkt = getattr(aten, name, None)
        if pkt is not None and hasattr(pkt, ov):
            out.add(getattr(pkt, ov))
    return out


# PyTorch's RNN cells call these fused kernels for every device but the CPU (CUDA's have no
# meta kernel, and there is no CPU kernel): their fakes come from torchtpu's own
# decompositions (``ops.decomp_overrides``, what eager and AOTAutograd run):
# :func:`_rnn_fused_fake`
_RNN_FUSED = {aten._thnn_fused_gru_cell.default, aten._thnn_fused_gru_cell_backward.default,
              aten._thnn_fused_lstm_cell.default,
              aten._thnn_fused_lstm_cell_backward_impl.default}
_CPU_SHAPED = _cpu_shaped_ops()


def _is_cpu_shaped(func) -> bool:
    return func in _CPU_SHAPED


def _cpu_shaped_fake(fake_mode, func, *args, **kwargs):
    """Fake result of an op without a meta kernel (:data:`_CPU_SHAPED`) on tpu inputs:
    PyTorch's CPU kernel run on zeros of the inputs' shapes and dtypes gives each
    output's shape, strides and dtype; the fakes are on the inputs' tpu device.  Inputs
    on other devices: ``NotImplemented`` (PyTorch's own fallback)."""
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager
    from torch.utils._python_dispatch import _disable_current_modes
    from torch.utils._pytree import tree_flatten, tree_map

    flat, _ = tree_flatten((args, kwargs))
    devs = {a.device for a in flat if isinstance(a, torch.Tensor)}
    tpu = [d for d in devs if d.type == "tpu"]
    if not tpu:
        return NotImplemented

    def to_cpu(a):
        if isinstance(a, torch.Tensor):
            return torch.zeros(tuple(a.shape), dtype=a.dtype)
        return a

    with _disable_current_modes():
        out = func(*tree_map(to_cpu, args), **tree_map(to_cpu, kwargs))

    def to_fake(r):
        if not isinstance(r, torch.Tensor):
            return r
        with in_kernel_invocation_manager(fake_mode):
            meta = torch.empty_strided(tuple(r.shape), tuple(r.stride()), dtype=r.dtype,
                                       device="meta")
        return FakeTensor(fake_mode, meta, tpu[0])

    return tree_map(to_fake, out)


def _is_rnn_fused(func) -> bool:
    return func in _RNN_FUSED


def _rnn_fused_fake(fake_mode, func, *args, **kwargs):
    """Fake result of a fused RNN cell (:data:`_RNN_FUSED`) on tpu inputs: torchtpu's
    decomposition run on the fakes themselves (symbolic sizes included: a second batch
    size, ``dynamic=True``).  Inputs on other devices: ``NotImplemented``."""
    from torch.utils._pytree import tree_flatten

    from torchtpu.ops.decomp_overrides import table

    flat, _ = tree_flatten((args, kwargs))
    if not any(isinstance(a, torch.Tensor) and a.device.type == "tpu" for a in flat):
        return NotImplemented
    with fake_mode:
        return table()[func](*args, **kwargs)


def install(fake_impls) -> None:
    """Register the kernels above in PyTorch's fake-kernel registry ``fake_impls``
    (idempotent)."""
    global _installed
    if _installed or not hasattr(fake_impls, "register_op_impl"):
        return
    _installed = True
    fake_impls.register_op_impl(_is_grouped_mm)(_grouped_mm_fake)
    fake_impls.register_op_impl(_is_cpu_shaped)(_cpu_shaped_fake)
    fake_impls.register_op_impl(_is_rnn_fused)(_rnn_fused_fake)
