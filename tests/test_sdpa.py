"""F.scaled_dot_product_attention on tpu (the fused path of torchtpu.ops.sdpa and the
math path), against CPU PyTorch: masks, causal, GQA, scale, backward, odd sizes, dtypes,
every eager mode and torch.compile; sdpa_kernel selection and metrics()["sdpa"]."""

import contextlib

import _budget
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torchtpu
from torchtpu.ops import sdpa as _sdpa


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks smaller than the test sequences, so the kernels' loops run several blocks
    (and the last one partial)."""
    monkeypatch.setattr(_sdpa, "BLOCK_Q", 4)
    monkeypatch.setattr(_sdpa, "BLOCK_K", 3)


def _count(kernel="xla_blockwise"):
    return torchtpu.metrics()["sdpa"][kernel]


def _fused_kernel(q, k, v, attn_mask, kw) -> str:
    """The fused kernel a call runs: the blockwise XLA kernel on the CPU platform; on
    TPU/GPU the platform kernel when it takes the call."""
    from torchtpu._device import runtime

    if runtime.platform() == "cpu":
        return "xla_blockwise"
    scale = kw.get("scale") or 1.0 / q.shape[-1] ** 0.5
    return _sdpa.kernel_for("fwd", q.shape, k.shape, v.shape, q.dtype, attn_mask is not None,
                            kw.get("is_causal", False), scale,
                            dropout=kw.get("dropout_p", 0.0) > 0)[0]


def check(q, k, v, attn_mask=None, tol=2e-5, grads=True, expect=None, backends=None, **kw):
    """Run SDPA (forward, and backward of q, k, v and a float mask that requires grad) on
    CPU and on tpu; compare.  ``expect``: the tpu kernel that must run (its
    ``metrics()["sdpa"]`` key; default: the fused kernel of this platform, see
    :func:`_fused_kernel`); ``backends``: the ``sdpa_kernel`` list the tpu call runs
    under."""
    if expect is None:
        expect = _fused_kernel(q, k, v, attn_mask, kw)
    leaves = [q, k, v] + ([attn_mask] if attn_mask is not None and attn_mask.requires_grad
                          else [])
    cpu = [t.detach().clone().requires_grad_(grads and t.dtype.is_floating_point)
           for t in leaves]
    dev = [t.detach().to("tpu").requires_grad_(grads and t.dtype.is_floating_point)
           for t in leaves]

    def args(ts):
        m = ts[3] if len(ts) > 3 else (attn_mask if attn_mask is None else None)
        if m is None and attn_mask is not None:
            m = attn_mask.to(ts[0].device)
        return ts[0], ts[1], ts[2], m

    ref = F.scaled_dot_product_attention(*args(cpu), **kw)
    before = dict(torchtpu.metrics()["sdpa"])
    with sdpa_kernel(backends) if backends else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(*args(dev), **kw)
    after = torchtpu.metrics()["sdpa"]
    assert after[expect] == before[expect] + 1, (before, after)
    torch.testing.assert_close(out.cpu(), ref, rtol=tol, atol=tol)
    if grads:
        g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7)).to(ref.dtype)
        ref.backward(g)
        out.backward(g.to("tpu"))
        for c, d in zip(cpu, dev):
            if c.requires_grad:
                torch.testing.assert_close(d.grad.cpu(), c.grad, rtol=tol * 5, atol=tol * 5)
    return out


def qkv(B, Hq, L, S, E, Ev=None, Hk=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hk = Hk or Hq
    Ev = Ev or E
    shape = lambda *s: (B, *s) if B is not None else s  # noqa: E731
    return (torch.randn(shape(Hq, L, E), generator=g).to(dtype),
            torch.randn(shape(Hk, S, E), generator=g).to(dtype),
            torch.randn(shape(Hk, S, Ev), generator=g).to(dtype))


MASKS = ["none", "bool", "float", "bool_2d", "float_key_padding", "float_grad"]


def _mask(kind, B, H, L, S):
    g = torch.Generator().manual_seed(3)
    if kind == "none":
        return None
    if kind == "bool":  # (B, H, L, S), one fully masked row (CPU gives zeros there)
        m = torch.rand(B, H, L, S, generator=g) > 0.3
        m[0, 1, 2] = False
        return m
    if kind == "float":
        return torch.randn(B, H, L, S, generator=g)
    if kind == "bool_2d":  # broadcast over batch and heads
        return torch.rand(L, S, generator=g) > 0.4
    if kind == "float_key_padding":  # (B, 1, 1, S) additive, -inf on padded keys
        m = torch.zeros(B, 1, 1, S)
        m[1, ..., -3:] = float("-inf")
        return m
    m = torch.randn(1, H, L, S, generator=g)  # broadcast over batch, needs a gradient
    return m.requires_grad_()


# a boolean mask, a padding mask and a mask's gradient by default (CI's time budget); all
# six with TORCHTPU_FULL_TESTS=1
@pytest.mark.parametrize("kind", MASKS if _budget.FULL else ["bool", "float_key_padding",
                                                             "float_grad"])
def test_masks_match_cpu(eager_mode, small_blocks, kind):
    # L != S, S not a multiple of the block, head dim 5 (not a power of two), Ev != E
    q, k, v = qkv(2, 3, 7, 10, 5, Ev=6)
    check(q, k, v, attn_mask=_mask(kind, 2, 3, 7, 10))


@pytest.mark.parametrize("L,S", [(9, 6), (6, 9), (8, 8)])
def test_causal_matches_cpu(eager_mode, small_blocks, L, S):
    q, k, v = qkv(2, 2, L, S, 4)
    check(q, k, v, is_causal=True)


def _same_refusal(q, k, v, mask):
    """CPU and tpu both raise RuntimeError for a mask together with is_causal, with the
    same message."""
    with pytest.raises(RuntimeError) as cpu_err:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    with pytest.raises(RuntimeError) as tpu_err:
        F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"),
                                       attn_mask=mask.to("tpu"), is_causal=True)
    assert str(tpu_err.value) == str(cpu_err.value)


def test_mask_and_causal_together_match_cpu(small_blocks):
    """torch 2.13: CPU's default (flash) kernel applies both; its math kernel refuses, so
    does ours.  From torch 2.14 on CPU refuses the pair on every path: so does ours."""
    from torchtpu import _compat

    q, k, v = qkv(2, 2, 7, 10, 4)
    m = torch.randn(2, 1, 7, 10)
    if _compat.torch_at_least(2, 14):
        for mask in (m, m > 0):
            _same_refusal(q, k, v, mask)
        return
    check(q, k, v, attn_mask=m, is_causal=True)
    check(q, k, v, attn_mask=m > 0, is_causal=True)
    with sdpa_kernel([SDPBackend.MATH]):
        _same_refusal(q, k, v, m)


@pytest.mark.parametrize("mask", [None, "bool_heads"])
def test_gqa_matches_cpu(small_blocks, mask):
    q, k, v = qkv(2, 6, 7, 9, 4, Hk=2)
    m = None
    if mask:
        m = torch.rand(2, 6, 7, 9, generator=torch.Generator().manual_seed(1)) > 0.3
    check(q, k, v, attn_mask=m, enable_gqa=True)
    check(q, k, v, is_causal=True, enable_gqa=True)


def test_scale_and_3d_inputs_match_cpu(small_blocks):
    q, k, v = qkv(None, 3, 7, 10, 6)  # (H, L, E): 3-D
    check(q, k, v, scale=0.37)
    check(q, k, v, is_causal=True, scale=1.5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes_match_cpu(small_blocks, dtype):
    q, k, v = qkv(2, 2, 7, 10, 8, dtype=dtype)
    check(q, k, v, tol=1e-2, is_causal=True)
    check(q, k, v, attn_mask=torch.randn(7, 10).to(dtype), tol=1e-2)
    check(q, k, v, attn_mask=torch.randn(7, 10), tol=1e-2)  # float32 mask (autocast's case)


def test_default_blocks_long_sequence():
    """One sequence longer than the default block (several blocks, last partial)."""
    q, k, v = qkv(1, 2, 700, 1030, 16)
    check(q, k, v, is_causal=True, tol=1e-4)


def test_compiled_matches_cpu_and_runs_fused(small_blocks):
    torch._dynamo.reset()
    q, k, v = qkv(2, 2, 7, 10, 5)
    m = torch.randn(2, 1, 7, 10)

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m).square().sum()

    cf = torch.compile(f, backend="tpu")
    qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
    ref = f(qc, kc, vc, m)
    ref.backward()
    qt, kt, vt = (t.to("tpu").requires_grad_() for t in (q, k, v))
    n0 = _count()
    out = cf(qt, kt, vt, m.to("tpu"))
    out.backward()
    assert _count() > n0
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    for a, b in ((qt, qc), (kt, kc), (vt, vc)):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()


@pytest.mark.parametrize("backends,path", [
    ([SDPBackend.MATH], "math"),
    ([SDPBackend.FLASH_ATTENTION], "xla_blockwise"),
    ([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], "xla_blockwise"),
    ([SDPBackend.OVERRIDEABLE], "xla_blockwise"),
])
def test_sdpa_kernel_selects_path(backends, path):
    q, k, v = qkv(1, 2, 5, 6, 4)
    check(q, k, v, is_causal=True, expect=path, backends=backends, grads=False)


def test_no_viable_backend_raises_as_cpu():
    q, k, v = qkv(1, 2, 5, 6, 4)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        with pytest.raises(RuntimeError) as cpu_err:
            F.scaled_dot_product_attention(q, k, v)
        with pytest.raises(RuntimeError) as tpu_err:
            F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    assert str(tpu_err.value) == str(cpu_err.value)


def test_invalid_inputs_raise_as_cpu():
    q, k, v = qkv(1, 2, 5, 6, 4)
    with pytest.raises(RuntimeError) as cpu_err:
        F.scaled_dot_product_attention(q, k.double(), v)
    with pytest.raises(RuntimeError) as tpu_err:
        F.scaled_dot_product_attention(q.to("tpu"), k.double().to("tpu"), v.to("tpu"))
    assert str(tpu_err.value).replace("tpu:0", "cpu") == str(cpu_err.value)


@pytest.mark.parametrize("path", ["xla_blockwise", "math"])
def test_dropout_is_reproducible_with_manual_seed(path):
    q, k, v = (t.to("tpu") for t in qkv(2, 2, 6, 7, 4))
    backends = [SDPBackend.MATH] if path == "math" else [SDPBackend.FLASH_ATTENTION]

    def run(seed):
        torch.manual_seed(seed)
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.4).cpu()

    n = torchtpu.metrics()["sdpa"][path]
    a, b, c = run(123), run(123), run(124)
    assert torchtpu.metrics()["sdpa"][path] == n + 3
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)


def test_compiled_dropout_matches_eager_for_the_same_seed():
    torch._dynamo.reset()

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)

    q, k, v = (t.to("tpu") for t in qkv(2, 2, 6, 7, 4))
    torch.manual_seed(11)
    eager = f(q, k, v).cpu()
    torch.manual_seed(11)
    compiled = torch.compile(f, backend="tpu")(q, k, v).cpu()
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    torch._dynamo.reset()


def test_fused_dropout_statistics(small_blocks):
    """Uniform weights (q = k = 0) and v = 1: each output is (kept weights in its row) /
    (S (1 - p)), as PyTorch's dropout(softmax) @ v gives; about 1 - p of them are kept."""
    B, H, L, S, p = 4, 4, 16, 20, 0.3
    q = torch.zeros(B, H, L, 4, device="tpu")
    v = torch.ones(B, H, S, 1, device="tpu")
    torch.manual_seed(0)
    out = F.scaled_dot_product_attention(q, q[:, :, :1].expand(B, H, S, 4), v,
                                         dropout_p=p).cpu()
    kept = out * S * (1 - p)
    torch.testing.assert_close(kept, kept.round(), rtol=0, atol=1e-4)
    frac = kept.sum() / (B * H * L * S)
    assert abs(frac.item() - (1 - p)) < 0.03
    assert kept.std() > 0  # rows differ: not one mask for all


def test_fused_dropout_backward_uses_the_forward_mask():
    """Directional derivatives (float64, on tpu) of SDPA with dropout, the seed fixed per
    call, against central differences: the backward regenerates the forward's masks."""
    q, k, v = (t.double().to("tpu").requires_grad_() for t in qkv(2, 2, 5, 7, 3))
    m = torch.randn(2, 1, 5, 7, dtype=torch.float64).to("tpu").requires_grad_()
    xs = (q, k, v, m)
    g = torch.randn(2, 2, 5, 3, dtype=torch.float64).to("tpu")

    def f(q, k, v, m):
        torch.manual_seed(5)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=0.3)

    n = _count()
    f(*xs).backward(g)
    assert _count() == n + 1
    gen = torch.Generator().manual_seed(9)
    for _ in range(2):
        d = [torch.randn(x.shape, generator=gen, dtype=torch.float64).to("tpu") for x in xs]
        eps = 1e-6
        with torch.no_grad():
            plus = f(*(x + eps * dx for x, dx in zip(xs, d)))
            minus = f(*(x - eps * dx for x, dx in zip(xs, d)))
        numeric = ((plus - minus) * g).sum().item() / (2 * eps)
        analytic = sum((x.grad * dx).sum() for x, dx in zip(xs, d)).item()
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic)), (numeric, analytic)


def test_fused_kernel_does_not_materialize_scores():
    """The blockwise kernel's compiled working set is far below one (L, S) score matrix."""
    import jax
    import jax.numpy as jnp

    L = S = 4096
    q = jnp.zeros((1, 1, 1, L, 16), jnp.float32)
    k = jnp.zeros((1, 1, S, 16), jnp.float32)
    hi = jax.lax.Precision.HIGHEST

    def fwd(q, k, v):
        return _sdpa.blockwise_fwd(q, k, v, None, True, 0.25, hi)

    c = jax.jit(fwd).lower(q, k, k).compile()
    scores = L * S * 4
    assert c.memory_analysis().temp_size_in_bytes < scores / 8

    def bwd(do, q, k, v, o, lse):
        return _sdpa.blockwise_bwd(do, q, k, v, None, o, lse, True, 0.25, hi, False)

    lse = jnp.zeros((1, 1, 1, L), jnp.float32)
    c = jax.jit(bwd).lower(q, q, k, k, q, lse).compile()
    assert c.memory_analysis().temp_size_in_bytes < scores / 8


@pytest.fixture
def fresh_refusals(monkeypatch):
    """No kernel refusal seen yet in this process (nor its once-per-process warning)."""
    monkeypatch.setattr(_sdpa, "_REFUSED", {}, raising=False)
    monkeypatch.setattr(_sdpa, "_PROBED", set(), raising=False)
    monkeypatch.setattr(_sdpa, "_warned", False, raising=False)


def test_platform_kernel_refusal_falls_back_to_blockwise(monkeypatch, small_blocks,
                                                         fresh_refusals):
    """On a platform whose fused kernel refuses the call (here: the "gpu" branch, whose
    cuDNN attention is absent on this CPU machine), the blockwise kernel runs instead,
    counted as such and as a failure of the forward and of the backward, with a warning."""
    monkeypatch.setattr(_sdpa, "_platform", lambda: "gpu")
    q, k, v = qkv(2, 2, 7, 10, 8, dtype=torch.bfloat16, seed=4)
    n = _count("fused_failures")
    with pytest.warns(RuntimeWarning, match="the cudnn fused attention kernel raised"):
        check(q, k, v, is_causal=True, tol=1e-2, expect="xla_blockwise")
    assert _count("fused_failures") == n + 2


def _attention_plus_one(q4, k4, v4, causal, scale):
    """A stand-in for the Pallas kernel: attention + 1 (so its output is recognisable)."""
    import jax

    j = jax.numpy
    hi = jax.lax.Precision.HIGHEST
    s = j.einsum("bhqd,bhkd->bhqk", q4, k4, precision=hi) * scale
    if causal:
        L, S = s.shape[-2:]
        s = j.where(j.tril(j.ones((L, S), bool)), s, -j.inf)
    p = jax.nn.softmax(s, axis=-1)
    return j.einsum("bhqk,bhkd->bhqd", p, v4, precision=hi) + 1.0


def test_platform_kernel_is_counted_under_its_name(monkeypatch, fresh_refusals,
                                                   no_stored_executables):
    """A call the platform kernel takes (here: a stand-in for TPU's Pallas kernel) is
    counted under "pallas", and its result is that kernel's."""
    monkeypatch.setattr(_sdpa, "_platform", lambda: "tpu")
    monkeypatch.setattr(_sdpa, "_tpu_attention", _attention_plus_one)
    q, k, v = qkv(1, 2, 128, 128, 12, seed=11)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True) + 1.0
    before = dict(torchtpu.metrics()["sdpa"])
    out = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"),
                                         is_causal=True)
    after = torchtpu.metrics()["sdpa"]
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    assert after["pallas"] == before["pallas"] + 1, (before, after)
    assert after["xla_blockwise"] == before["xla_blockwise"]
    assert after["fused_failures"] == before["fused_failures"]


def test_refused_platform_kernel_counts_and_warns_once(monkeypatch, fresh_refusals,
                                                       no_stored_executables):
    """A platform kernel that raises (here: a stand-in for TPU's Pallas kernel): the
    blockwise kernel computes the call (values as CPU's), ``fused_failures`` and
    ``xla_blockwise`` count every such call, and one warning names the kernel and its
    error, however many calls and signatures fail."""
    import warnings

    def refuse(*args, **kwargs):
        raise ValueError("stand-in Pallas kernel refuses")

    monkeypatch.setattr(_sdpa, "_platform", lambda: "tpu")
    monkeypatch.setattr(_sdpa, "_tpu_attention", refuse)
    before = dict(torchtpu.metrics()["sdpa"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for L, seed in ((128, 12), (256, 13), (128, 14)):  # two signatures, three calls
            q, k, v = qkv(1, 2, L, L, 10, seed=seed)
            out = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"),
                                                 is_causal=True)
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.testing.assert_close(out.cpu(), ref, rtol=2e-5, atol=2e-5)
    after = torchtpu.metrics()["sdpa"]
    assert after["fused_failures"] == before["fused_failures"] + 3, (before, after)
    assert after["xla_blockwise"] == before["xla_blockwise"] + 3
    assert after["pallas"] == before["pallas"]
    ours = [str(w.message) for w in caught if "fused attention kernel" in str(w.message)]
    assert len(ours) == 1, ours
    assert "pallas" in ours[0] and "ValueError: stand-in Pallas kernel refuses" in ours[0]


def test_transposed_views_match_cpu(small_blocks):
    """(B, L, H, E) projections viewed as (B, H, L, E), as transformers passes them."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, n, 3, 4, generator=g).transpose(1, 2) for n in (7, 10, 10))
    check(q, k, v, is_causal=True)


_FRESH_PRIVATE_OPS = r"""
import torch, torchtpu
import torch.nn.functional as F
torch.manual_seed(0)
q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
# the private ops straight away, as a graph loaded from a cache (PyTorch's precompile
# skips Dynamo's trace) runs them: no SDPA call has run their decompositions first
out, lse = torch.ops.torchtpu_attn.flash_fwd(q.to("tpu"), k.to("tpu"), v.to("tpu"), None,
                                             True, 0.5)
ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
torch.testing.assert_close(out.cpu(), ref, rtol=2e-5, atol=2e-5)
x = torch.randn(2, 3, 4, 4)
w = torch.randn(5, 3, 3, 3)
g = torch.randn(2, 5, 2, 2)
ref = torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [0, 0], [1, 1], False,
                                          [0, 0], 1, [True, True, False])
res = torch.ops.torchtpu_nn.convolution_backward(g.to("tpu"), x.to("tpu"), w.to("tpu"),
                                                 None, [1, 1], [0, 0], [1, 1], False,
                                                 [0, 0], 1, [True, True, False])
for a, b in zip(res[:2], ref[:2]):
    torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
# the bias is additive: a bool mask is refused, not added as 0/1
try:
    torch.ops.torchtpu_attn.flash_fwd(q.to("tpu"), k.to("tpu"), v.to("tpu"),
                                      torch.ones(5, 5, dtype=torch.bool, device="tpu"),
                                      False, 0.5)
except RuntimeError as e:
    assert "floating-point additive mask" in str(e), e
else:
    raise AssertionError("a bool bias was accepted")
print("ok")
"""


def test_private_ops_have_lowerings_in_a_fresh_process():
    """torchtpu's private ops (torchtpu_attn::flash_fwd, torchtpu_nn::*) run in a process
    that has not run the decompositions producing them (a graph loaded from PyTorch's
    precompile cache holds them so); they used to raise 'not implemented'."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _FRESH_PRIVATE_OPS], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
