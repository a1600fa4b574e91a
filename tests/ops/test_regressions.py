"""Regressions found by trying to break the backend like a user; each vs CPU."""

import torch


def both(fn):
    return fn("cpu"), fn("tpu")


def test_batchnorm_backward_when_input_needs_no_grad():
    def run(dev):
        torch.manual_seed(0)
        bn = torch.nn.BatchNorm2d(3).to(dev)
        x = torch.randn(4, 3, 5, 5).to(dev)  # a first layer: input needs no grad
        bn(x).pow(2).sum().backward()
        return bn.weight.grad.cpu(), bn.bias.grad.cpu(), bn.running_mean.cpu()

    c, t = both(run)
    for a, b in zip(c, t):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-5)


def test_sign_of_nan_and_negative_zero():
    c, t = both(lambda d: torch.sign(torch.tensor([float("nan"), -0.0, -2.0, 3.0], device=d)))
    assert t.cpu().tolist() == c.tolist()


def test_shift_operators():
    def run(d):
        x = torch.tensor([1, -8, 3, 100], device=d)
        return [(x << 2).cpu(), (x >> 1).cpu(), (x << torch.tensor([1, 2, 3, 70], device=d)).cpu()]

    c, t = both(run)
    for a, b in zip(c, t):
        assert torch.equal(a, b)
