"""Whole-buffer host->tpu uploads without the dispatcher (``eager.handlers.upload_into``,
``upload_changed``), as runtimes that re-send host buffers every step use them: the
values must be ``copy_``'s, and a skipped upload must never leave stale values."""

import torch

import torchtpu
from torchtpu.eager.handlers import upload_changed, upload_into


def _sent():
    return torchtpu.metrics()["transfers_to_device_bytes"]


def test_upload_into_gives_copy_values_and_falls_back_for_views_and_casts():
    dst = torch.zeros(6, dtype=torch.int32, device="tpu")
    src = torch.arange(6, dtype=torch.int32)
    assert upload_into(dst, src) is dst
    assert torch.equal(dst.cpu(), src)
    src[0] = 7  # (the upload is a copy: a later host write does not reach it)
    assert dst[0].item() == 0
    # a view of a larger storage and a dtype change take copy_'s path, with its values
    big = torch.zeros(10, dtype=torch.int64, device="tpu")
    upload_into(big[2:8], src)
    expect = torch.zeros(10, dtype=torch.int64)
    expect[2:8] = src
    assert torch.equal(big.cpu(), expect)
    w = torch.zeros(3, requires_grad=True, device="tpu")
    with torch.no_grad():
        upload_into(w, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(w.detach().cpu(), torch.tensor([1.0, 2.0, 3.0]))


def test_upload_changed_skips_only_what_the_device_still_holds():
    held = {}
    dst = torch.zeros(512, dtype=torch.int32, device="tpu")
    src = torch.arange(512, dtype=torch.int32)
    upload_changed(dst, src, held)
    b = _sent()
    upload_changed(dst, src, held)  # same values, same device array: nothing sent
    assert _sent() == b and torch.equal(dst.cpu(), src)
    src[3] = -1  # new host values: sent
    upload_changed(dst, src, held)
    assert _sent() > b and torch.equal(dst.cpu(), src)
    dst.add_(1)  # a device write since: the same host values are sent again
    upload_changed(dst, src, held)
    assert torch.equal(dst.cpu(), src)
    dst.copy_(torch.zeros(512, dtype=torch.int32))  # a copy_ too
    upload_changed(dst, src, held)
    assert torch.equal(dst.cpu(), src)
    # a dtype numpy lacks goes through copy_ (bfloat16)
    h = torch.randn(8).to(torch.bfloat16)
    d = torch.zeros(8, dtype=torch.bfloat16, device="tpu")
    upload_changed(d, h, held)
    upload_changed(d, h, held)
    assert torch.equal(d.cpu(), h)
