"""``nll_loss_backward`` / ``nll_loss2d_backward`` with ``ignore_index`` vs CPU.

Found by the module_db sweep (``python -m torchtpu.conformance modules``):
``nn.CrossEntropyLoss(reduction='mean', ignore_index=1)`` on a [2, 3] input whose two
targets are both 1.  The loss is 0/0 = NaN on both devices, but CPU's input gradient is
all zeros (ignored elements are skipped) while tpu's had NaN in the ignored class column
(``-0 * grad / total_weight`` with ``total_weight`` 0); ignored rows also got -0.0 where CPU
has +0.0.
"""

import pytest
import torch


def _grad(dev, x, target, ignore_index, reduction, weight=None):
    xi = x.clone().to(dev).requires_grad_()
    w = weight.to(dev) if weight is not None else None
    loss = torch.nn.functional.cross_entropy(xi, target.to(dev), weight=w,
                                             ignore_index=ignore_index, reduction=reduction)
    cot = torch.full(loss.shape, 0.7).to(dev)
    (g,) = torch.autograd.grad(loss, xi, cot)
    return loss.detach().cpu(), g.cpu()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape,target", [
    ((2, 3), [1, 1]),                       # every element ignored: total_weight 0
    ((2, 3), [0, 1]),                       # one ignored row
    ((2, 3, 4), [[1, 1, 1, 1], [1, 1, 1, 1]]),  # nll_loss2d-style (class dim 1), all ignored
    ((2, 3, 4), [[0, 1, 2, 1], [2, 1, 1, 0]]),
])
def test_cross_entropy_ignore_index_grad_matches_cpu(shape, target, reduction):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    t = torch.tensor(target)
    cl, cg = _grad("cpu", x, t, 1, reduction)
    tl, tg = _grad("tpu", x, t, 1, reduction)
    torch.testing.assert_close(tl, cl, equal_nan=True)
    torch.testing.assert_close(tg, cg, equal_nan=True)
    assert torch.equal(tg.signbit(), cg.signbit())  # +0 where CPU has +0


def test_nll_loss_all_ignored_with_weight_matches_cpu():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    w = torch.rand(4)
    t = torch.tensor([2, 2, 2])
    cl, cg = _grad("cpu", x, t, 2, "mean", w)
    tl, tg = _grad("tpu", x, t, 2, "mean", w)
    assert torch.isnan(cl) and torch.isnan(tl)
    torch.testing.assert_close(tg, cg, equal_nan=True)
    assert not torch.isnan(tg).any()
