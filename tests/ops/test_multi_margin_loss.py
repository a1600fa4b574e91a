"""``multi_margin_loss`` (forward and backward) vs CPU.

Found by the module_db sweep (``python -m torchtpu.conformance modules``): every
``nn.MultiMarginLoss`` backward was unsupported (``aten.multi_margin_loss_backward`` had
no lowering); and a vector input with ``reduction='none'`` gave shape (1,) where CPU gives
a scalar (PyTorch's decomposition and meta kernel).  Both ops now have lowerings of their
own (``torchtpu/ops/nn.py``).
"""

import itertools

import _budget
import pytest
import torch


def _cases():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(5, 10, generator=g), torch.randint(0, 10, (5,), generator=g)),
            (torch.randn(10, generator=g), torch.tensor(3)),
            (torch.randn(4, 3, generator=g) * 0.1, torch.tensor([0, 1, 2, 1]))]


# margin 0.5 with TORCHTPU_FULL_TESTS=1 (CI's time budget)
@pytest.mark.parametrize("case,reduction,p,margin,weighted", list(itertools.product(
    range(3), ["none", "mean", "sum"], [1, 2], [1.0, 0.5] if _budget.FULL else [1.0],
    [False, True])))
def test_multi_margin_loss_matches_cpu(case, reduction, p, margin, weighted):
    x, t = _cases()[case]
    w = torch.linspace(0.2, 2.0, x.shape[-1]) if weighted else None
    res = []
    for dev in ("cpu", "tpu"):
        xi = x.clone().to(dev).requires_grad_()
        out = torch.nn.functional.multi_margin_loss(
            xi, t.to(dev), p=p, margin=margin, weight=None if w is None else w.to(dev),
            reduction=reduction)
        cot = torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape).to(dev)
        (gx,) = torch.autograd.grad(out, xi, cot)
        res.append((out.detach().cpu(), gx.cpu()))
    (co, cg), (to, tg) = res
    assert to.shape == co.shape
    torch.testing.assert_close(to, co)
    torch.testing.assert_close(tg, cg)
