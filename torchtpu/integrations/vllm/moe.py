"""Mixture-of-experts layers of vLLM's models on ``tpu`` (vLLM 0.33).

vLLM leaves the fused MoE kernel of an out-of-tree platform to the platform (its
unquantized method selects the ``OOT`` backend and builds no kernel).  This module
registers, as that out-of-tree replacement (``CustomOp.register_oot``), a method whose
experts run in PyTorch ops, lowered like any other: vLLM's router picks each token's
top-k experts and weights, then every expert's gated MLP runs on every token of the step
(``einsum`` over the expert dimension) and the outputs are combined with the routing
weights (zero for the experts a token did not pick).  Equal to the sum over each token's
chosen experts (the math path); dense in the experts, so the FLOPs grow with the expert
count: a grouped (sorted by expert) path is the next step for large expert counts.

Supported: unquantized experts, gated activations SiLU/GELU (``gate * act``, vLLM's packed
``w13`` layout ``[gate; up]``), no expert parallelism (``expert_map``), router weights
applied to the output.  Anything else raises ``NotImplementedError`` naming it.
"""

from __future__ import annotations

import torch
from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)

_GATED = {
    MoEActivation.SILU: torch.nn.functional.silu,
    MoEActivation.GELU: torch.nn.functional.gelu,
    MoEActivation.GELU_TANH: lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
}


def experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
            topk_ids: torch.Tensor, activation=MoEActivation.SILU) -> torch.Tensor:
    """The routed experts' output ``[T, H]`` for tokens ``x`` ``[T, H]``: ``w13``
    ``[E, 2I, H]`` (gate rows then up rows), ``w2`` ``[E, H, I]``, ``topk_ids`` /
    ``topk_weights`` ``[T, k]`` (experts chosen per token and their weights).  Each
    token's output is ``sum_j topk_weights[t, j] * w2[e] @ (act(gate_e x) * up_e x)``
    over its chosen experts ``e = topk_ids[t, j]``, accumulated in ``x``'s dtype."""
    act = _GATED.get(activation)
    if act is None:
        raise NotImplementedError(
            f"torchtpu's vLLM MoE: activation {activation} is not supported on tpu yet "
            f"(gated {', '.join(a.value for a in _GATED)})")
    E = w13.shape[0]
    h = torch.einsum("th,eoh->teo", x, w13)  # [T, E, 2I]
    gate, up = h.chunk(2, dim=-1)
    y = torch.einsum("tei,ehi->teh", act(gate) * up, w2)  # [T, E, H]
    dense = torch.zeros(x.shape[0], E, dtype=topk_weights.dtype, device=x.device)
    dense = dense.scatter_add(1, topk_ids.to(torch.int64), topk_weights)
    return torch.einsum("te,teh->th", dense.to(y.dtype), y)


class TpuUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    """vLLM's unquantized MoE method with :func:`experts` as its kernel on tpu."""

    @property
    def is_monolithic(self) -> bool:  # (routing by vLLM's router, then the experts)
        return False

    def forward_oot(self, layer, x, topk_weights, topk_ids, shared_experts,
                    shared_experts_input):
        if getattr(layer, "expert_map", None) is not None:
            raise NotImplementedError("torchtpu's vLLM MoE: expert parallelism "
                                      "(expert_map) is not supported on tpu yet")
        if getattr(layer, "apply_router_weight_on_input", False):
            raise NotImplementedError("torchtpu's vLLM MoE: router weights applied to "
                                      "the input are not supported on tpu yet")
        if getattr(self.moe, "has_bias", False):
            raise NotImplementedError("torchtpu's vLLM MoE: expert biases are not "
                                      "supported on tpu yet")
        return experts(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids,
                       layer.activation)


def _topk(scores_fn):
    """vLLM's fused top-k routing (its ``topk_softmax``/``topk_sigmoid`` kernels) in
    PyTorch ops: each token's ``k`` highest-scoring experts (``k`` from ``topk_ids``'s
    shape), their float32 scores, renormalized to sum to 1 when asked."""

    def route(topk_weights, topk_ids, token_expert_indices, gating_output,
              renormalize=False):
        k = topk_ids.shape[-1]
        w, ids = scores_fn(gating_output.float()).topk(k, dim=-1)
        if renormalize:
            w = w / w.sum(dim=-1, keepdim=True)
        return w, ids.to(topk_ids.dtype)

    return route


_TOPK_SOFTMAX = _topk(lambda g: torch.softmax(g, dim=-1))
_TOPK_SIGMOID = _topk(torch.sigmoid)


def register() -> None:
    """Make :class:`TpuUnquantizedFusedMoEMethod` vLLM's unquantized MoE method in this
    process, and vLLM's fused top-k routing run in PyTorch ops (its kernels are CUDA
    extensions); idempotent."""
    from vllm.model_executor.layers.fused_moe.router import fused_topk_router as router

    if op_registry_oot.get("UnquantizedFusedMoEMethod") is not TpuUnquantizedFusedMoEMethod:
        op_registry_oot.pop("UnquantizedFusedMoEMethod", None)
        CustomOp.register_oot(name="UnquantizedFusedMoEMethod")(TpuUnquantizedFusedMoEMethod)
    router.dispatch_topk_softmax_func = lambda *a, **k: _TOPK_SOFTMAX
    router.dispatch_topk_sigmoid_func = lambda *a, **k: _TOPK_SIGMOID
