"""A convolution's output lies in memory as CPU lays it out: channels_last
(channels_last_3d) when the input or the weight is in that format (CPU's oneDNN and slow
kernels both; PyTorch's meta kernel looks at the input only, off CUDA, so tpu gave a
contiguous output for a channels_last model)."""

import copy

import pytest
import torch

CL = {4: torch.channels_last, 5: torch.channels_last_3d}


def _module(kind):
    torch.manual_seed(0)
    return {"conv2d": lambda: torch.nn.Conv2d(4, 5, 3, padding=1),
            "conv2d_groups": lambda: torch.nn.Conv2d(4, 4, 3, groups=4),
            "conv_transpose2d": lambda: torch.nn.ConvTranspose2d(4, 5, 3, stride=2),
            "conv3d": lambda: torch.nn.Conv3d(4, 5, 3)}[kind]()


@pytest.mark.parametrize("kind", ["conv2d", "conv2d_groups", "conv_transpose2d", "conv3d"])
@pytest.mark.parametrize("input_cl", [False, True])
@pytest.mark.parametrize("weight_cl", [False, True])
@pytest.mark.parametrize("batched", [2, 1, False])
def test_convolution_output_strides_match_cpu(kind, input_cl, weight_cl, batched):
    m = _module(kind)
    nd = m.weight.dim()
    shape = (batched, 4) + (5,) * (nd - 2) if batched else (4,) + (5,) * (nd - 2)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    if input_cl and batched:
        x = x.contiguous(memory_format=CL[nd])
    if weight_cl:
        m = m.to(memory_format=CL[nd])
    x.requires_grad_()
    want = m(x)
    want.sum().backward()
    mt = copy.deepcopy(m).to("tpu")
    xt = x.detach().to("tpu").requires_grad_()
    got = mt(xt)
    got.sum().backward()
    assert got.shape == want.shape and got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mt.weight.grad.cpu(), m.weight.grad, rtol=1e-4, atol=1e-4)
