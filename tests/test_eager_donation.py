"""STRICT eager: a hot in-place signature donates the written storage's old array to XLA
(``executables.call_donating``).  The values must stay CPU's, and an array that anything but
the storage still holds (another tensor, the user through ``to_jax``/``from_jax``) must
never be donated away."""

import numpy as np
import pytest
import torch

import torchtpu
from torchtpu.eager import executables

pytestmark = pytest.mark.usefixtures("strict_mode", "sync_first_calls")  # STRICT's own

jnp = pytest.importorskip("jax.numpy")

CALLS = executables.DONATE_AFTER + 6  # well past the point where a signature donates


@pytest.fixture(autouse=True)
def donate_small_storages(monkeypatch, request):
    """These tests use small storages: let them donate (the default needs 64 KiB), and
    forget earlier decisions not to donate for signatures other tests met first."""
    if request.node.name in ("test_small_storages_copy_and_large_ones_donate",
                             "test_defer_donates_large_written_storages_the_same_way_every_time"):
        yield
        return
    monkeypatch.setattr(executables, "DONATE_MIN_BYTES", 0)
    for ex in list(executables.CACHE.values()):
        if ex.donating is False:
            ex.donating = None
    yield


def test_small_storages_copy_and_large_ones_donate():
    # the default threshold: a 4 KiB storage's in-place loop never donates (its copy is
    # cheaper than a second executable), a 256 KiB one does; both match CPU
    assert 4096 < executables.DONATE_MIN_BYTES <= 65536 * 4
    for n in (1024, 65536):
        x_c = torch.zeros(n)
        x_t = x_c.to("tpu")
        before = _donated()
        for k in range(CALLS):
            x_c.add_(k)
            x_t.add_(k)
        assert torch.equal(x_t.cpu(), x_c)
        if n * 4 < executables.DONATE_MIN_BYTES:
            assert _donated() == before, n
        else:
            assert _donated() > before, n


def _donated():
    return torchtpu.metrics()["donated_buffers"]


def test_row_assignment_loop_donates_and_matches_cpu():
    torch.manual_seed(0)
    src_c = torch.rand(40, 4, 3)
    idx = torch.randint(0, 16, (40,)).tolist()
    x_c = torch.zeros(16, 4, 3)
    x_t = x_c.to("tpu")
    src_t = src_c.to("tpu")
    before = _donated()
    for i in range(40):
        x_c[idx[i], :, :] = src_c[i, :, :]
        x_t[idx[i], :, :] = src_t[i, :, :]
        x_c.add_(0.5)
        x_t.add_(0.5)
    torch.tpu.synchronize()
    assert torch.equal(x_t.cpu(), x_c)
    assert _donated() > before


def test_views_of_a_donated_storage_see_every_update():
    base_c = torch.zeros(10, 4)
    base_t = base_c.to("tpu")
    row_c, row_t = base_c[3], base_t[3]
    col_c, col_t = base_c[:, 1], base_t[:, 1]
    for _ in range(CALLS):
        row_c.add_(1)
        row_t.add_(1)
        col_c.mul_(1.5)
        col_t.mul_(1.5)
    assert torch.equal(base_t.cpu(), base_c)
    assert torch.equal(row_t.cpu(), row_c)
    assert torch.equal(col_t.cpu(), col_c)


def test_another_tensor_sharing_the_array_keeps_its_values():
    # equal small host tensors copied to tpu share one device array (a by-value cache)
    # that array is written first by a signature that already donates (warmed up on
    # another tensor)
    warm = torch.zeros(4, device="tpu")
    for _ in range(CALLS):
        warm.mul_(2)
    vals = torch.arange(4, dtype=torch.float32)
    a, b = vals.to("tpu"), vals.to("tpu")
    a.mul_(2)
    assert torch.equal(a.cpu(), vals * 2)
    assert torch.equal(b.cpu(), vals)


def test_arrays_the_user_holds_are_never_donated():
    arr = jnp.arange(6, dtype=jnp.float32)
    t = torchtpu.from_jax(arr)  # zero copy: the tensor's storage holds `arr` itself
    ref = torch.arange(6, dtype=torch.float32)
    held = []
    for i in range(CALLS):
        t.add_(1)
        ref.add_(1)
        if i == CALLS // 2:
            held.append((torchtpu.to_jax(t), ref.clone()))
    np.testing.assert_array_equal(np.asarray(arr), np.arange(6, dtype=np.float32))
    for h, r in held:
        np.testing.assert_array_equal(np.asarray(h), r.numpy())
    assert torch.equal(t.cpu(), ref)


def test_out_argument_in_a_loop_matches_cpu():
    a_c = torch.randn(8, 5)
    out_c = torch.empty(8, 5)
    a_t, out_t = a_c.to("tpu"), torch.empty(8, 5, device="tpu")
    for k in range(CALLS):
        torch.add(a_c, k, out=out_c)
        torch.add(a_t, k, out=out_t)
        assert torch.equal(out_t.cpu(), out_c)


def test_autograd_still_sees_an_in_place_change_of_a_saved_tensor():
    w = torch.randn(3, device="tpu", requires_grad=True)
    x = torch.randn(3, device="tpu")
    for _ in range(CALLS):
        x.add_(1)
    y = (w * x).sum()
    x.add_(1)  # x was saved for backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_defer_donates_large_written_storages_the_same_way_every_time():
    # DEFER_AND_FUSE: a segment's in-place write of a large storage (a KV cache's
    # index_put_) donates its old array whether or not something else still holds it
    # (then copied first), so the fused program's donations, part of its key, do not
    # depend on reference counts at the flush; what the user holds keeps its values
    n = 65536  # float32 elements: 256 KiB, above the threshold
    assert n * 4 >= executables.DONATE_MIN_BYTES
    ref = torch.zeros(n)
    idx_c = torch.tensor([0, 5, n - 1])
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        t = ref.to("tpu")
        idx = idx_c.to("tpu")
        held = []
        for step in range(3):
            if step == 1:
                held.append((torchtpu.to_jax(t), ref.clone()))
            before = torchtpu.metrics()
            t.index_put_((idx,), torch.full((3,), float(step + 1), device="tpu"))
            ref.index_put_((idx_c,), torch.full((3,), float(step + 1)))
            torch.tpu.synchronize()
            after = torchtpu.metrics()
            assert after["donated_buffers"] > before["donated_buffers"], step
            copies = after["compile"]["donation_copies"] - before["compile"]["donation_copies"]
            assert copies == (1 if step == 1 else 0), (step, copies)
        assert torch.equal(t.cpu(), ref)
    for h, r in held:
        np.testing.assert_array_equal(np.asarray(h), r.numpy())
