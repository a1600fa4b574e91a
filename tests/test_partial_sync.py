"""A host read that waits only for the work dispatched before a mark
(``inflight.mark`` / ``host_reads.to_numpy(..., checks_upto=mark)``): what the vLLM
plugin's asynchronous scheduling reads a step's sampled ids with, while the next step
already runs.  Device-side check failures before the mark raise at that read, as at any
sync point; failures after it stay queued for the next full sync point."""

import numpy as np
import pytest
import torch

from torchtpu.eager import host_reads, inflight

MODES = ["strict", "defer_and_fuse"]  # (DEBUG raises at the failing call itself)


def _bad_index():
    # an index computed on the device (no host copy to check it against at the call):
    # its bounds are checked on the device and reported at a sync point
    return torch.tensor([3], device="tpu") + 4


@pytest.mark.parametrize("mode", MODES)
def test_a_read_up_to_a_mark_raises_a_failure_dispatched_before_it(mode):
    with torch.tpu.set_eager_mode(mode):
        x = torch.arange(4.0, device="tpu")
        x[_bad_index()]  # out of range for 4 elements
        mark = inflight.mark()
        with pytest.raises(IndexError, match="detected on the device"):
            host_reads.to_numpy(x, "test", checks_upto=mark)
        torch.tpu.synchronize()  # (reported once: nothing left queued)


@pytest.mark.parametrize("mode", MODES)
def test_a_read_up_to_a_mark_leaves_later_failures_to_the_next_sync(mode):
    with torch.tpu.set_eager_mode(mode):
        x = torch.arange(4.0, device="tpu")
        y = x * 3 + 1
        mark = inflight.mark()
        bad = x[_bad_index()]  # dispatched after the mark
        got = host_reads.to_numpy(y, "test", checks_upto=mark)
        np.testing.assert_array_equal(got, (torch.arange(4.0) * 3 + 1).numpy())
        with pytest.raises(IndexError, match="detected on the device"):
            bad.cpu()
        torch.tpu.synchronize()


@pytest.mark.parametrize("mode", MODES)
def test_a_mark_taken_with_nothing_queued_verifies_nothing_later(mode):
    with torch.tpu.set_eager_mode(mode):
        torch.tpu.synchronize()
        mark = inflight.mark()
        x = torch.arange(4.0, device="tpu")
        bad = x[_bad_index()]
        np.testing.assert_array_equal(host_reads.to_numpy(x, "test", checks_upto=mark),
                                      np.arange(4.0, dtype=np.float32))
        with pytest.raises(IndexError):
            torch.tpu.synchronize()
        del bad
