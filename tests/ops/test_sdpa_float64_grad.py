"""float64 ``scaled_dot_product_attention`` gradients vs CPU at float64 accuracy.

Found by the module_db sweep (``python -m torchtpu.conformance modules``): every float64
``nn.TransformerEncoderLayer`` / ``TransformerDecoderLayer`` / ``Transformer`` sample had
``self_attn.in_proj_weight`` gradients ~1e-7 away from CPU's (float32 accuracy), forward
exact.  Cause: the fused kernel's log-sum-exp (saved for the backward, which recomputes
the probabilities from it) was float32 whatever the input dtype; it is float64 for float64
inputs now, as in CPU's kernels.
"""

import pytest
import torch


def _run(dev, q, k, v, cot, **kw):
    qs = [t.clone().to(dev).requires_grad_() for t in (q, k, v)]
    o = torch.nn.functional.scaled_dot_product_attention(*qs, **kw)
    gs = torch.autograd.grad(o, qs, cot.to(dev))
    return [o.detach().cpu()] + [g.cpu() for g in gs]


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"mask": True}])
def test_sdpa_float64_grads_match_cpu(kw):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    cot = torch.randn(2, 2, 5, 4, dtype=torch.float64)
    if kw.pop("mask", False):
        kw["attn_mask"] = torch.randn(5, 5, dtype=torch.float64)
    cpu = _run("cpu", q, k, v, cot, **kw)
    if "attn_mask" in kw:
        kw["attn_mask"] = kw["attn_mask"].to("tpu")
    tpu = _run("tpu", q, k, v, cot, **kw)
    for name, a, b in zip(("out", "dq", "dk", "dv"), tpu, cpu):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, msg=name)


def test_transformer_encoder_layer_float64_weight_grad_matches_cpu():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(4, 2, 16, 0.0).double()
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    cot = torch.randn(2, 3, 4, dtype=torch.float64)
    grads = []
    for dev in ("cpu", "tpu"):
        m = __import__("copy").deepcopy(layer).to(dev)
        out = m(x.to(dev))
        (g,) = torch.autograd.grad(out, m.self_attn.in_proj_weight, cot.to(dev))
        grads.append(g.cpu())
    torch.testing.assert_close(grads[1], grads[0], atol=1e-12, rtol=1e-10)
