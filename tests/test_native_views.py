"""as_strided / view on tpu run PyTorch's own C++ kernels once the native helper is loaded
(torchtpu._tensor.native): same sizes, strides, offsets and storage sharing as CPU, and
in-place writes through those views reach the base."""

import pytest
import torch

import torchtpu
from torchtpu._tensor import native


@pytest.fixture(scope="module")
def native_views():
    try:
        native.module()  # builds once per machine; registers the C++ view kernels
    except NotImplementedError as e:
        pytest.skip(f"native helper cannot be built here: {e}")


def _views(x):
    return [x[1], x[:, 2], x[1, 1:3], x.view(6, 4), x.view(-1)[5:17:3], x.transpose(0, 2),
            x.as_strided((2, 2), (1, 3), 4), x.unflatten(2, (2, 2)), x[..., 1].t()]


def test_views_match_cpu_without_python(native_views):
    base_c = torch.arange(24.0).reshape(2, 3, 4)
    base_t = base_c.to("tpu")
    before = torchtpu.metrics()["view_ops"]
    vs_t = _views(base_t)
    assert torchtpu.metrics()["view_ops"] == before  # none went through Python
    for v_c, v_t in zip(_views(base_c), vs_t):
        assert v_t.device.type == "tpu"
        assert (v_t.shape, v_t.stride(), v_t.storage_offset()) == \
            (v_c.shape, v_c.stride(), v_c.storage_offset())
        assert v_t.untyped_storage().data_ptr() == base_t.untyped_storage().data_ptr()
        assert torch.equal(v_t.cpu(), v_c)


def test_writes_through_native_views_reach_the_base(native_views):
    base_c = torch.zeros(2, 3, 4)
    base_t = base_c.to("tpu")
    for v_c, v_t in zip(_views(base_c), _views(base_t)):
        v_c.add_(1.5)
        v_t.add_(1.5)
    assert torch.equal(base_t.cpu(), base_c)


def test_view_errors_are_cpus(native_views):
    x_c, x_t = torch.zeros(2, 3), torch.zeros(2, 3, device="tpu")
    with pytest.raises(RuntimeError) as cpu_err:
        x_c.t().view(6)
    with pytest.raises(RuntimeError) as tpu_err:
        x_t.t().view(6)
    assert str(tpu_err.value) == str(cpu_err.value)
