"""Compiled decoding steps over a growing cache (``torchtpu.compile.seq_buckets``): one
executable per capacity bucket instead of one per length, values equal to CPU PyTorch's
and to the exact (per-length) executables."""

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from torchtpu._tensor import storage as _st

B, H, D = 2, 2, 8


def _step(k_cache, v_cache, x, w):
    q, k, v = (x @ w).view(B, 1, 3, H, D).permute(2, 0, 3, 1, 4)
    k_cache = torch.cat([k_cache, k], dim=2)
    v_cache = torch.cat([v_cache, v], dim=2)
    out = F.scaled_dot_product_attention(q, k_cache, v_cache)
    return out.transpose(1, 2).reshape(B, 1, H * D), k_cache, v_cache


def _decode(device, steps, start=3, compiled=True, step=_step, dynamic=None):
    g = torch.Generator().manual_seed(0)
    k = torch.randn(B, H, start, D, generator=g).to(device)
    v = torch.randn(B, H, start, D, generator=g).to(device)
    w = (torch.randn(H * D, 3 * H * D, generator=g) * 0.3).to(device)
    xs = [torch.randn(B, 1, H * D, generator=g).to(device) for _ in range(steps)]
    f = torch.compile(step, backend="tpu", dynamic=dynamic) if compiled else step
    outs = []
    for x in xs:
        o, k, v = f(k, v, x, w)
        outs.append(o)
    return outs, k, v


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("dynamic", [None, True])
def test_decoding_steps_match_cpu_with_one_executable_per_bucket(dynamic):
    # dynamic=None: Dynamo makes the cache length symbolic at the second length;
    # dynamic=True: every size is symbolic, only the cache length is bucketed
    torchtpu.reset_metrics()
    outs, k, v = _decode("tpu", 40, dynamic=dynamic)
    c = torchtpu.metrics()["compile"]
    assert _st.data(k).arr.__class__ is _st.Grown  # capacity kept for the next step
    ref_outs, ref_k, ref_v = _decode("cpu", 40, compiled=False)
    for a, b in zip(outs, ref_outs):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)
    assert k.shape == ref_k.shape and k.stride() == ref_k.stride()
    torch.testing.assert_close(k.cpu(), ref_k)
    torch.testing.assert_close(v.cpu(), ref_v)
    # lengths 3..42: the first (static) length, then one bucket (capacity 128: small
    # caches start there, as eager growth's do)
    assert c["seq_bucket_calls"] >= 38
    assert c["executables"] <= 3, c


def test_a_cache_outgrowing_its_capacity_moves_to_the_next_bucket():
    # lengths 120..139 cross capacity 128: the caches move to 256 on the device, and
    # values stay CPU's on both sides of the move
    torchtpu.reset_metrics()
    outs, k, v = _decode("tpu", 20, start=120)
    c = torchtpu.metrics()["compile"]
    ref_outs, ref_k, ref_v = _decode("cpu", 20, start=120, compiled=False)
    for a, b in zip(outs, ref_outs):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k.cpu(), ref_k)
    torch.testing.assert_close(v.cpu(), ref_v)
    assert c["seq_bucket_moves"] >= 2, c  # (keys and values, once)
    assert c["executables"] <= 4, c


def test_bucketed_and_exact_executables_agree():
    outs, k, v = _decode("tpu", 20)
    from torchtpu.compile import graph

    plan_analyze = graph._seq.analyze
    graph._seq.analyze = lambda *a: None  # the exact executables, one per length
    try:
        torch._dynamo.reset()
        torchtpu.reset_metrics()
        exact_outs, ek, ev = _decode("tpu", 20)
        assert torchtpu.metrics()["compile"]["seq_bucket_calls"] == 0
    finally:
        graph._seq.analyze = plan_analyze
    for a, b in zip(outs, exact_outs):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-6, atol=1e-6)
    assert torch.equal(k.cpu(), ek.cpu()) and torch.equal(v.cpu(), ev.cpu())


def test_grown_cache_outputs_read_eagerly_as_cpu():
    _, k, _ = _decode("tpu", 6)
    _, rk, _ = _decode("cpu", 6, compiled=False)
    torch.testing.assert_close(k[:, :, -1].cpu(), rk[:, :, -1])
    torch.testing.assert_close((k * 2).sum(2).cpu(), (rk * 2).sum(2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([k, k[:, :, :1]], 2).cpu(),
                               torch.cat([rk, rk[:, :, :1]], 2))


def _step_reading_the_cache(k_cache, v_cache, x, w):
    o, k2, v2 = _step(k_cache, v_cache, x, w)
    return o + k_cache.mean(2).sum(), k2, v2  # the cache read by another op


def test_a_graph_reading_the_cache_otherwise_runs_exact_executables():
    torchtpu.reset_metrics()
    outs, k, _ = _decode("tpu", 5, step=_step_reading_the_cache)
    assert torchtpu.metrics()["compile"]["seq_bucket_calls"] == 0
    ref, rk, _ = _decode("cpu", 5, compiled=False, step=_step_reading_the_cache)
    for a, b in zip(outs, ref):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k.cpu(), rk)


def test_compiled_hf_generate_matches_cpu_with_bounded_executables():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=128)
    model = tf.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))

    def gen(m, x):
        with torch.no_grad():
            return m.generate(x, max_new_tokens=30, min_new_tokens=30, do_sample=False)

    ref = gen(model, ids)
    model.to("tpu")
    model.forward = torch.compile(model.forward, backend="tpu")
    torchtpu.reset_metrics()
    out = gen(model, ids.to("tpu"))
    c = torchtpu.metrics()["compile"]
    assert torch.equal(out.cpu(), ref)
    assert c["seq_bucket_calls"] >= 25
    # prefill, the first decoding steps Dynamo compiles static, then one bucket (128)
    assert c["executables"] <= 5, c


def _step_promoting(k_cache, v_cache, x, w):
    q, k, v = (x @ w).view(B, 1, 3, H, D).permute(2, 0, 3, 1, 4)
    k_cache = torch.cat([k_cache, k], dim=2)  # bfloat16 cache + float32 entries: float32
    v_cache = torch.cat([v_cache, v], dim=2)
    out = F.scaled_dot_product_attention(q, k_cache, v_cache)
    return out, k_cache, v_cache


def test_a_cat_that_promotes_the_cache_dtype_runs_exact_executables():
    # helper-21: the append cast the new entries down to the cache's bfloat16 and the
    # float32 result was wrapped over a bfloat16 array (wrong values, then setStorage
    # errors)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(H * D, 3 * H * D, generator=g) * 0.3
    f = torch.compile(_step_promoting, backend="tpu")
    torchtpu.reset_metrics()
    for n in (3, 4, 5):
        kc = torch.randn(B, H, n, D, generator=g).to(torch.bfloat16)
        vc = torch.randn(B, H, n, D, generator=g).to(torch.bfloat16)
        x = torch.randn(B, 1, H * D, generator=g)
        want = _step_promoting(kc, vc, x, w)
        got = f(kc.to("tpu"), vc.to("tpu"), x.to("tpu"), w.to("tpu"))
        for a, b in zip(got, want):
            assert a.dtype == b.dtype
            torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)
    assert torchtpu.metrics()["compile"]["seq_bucket_calls"] == 0
