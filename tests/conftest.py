"""Shared test setup: every test starts in the default eager mode with a clean sync log."""

import pytest
import torch

import torchtpu  # noqa: F401


@pytest.fixture(params=["strict", "debug", "defer_and_fuse"])
def eager_mode(request):
    """Run the test body in each eager mode (``torch.tpu.set_eager_mode``)."""
    with torch.tpu.set_eager_mode(request.param):
        yield request.param
