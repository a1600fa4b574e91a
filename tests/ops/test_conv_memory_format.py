"""A convolution's (and a reflection/replication pad's) output lies in memory as CPU lays
it out: channels_last (channels_last_3d) when the input or the weight is in that format
(CPU's oneDNN and slow kernels both; PyTorch's meta kernel looks at the input only, off
CUDA, so tpu gave a contiguous output for a channels_last model)."""

import copy


import _budget
import pytest
import torch

CL = {4: torch.channels_last, 5: torch.channels_last_3d}


def _module(kind):
    torch.manual_seed(0)
    return {"conv2d": lambda: torch.nn.Conv2d(4, 5, 3, padding=1),
            "conv2d_groups": lambda: torch.nn.Conv2d(4, 4, 3, groups=4),
            "conv_transpose2d": lambda: torch.nn.ConvTranspose2d(4, 5, 3, stride=2),
            "conv3d": lambda: torch.nn.Conv3d(4, 5, 3)}[kind]()


# (conv2d_groups and conv3d with TORCHTPU_FULL_TESTS=1: CI's time budget)
@pytest.mark.parametrize("kind", ["conv2d", "conv2d_groups", "conv_transpose2d", "conv3d"]
                         if _budget.FULL else ["conv2d", "conv_transpose2d"])
@pytest.mark.parametrize("input_cl", [False, True])
@pytest.mark.parametrize("weight_cl", [False, True])
# a batch of 1 with TORCHTPU_FULL_TESTS=1 (CI's time budget)
@pytest.mark.parametrize("batched", [2, 1, False] if _budget.FULL else [2, False])
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


@pytest.mark.parametrize("kind", ["ReflectionPad2d", "ReplicationPad2d", "ReflectionPad3d",
                                  "ReplicationPad3d"])
@pytest.mark.parametrize("batch", [1, 2])
def test_reflection_and_replication_pads_keep_channels_last_as_cpu(kind, batch):
    # PyTorch's meta kernel gave a contiguous output; CPU keeps the input's channels_last
    m = getattr(torch.nn, kind)((1, 2, 0, 1) + ((1, 0) if kind.endswith("3d") else ()))
    nd = 5 if kind.endswith("3d") else 4
    x = torch.randn((batch, 3) + (4,) * (nd - 2)).contiguous(memory_format=CL[nd])
    x.requires_grad_()
    want = m(x)
    want.sum().backward()
    xt = x.detach().to("tpu").requires_grad_()
    got = m(xt)
    got.sum().backward()
    assert got.stride() == want.stride()
    assert torch.equal(got.cpu(), want) and torch.equal(xt.grad.cpu(), x.grad)


@pytest.mark.parametrize("kind", ["ReflectionPad3d", "ReplicationPad3d"])
def test_unbatched_3d_pad_of_a_channels_last_input_keeps_it_as_cpu(kind):
    m = getattr(torch.nn, kind)(1)
    x = torch.randn(3, 4, 5, 6).contiguous(memory_format=torch.channels_last)
    got, want = m(x.to("tpu")), m(x)
    assert got.stride() == want.stride() and torch.equal(got.cpu(), want)
