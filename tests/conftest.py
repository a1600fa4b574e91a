"""Shared test setup: every test starts in the default eager mode with a clean sync log."""

import pytest
import torch

import torchtpu  # noqa: F401


@pytest.fixture(params=["strict", "debug", "defer_and_fuse"])
def eager_mode(request):
    """Run the test body in each eager mode (``torch.tpu.set_eager_mode``)."""
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


@pytest.fixture
def no_stored_executables(monkeypatch):
    """Compile every executable in the test body instead of loading it from the on-disk
    caches that an earlier run of the same sources filled (the eager signature cache and
    the compiled-graph cache; JAX's own persistent cache still answers, after tracing):
    for tests that observe tracing, lowering or XLA compile times."""
    from torchtpu.eager import signature_cache

    signature_cache.set_enabled(False)
    monkeypatch.setenv("TORCHTPU_GRAPH_CACHE", "0")
    yield
    signature_cache.set_enabled(signature_cache._enabled_at_start)
