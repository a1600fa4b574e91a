"""``multilabel_margin_loss`` (forward and backward) vs CPU.

Found by the module_db sweep (``python -m torchtpu.conformance modules``):
``nn.MultiLabelMarginLoss(reduction='none')`` on a vector input returned shape (1,) where
CPU returns a scalar, and every backward was unsupported
(``aten.multilabel_margin_loss_backward`` had no lowering).  Minimizing it showed a wrong
value too: PyTorch's ``torch._decomp`` version, which tpu ran, also sums the label slots
after a row's first -1 (input [10], target ``[3, 0, -1, 1, 2, 0, ...]``: CPU 0.2568, tpu
0.4944).  Both ops now have lowerings of their own (``torchtpu/ops/nn.py``).
"""

import pytest
import torch


def _cases():
    g = torch.Generator().manual_seed(0)
    yield torch.randn(10, generator=g), torch.tensor([3, 0, -1, 1, 2, 0, 0, 0, 0, 0])
    yield torch.randn(3, 10, generator=g), torch.tensor([[3, 0, -1, 1, 2, 0, 0, 0, 0, 0],
                                                         [1, 2, 3, 4, 5, 6, 7, 8, 9, 0],
                                                         [-1, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    yield torch.randn(5, 10, generator=g), torch.randint(0, 10, (5, 10), generator=g)
    yield torch.randn(4, 6, generator=g), torch.tensor([[5, 5, -1, 0, 0, 0]] * 4)  # repeat
    yield torch.randn((), generator=g), torch.tensor(0)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("case", range(5))
def test_multilabel_margin_loss_matches_cpu(case, reduction):
    x, t = list(_cases())[case]
    res = []
    for dev in ("cpu", "tpu"):
        xi = x.clone().to(dev).requires_grad_()
        out = torch.nn.functional.multilabel_margin_loss(xi, t.to(dev), reduction=reduction)
        cot = torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape).to(dev)
        (gx,) = torch.autograd.grad(out, xi, cot)
        res.append((out.detach().cpu(), gx.cpu()))
    (co, cg), (to, tg) = res
    assert to.shape == co.shape
    torch.testing.assert_close(to, co)
    torch.testing.assert_close(tg, cg)


def test_multilabel_margin_loss_forward_is_target_matches_cpu():
    x, t = list(_cases())[1]
    c = torch.ops.aten.multilabel_margin_loss_forward(x, t, 0)
    d = torch.ops.aten.multilabel_margin_loss_forward(x.to("tpu"), t.to("tpu"), 0)
    for a, b in zip(d, c):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a.cpu(), b)
