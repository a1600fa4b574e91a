"""Compile tiers (torchtpu.eager.tiers): a signature's first use compiles at the quick
tier, its second use recompiles at the full tier; results never depend on the tier."""

import pytest
import torch

import torchtpu
from torchtpu.eager import buckets, tiers

pytestmark = pytest.mark.usefixtures("strict_mode")  # STRICT's own machinery

TPU = "tpu"

needs_quick_tier = pytest.mark.skipif(
    not tiers.platform_has_quick_tier(), reason="this platform has no quick compile tier")


@pytest.fixture(autouse=True)
def quick_tier_on():
    """The quick tier is opt-in (TORCHTPU_COMPILE_TIERS=1); these tests switch it on, and
    shape buckets off (they count one compile per shape; tests/test_shape_buckets.py
    covers buckets), and the on-disk signature cache off: a signature stored by an
    earlier run of the same sources would load instead of compiling.  The element-wise
    options are off too: on CPU they are the quick tier's options, so an element-wise op
    would compile once at the full tier (``test_elementwise_op_compiles_once...``)."""
    from torchtpu.eager import signature_cache

    before = tiers.enabled()
    tiers.set_enabled(True)
    tiers.set_elementwise_options(False)
    buckets.set_policy(enabled=False)
    signature_cache.set_enabled(False)
    yield
    signature_cache.set_enabled(signature_cache._enabled_at_start)
    tiers.set_enabled(before)
    tiers.set_elementwise_options(tiers._elementwise_default)
    buckets.set_policy(buckets.DEFAULT_ON, buckets.DEFAULT_AFTER)


@needs_quick_tier
def test_new_shape_of_simple_op_compiles_once_at_the_quick_tier():
    x = torch.randn(4, 37)
    t = x.to(TPU)
    torchtpu.reset_metrics()
    y = t.abs()  # a signature never seen: one quick compile, no full compile
    m = torchtpu.metrics()
    assert (m["compiles"], m["quick_compiles"], m["tier_ups"]) == (1, 1, 0), m
    assert m["quick_compile_seconds"] == m["compile_seconds"] > 0
    z = t.abs()  # used again: recompiled once at the full tier
    m = torchtpu.metrics()
    assert (m["compiles"], m["quick_compiles"], m["tier_ups"]) == (2, 1, 1), m
    assert m["tier_up_seconds"] > 0
    w = t.abs()  # from then on: the cache, no compile
    m = torchtpu.metrics()
    assert (m["compiles"], m["cache_hits"], m["cache_misses"]) == (2, 2, 1), m
    for r in (y, z, w):
        assert torch.equal(r.cpu(), x.abs())


@needs_quick_tier
def test_loop_over_shapes_never_tiers_up_and_matches_cpu(eager_mode):
    start = {"strict": 101, "debug": 201, "defer_and_fuse": 301}[eager_mode]
    torchtpu.reset_metrics()
    for n in range(start, start + 8):  # each shape once, as PyTorch's device tests loop
        a = torch.linspace(-3, 3, n, dtype=torch.float64)
        r = (a.to(TPU).exp() * 2 + 1).cpu()
        torch.testing.assert_close(r, a.exp() * 2 + 1, rtol=1e-12, atol=0)
    m = torchtpu.metrics()
    assert m["tier_ups"] == 0, m
    if eager_mode != "defer_and_fuse":  # segments compile once, fully (see eager.tiers)
        assert m["quick_compiles"] == m["compiles"] >= 8, m


@needs_quick_tier
def test_results_are_bitwise_the_same_at_both_tiers(eager_mode):
    # a seeded program replays the same numbers whether its ops ran quick-tier code
    # (first use) or fully optimized code (second use): here normal sampling and
    # transcendental functions, where optimization levels may round differently
    res = []
    for _ in range(3):
        torch.manual_seed(0)
        z = torch.randn(1000, device=TPU)
        res.append(torch.cat([z, z.exp(), torch.tanh(z), torch.erfinv(z.clamp(-0.9, 0.9))]).cpu())
    assert torch.equal(res[0], res[1]) and torch.equal(res[1], res[2])


def test_disabled_quick_tier_compiles_each_signature_once():
    tiers.set_enabled(False)
    x = torch.randn(3, 41)
    t = x.to(TPU)
    torchtpu.reset_metrics()
    r1, r2 = t.sin(), t.sin()
    m = torchtpu.metrics()
    assert (m["compiles"], m["quick_compiles"], m["tier_ups"]) == (1, 0, 0), m
    torch.testing.assert_close(r1.cpu(), x.sin())
    assert torch.equal(r1.cpu(), r2.cpu())


@needs_quick_tier
def test_elementwise_op_with_the_quick_options_compiles_once():
    # where the element-wise options are the quick tier's, a tier-up would compile the
    # same program again: the first compile is the full one
    tiers.set_elementwise_options(True)
    if tiers.elementwise_options(torch.ops.aten.abs.default) != tiers.quick_options():
        pytest.skip("this platform's element-wise options are not its quick options")
    x = torch.randn(4, 39)
    t = x.to(TPU)
    torchtpu.reset_metrics()
    y, z = t.abs(), t.abs()
    m = torchtpu.metrics()
    assert (m["compiles"], m["quick_compiles"], m["tier_ups"]) == (1, 0, 0), m
    assert torch.equal(y.cpu(), x.abs()) and torch.equal(z.cpu(), x.abs())
