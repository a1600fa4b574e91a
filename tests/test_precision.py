"""torch.set_float32_matmul_precision on tpu: float32 products and convolutions follow it
("highest" -> XLA HIGHEST, "high" -> HIGH, "medium" -> DEFAULT), read when each op runs and
part of the executable's cache key, in every eager mode and in compiled graphs."""

import contextlib

import jax
import pytest
import torch
import torch.nn.functional as F

import torchtpu


@contextlib.contextmanager
def matmul_precision(setting):
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(setting)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


@contextlib.contextmanager
def recorded_precisions(monkeypatch):
    """The ``precision=`` of every jnp.matmul / conv traced meanwhile (what XLA is asked)."""
    seen = []
    mm, conv = jax.numpy.matmul, jax.lax.conv_general_dilated

    def rec_mm(*a, precision=None, **k):
        seen.append(precision)
        return mm(*a, precision=precision, **k)

    def rec_conv(*a, precision=None, **k):
        seen.append(precision)
        return conv(*a, precision=precision, **k)

    monkeypatch.setattr(jax.numpy, "matmul", rec_mm)
    monkeypatch.setattr(jax.lax, "conv_general_dilated", rec_conv)
    yield seen


def test_default_is_highest_and_matches_cpu_float32():
    assert torch.get_float32_matmul_precision() == "highest"
    torch.manual_seed(0)
    a, b = torch.randn(64, 96), torch.randn(96, 48)
    torch.testing.assert_close((a.to("tpu") @ b.to("tpu")).cpu(), a @ b, rtol=1e-6, atol=1e-5)
    x, w = torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3)
    torch.testing.assert_close(F.conv2d(x.to("tpu"), w.to("tpu")).cpu(), F.conv2d(x, w),
                               rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("setting,xla", [("highest", jax.lax.Precision.HIGHEST),
                                         ("high", jax.lax.Precision.HIGH),
                                         ("medium", jax.lax.Precision.DEFAULT)])
def test_setting_maps_to_xla_precision(eager_mode, monkeypatch, no_stored_executables,
                                       setting, xla):
    torch.manual_seed(1)
    # shapes of their own: the op is traced in this test
    n = {"highest": 5, "high": 6, "medium": 7}[setting] + 10 * len(eager_mode)
    a, b = torch.randn(n, 3), torch.randn(3, 4)
    x, w = torch.randn(1, 2, n, n), torch.randn(3, 2, 3, 3)
    with matmul_precision(setting), recorded_precisions(monkeypatch) as seen:
        c = a.to("tpu") @ b.to("tpu")
        y = F.conv2d(x.to("tpu"), w.to("tpu"))
        c, y = c.cpu(), y.cpu()
    assert seen and all(p == xla for p in seen), seen
    # values: on this CPU platform every setting computes in float32
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y, F.conv2d(x, w), rtol=1e-4, atol=1e-4)


def test_setting_is_part_of_the_cache_key_and_restores(eager_mode):
    torch.manual_seed(2)
    n = 20 + len(eager_mode)  # a shape of its own per mode (modes share the cache)
    a, b = torch.randn(n, 4).to("tpu"), torch.randn(4, 3).to("tpu")
    (a @ b).cpu()  # the "highest" executable
    torchtpu.reset_metrics()
    with matmul_precision("medium"):
        (a @ b).cpu()
    m = torchtpu.metrics()
    misses = m["cache_misses"] + m["segment_cache_misses"]
    assert misses >= 1  # a new executable for the new setting
    torchtpu.reset_metrics()
    assert torch.get_float32_matmul_precision() == "highest"
    (a @ b).cpu()
    m = torchtpu.metrics()
    assert m["cache_misses"] == 0  # the "highest" executable again
    with matmul_precision("medium"):
        (a @ b).cpu()
    assert torchtpu.metrics()["cache_misses"] == 0  # and the "medium" one


def test_deferred_segment_keeps_each_ops_setting(monkeypatch):
    """DeferAndFuse traces the segment later: each op still uses the setting it ran under."""
    torch.manual_seed(3)
    a, b = torch.randn(17, 4).to("tpu"), torch.randn(4, 3).to("tpu")
    with torch.tpu.set_eager_mode("defer_and_fuse"), recorded_precisions(monkeypatch) as seen:
        with matmul_precision("medium"):
            c1 = a @ b
        c2 = a @ b  # "highest"
        out = (c1 + c2).cpu()
    assert jax.lax.Precision.DEFAULT in seen and jax.lax.Precision.HIGHEST in seen
    torch.testing.assert_close(out, 2 * (a.cpu() @ b.cpu()), rtol=1e-5, atol=1e-5)


def test_compiled_graph_keys_on_setting(monkeypatch, no_stored_executables):
    torch._dynamo.reset()
    torch.manual_seed(4)
    a, b = torch.randn(19, 4), torch.randn(4, 3)

    @torch.compile(backend="tpu")
    def f(x, y):
        return torch.relu(x @ y)

    at, bt = a.to("tpu"), b.to("tpu")
    with recorded_precisions(monkeypatch) as seen:
        r1 = f(at, bt).cpu()
        n1 = torchtpu.metrics()["compile"]["executables"]
        with matmul_precision("medium"):
            r2 = f(at, bt).cpu()
        n2 = torchtpu.metrics()["compile"]["executables"]
        r3 = f(at, bt).cpu()
        n3 = torchtpu.metrics()["compile"]["executables"]
    assert n2 == n1 + 1 and n3 == n2  # one more executable, then the first one again
    assert seen[0] == jax.lax.Precision.HIGHEST and jax.lax.Precision.DEFAULT in seen
    for r in (r1, r2, r3):
        torch.testing.assert_close(r, torch.relu(a @ b), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
