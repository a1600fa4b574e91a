"""Shared test setup: every test starts in the default eager mode with a clean sync log."""

import pytest
import torch

import torchtpu  # noqa: F401

import _budget


# The modes an ``eager_mode`` test runs in.  The default run (CI's time budget) takes
# STRICT, and DEFER_AND_FUSE in the modules that set ``DEFER_BY_DEFAULT = True`` (those
# about semantics: views, versions, hooks, failed checks) and in every sixth OpInfo op;
# DEBUG runs STRICT's executables with a wait and checks after each op
# (tests/test_eager_modes.py and the OpInfo sweep's own modes test it).
# TORCHTPU_FULL_TESTS=1 runs every mode-parametrized test in all three.
EAGER_MODES = ["strict", "debug", "defer_and_fuse"] if _budget.FULL else ["strict"]


def pytest_generate_tests(metafunc):
    if "eager_mode" in metafunc.fixturenames:
        modes = list(EAGER_MODES)
        if getattr(metafunc.module, "DEFER_BY_DEFAULT", False) and "defer_and_fuse" not in modes:
            modes.append("defer_and_fuse")
        metafunc.parametrize("eager_mode", modes, indirect=True)


@pytest.fixture
def eager_mode(request):
    """Run the test body in each eager mode of ``EAGER_MODES`` (``torch.tpu.set_eager_mode``);
    see ``pytest_generate_tests`` above."""
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


@pytest.fixture
def strict_mode(monkeypatch):
    """STRICT for the test body and for the processes it starts: for tests of STRICT's own
    per-op machinery (shape buckets, compile tiers, the signature cache, donation of hot
    in-place signatures), which DEFER_AND_FUSE and DEBUG do not use.  The suite runs with
    ``TORCHTPU_EAGER_MODE`` set to each mode; these tests then still test STRICT."""
    monkeypatch.setenv("TORCHTPU_EAGER_MODE", "strict")
    with torch.tpu.set_eager_mode("strict"):
        yield


@pytest.fixture
def sync_first_calls(monkeypatch):
    """First calls compile on the calling thread (``eager.async_compile`` off) for the
    test body and the processes it starts: for tests that count what STRICT's hot path or
    donation did in a short loop.  With asynchronous first calls, a loop shorter than the
    first compile runs queued on a worker (correct values, no hot path, no donation)
    until the compile ends; ``tests/test_async_compile.py`` tests that mode."""
    from torchtpu.eager import async_compile

    monkeypatch.setenv("TORCHTPU_COMPILE_WORKERS", "0")
    prev = async_compile.workers()
    async_compile.set_workers(0)
    yield
    async_compile.set_workers(prev)


@pytest.fixture
def no_cpu_fallback(monkeypatch):
    """The CPU fallback off for the test body (an op without a lowering raises), and a
    failure if any op took it anyway (``metrics()["fallbacks"]`` stays empty): for tests
    that claim a library's path runs on the device."""
    monkeypatch.setattr(torch.tpu, "enable_cpu_fallback", False)
    torchtpu.reset_metrics()
    yield
    assert not torchtpu.metrics()["fallbacks"]


@pytest.fixture
def fresh_shape_buckets():
    """Forget which ops the shape buckets saw churning (``buckets.set_policy()``) and which
    families and lengths padded sequences saw (``padded.forget()``), before and after the
    test body: for tests that count compiles or cache hits of one op, or that expect an
    op to run as a plain new signature.  These decisions are process-wide, so an op that
    an earlier test in the same worker ran at many shapes runs a new signature bucketed
    first (one more compile and a host sync), and a fill whose length an earlier test's
    token ids had (``torch.ones(64, 32)`` after ids of length 64) is padded: its ops then
    run on the capacity and mask the result, which waits for a pending input."""
    from torchtpu.eager import buckets, padded

    buckets.set_policy()
    padded.forget()
    yield
    buckets.set_policy()
    padded.forget()


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


@pytest.fixture
def capture_data_dependent_ops():
    """Dynamo captures ``item()`` and data-dependent output shapes (``nonzero``, boolean
    masks) into the graph, with a fresh Dynamo state before and after the test."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=True,
                                    capture_dynamic_output_shape_ops=True):
        yield
    torch._dynamo.reset()
