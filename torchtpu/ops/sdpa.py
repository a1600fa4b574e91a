"""Fused scaled-dot-product attention (``F.scaled_dot_product_attention`` on tpu).

How a call gets here.  ``aten::scaled_dot_product_attention`` is CompositeImplicitAutograd;
PyTorch's kernel asks ``_fused_sdp_choice_stub`` for a backend, a C++ DispatchStub that a
Python backend cannot fill, so on PrivateUse1 it always ran the math decomposition (the
full ``(L, S)`` score matrix, its softmax and, for backward, both kept alive).  We register
our own kernel for the op on ``AutogradPrivateUse1`` and ``PrivateUse1``
(:func:`scaled_dot_product_attention`): it applies ``torch.nn.attention.sdpa_kernel``'s
flags and calls either PyTorch's own composite kernel (the math path, unchanged) or
``aten::_scaled_dot_product_fused_attention_overrideable`` -- the op PyTorch reserves for
out-of-tree backends, with a derivative formula (``..._overrideable_backward``), so
autograd, AOTAutograd and ``torch.compile`` see an ordinary ATen op pair.  Both are
decomposed (eager and compile) to two private ops, ``torchtpu_attn::flash_fwd`` /
``flash_bwd``, which are in the lowering table: STRICT, DEBUG, DEFER_AND_FUSE and compiled
graphs run the same lowering.

The lowering per platform (``runtime.platform()``, fixed per process):

* ``tpu``: the Pallas flash-attention kernel JAX ships
  (``jax.experimental.pallas.ops.tpu.flash_attention``) for the unmasked / causal case
  with sequence lengths that are multiples of 128 and float32/bfloat16 inputs; backward is
  that kernel's own VJP.  Other cases use the XLA path below.
* ``gpu``: ``jax.nn.dot_product_attention(implementation="cudnn")`` for float16/bfloat16
  when cuDNN takes the shapes (its VJP for backward); otherwise the XLA path below.
* everywhere else (CPU): a blockwise attention written here with ``lax`` loops: queries
  in blocks of ``BLOCK_Q``, keys in blocks of ``BLOCK_K``, an online softmax (running max,
  running sum) so that only ``BLOCK_Q x BLOCK_K`` scores per head exist at a time; the
  backward recomputes each block's probabilities from the saved log-sum-exp (as
  FlashAttention does) instead of keeping the ``(L, S)`` matrix.  Causal attention skips
  the key blocks entirely above the diagonal.

Semantics kept equal to CPU: the scale (``1/sqrt(E)`` by default), additive float masks
and boolean masks (converted by PyTorch's rule: ``False`` -> ``-inf``), masks of any
broadcastable shape, ``is_causal`` (top-left aligned ``tril`` for ``L != S``), grouped
query attention (``enable_gqa``: query head ``h`` reads key head ``h // (Hq/Hk)``), a
fully masked query row gives 0 (as CPU's ``_safe_softmax``), gradients of ``q``, ``k``,
``v`` and of a float mask.  Computation is in float32 for float16/bfloat16 inputs
(float64 for float64), rounded once.  ``dropout_p > 0`` runs the math path (its dropout
draws from the tpu generator, so ``torch.manual_seed`` reproduces it).
"""

from __future__ import annotations

import math
import os

import torch

from torchtpu.ops import LOWERINGS, Lowering
from torchtpu.ops.decomp_overrides import decomp

aten = torch.ops.aten

BLOCK_Q = int(os.environ.get("TORCHTPU_SDPA_BLOCK_Q", "512"))
BLOCK_K = int(os.environ.get("TORCHTPU_SDPA_BLOCK_K", "512"))


def _jax():
    from torchtpu._device import runtime

    return runtime.jax()


# ====================================================================== JAX kernels
# Layout inside the kernels: q (N, Hk, G, L, D), k (N, Hk, S, D), v (N, Hk, S, Dv),
# bias None or 5-D broadcastable to (N, Hk, G, L, S); G = Hq // Hk query heads per key head.


def _blocks(n, b):
    b = max(1, min(b, n))
    return b, -(-n // b) * b


def _pad(x, axis, n):
    if x.shape[axis] == n:
        return x
    j = _jax().numpy
    w = [(0, 0)] * x.ndim
    w[axis] = (0, n - x.shape[axis])
    return j.pad(x, w)


def _bias_block(bias, q0, bq, k0, bk):
    lax = _jax().lax
    if bias.shape[3] > 1:
        bias = lax.dynamic_slice_in_dim(bias, q0, bq, axis=3)
    if bias.shape[4] > 1:
        bias = lax.dynamic_slice_in_dim(bias, k0, bk, axis=4)
    return bias


def _scores(qi, kj, bias, q0, k0, bq, bk, S, causal, scale, prec):
    """One block of scores (N, Hk, G, bq, bk), masked entries -inf."""
    j = _jax().numpy
    s = j.einsum("nhgqd,nhkd->nhgqk", qi, kj, precision=prec) * scale
    if bias is not None:
        s = s + _bias_block(bias, q0, bq, k0, bk)
    kpos = k0 + j.arange(bk)
    keep = kpos[None, :] < S
    if causal:
        qpos = q0 + j.arange(bq)
        keep = keep & (kpos[None, :] <= qpos[:, None])
    return j.where(keep, s, -j.inf)


def blockwise_fwd(q, k, v, bias, causal, scale, prec, bq=None, bk=None, with_out=True):
    """Online-softmax attention.  Returns ``(out (N,Hk,G,L,Dv), lse (N,Hk,G,L))``
    (``out`` None when ``with_out`` is False: the log-sum-exp alone)."""
    jax = _jax()
    j, lax = jax.numpy, jax.lax
    N, Hk, G, L, D = q.shape
    S, Dv = k.shape[2], v.shape[-1]
    bq, Lp = _blocks(L, bq or BLOCK_Q)
    bk, Sp = _blocks(S, bk or BLOCK_K)
    q, k, v = _pad(q, 3, Lp), _pad(k, 2, Sp), _pad(v, 2, Sp)
    if bias is not None:
        if bias.shape[3] > 1:
            bias = _pad(bias, 3, Lp)
        if bias.shape[4] > 1:
            bias = _pad(bias, 4, Sp)
    nq, nk = Lp // bq, Sp // bk
    qb = j.moveaxis(q.reshape(N, Hk, G, nq, bq, D), 3, 0)
    ct = q.dtype

    def q_block(args):
        i, qi = args
        q0 = i * bq

        def body(jj, carry):
            m, l, acc = carry
            k0 = jj * bk
            kj = lax.dynamic_slice_in_dim(k, k0, bk, axis=2)
            s = _scores(qi, kj, bias, q0, k0, bq, bk, S, causal, scale, prec)
            m_new = j.maximum(m, s.max(-1))
            m_safe = j.where(m_new == -j.inf, j.zeros((), ct), m_new)
            alpha = j.exp(m - m_safe)
            p = j.exp(s - m_safe[..., None])
            l = alpha * l + p.sum(-1)
            if with_out:
                vj = lax.dynamic_slice_in_dim(v, k0, bk, axis=2)
                acc = alpha[..., None] * acc + j.einsum("nhgqk,nhkd->nhgqd", p, vj,
                                                        precision=prec)
            return m_new, l, acc

        m0 = j.full((N, Hk, G, bq), -j.inf, ct)
        l0 = j.zeros((N, Hk, G, bq), ct)
        a0 = j.zeros((N, Hk, G, bq, Dv) if with_out else (), ct)
        n_end = j.minimum(nk, (q0 + bq + bk - 1) // bk) if causal else nk
        m, l, acc = lax.fori_loop(0, n_end, body, (m0, l0, a0))
        ok = l > 0
        lse = j.where(ok, m + j.log(j.where(ok, l, 1)), -j.inf)
        if not with_out:
            return lse
        out = j.where(ok[..., None], acc / j.where(ok, l, 1)[..., None], 0)
        return out, lse

    res = lax.map(q_block, (j.arange(nq), qb))
    if not with_out:
        return None, j.moveaxis(res, 0, 3).reshape(N, Hk, G, Lp)[..., :L]
    out, lse = res
    out = j.moveaxis(out, 0, 3).reshape(N, Hk, G, Lp, Dv)[:, :, :, :L]
    lse = j.moveaxis(lse, 0, 3).reshape(N, Hk, G, Lp)[..., :L]
    return out, lse


def blockwise_bwd(do, q, k, v, bias, out, lse, causal, scale, prec, bias_grad,
                  bq=None, bk=None):
    """Gradients ``(dq, dk, dv, dbias)`` of :func:`blockwise_fwd`, recomputing each
    block's probabilities from ``lse``; ``dbias`` has the (5-D) shape of ``bias`` (None
    unless ``bias_grad``)."""
    jax = _jax()
    j, lax = jax.numpy, jax.lax
    N, Hk, G, L, D = q.shape
    S, Dv = k.shape[2], v.shape[-1]
    ct = q.dtype
    bq, Lp = _blocks(L, bq or BLOCK_Q)
    bk, Sp = _blocks(S, bk or BLOCK_K)
    dsum = (do * out).sum(-1)
    lse = j.where(lse == -j.inf, j.inf, lse)  # fully masked rows: p = 0
    q, do = _pad(q, 3, Lp), _pad(do, 3, Lp)
    lse, dsum = _pad(lse, 3, Lp), _pad(dsum, 3, Lp)
    k, v = _pad(k, 2, Sp), _pad(v, 2, Sp)
    bshape = None
    if bias is not None:
        bshape = bias.shape
        if bias.shape[3] > 1:
            bias = _pad(bias, 3, Lp)
        if bias.shape[4] > 1:
            bias = _pad(bias, 4, Sp)
    nq, nk = Lp // bq, Sp // bk

    def reduce_to(x, shape):
        axes = tuple(a for a in range(x.ndim) if shape[a] == 1 and x.shape[a] != 1)
        return x.sum(axes, keepdims=True) if axes else x

    def k_block(carry, jj):
        dq, db = carry
        k0 = jj * bk
        kj = lax.dynamic_slice_in_dim(k, k0, bk, axis=2)
        vj = lax.dynamic_slice_in_dim(v, k0, bk, axis=2)

        def body(i, c):
            dk, dv, dq, db = c
            q0 = i * bq
            qi = lax.dynamic_slice_in_dim(q, q0, bq, axis=3)
            doi = lax.dynamic_slice_in_dim(do, q0, bq, axis=3)
            li = lax.dynamic_slice_in_dim(lse, q0, bq, axis=3)
            di = lax.dynamic_slice_in_dim(dsum, q0, bq, axis=3)
            s = _scores(qi, kj, bias, q0, k0, bq, bk, S, causal, scale, prec)
            p = j.exp(s - li[..., None])
            dv = dv + j.einsum("nhgqk,nhgqd->nhkd", p, doi, precision=prec)
            dp = j.einsum("nhgqd,nhkd->nhgqk", doi, vj, precision=prec)
            ds = p * (dp - di[..., None])
            dqi = j.einsum("nhgqk,nhkd->nhgqd", ds, kj, precision=prec) * scale
            dq = lax.dynamic_update_slice_in_dim(
                dq, lax.dynamic_slice_in_dim(dq, q0, bq, axis=3) + dqi, q0, axis=3)
            dk = dk + j.einsum("nhgqk,nhgqd->nhkd", ds, qi, precision=prec) * scale
            if db is not None:
                part = reduce_to(ds, db.shape)
                start = [0, 0, 0, q0 if db.shape[3] > 1 else 0, k0 if db.shape[4] > 1 else 0]
                cur = lax.dynamic_slice(db, start, part.shape)
                db = lax.dynamic_update_slice(db, cur + part, start)
            return dk, dv, dq, db

        dk0 = j.zeros((N, Hk, bk, D), ct)
        dv0 = j.zeros((N, Hk, bk, Dv), ct)
        start = (k0 // bq) if causal else 0
        dk, dv, dq, db = lax.fori_loop(start, nq, body, (dk0, dv0, dq, db))
        return (dq, db), (dk, dv)

    db0 = j.zeros(bias.shape, ct) if bias_grad and bias is not None else None
    (dq, db), (dk, dv) = lax.scan(k_block, (j.zeros(q.shape, ct), db0), j.arange(nk))
    dq = dq[:, :, :, :L]
    dk = j.moveaxis(dk, 0, 2).reshape(N, Hk, Sp, D)[:, :, :S]
    dv = j.moveaxis(dv, 0, 2).reshape(N, Hk, Sp, Dv)[:, :, :S]
    if db is not None:
        db = db[:, :, :, : bshape[3], : bshape[4]]
    return dq, dk, dv, db


# ---------------------------------------------------------------- platform kernels


def _tpu_pallas_ok(q5, k, bias, dt):
    L, S = q5.shape[3], k.shape[2]
    return (bias is None and dt in (torch.float32, torch.bfloat16)
            and L % 128 == 0 and S % 128 == 0)


def _tpu_attention(q4, k4, v4, causal, scale):
    """Pallas flash attention on (B, H, L, D) arrays (JAX's TPU kernel, custom VJP)."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    return fa.flash_attention(q4, k4, v4, causal=causal, sm_scale=scale)


def _gpu_attention(q4, k4, v4, causal, scale):
    """cuDNN fused attention on (B, H, L, D) arrays (``jax.nn.dot_product_attention``
    takes (B, L, H, D)); GQA is native (Hq a multiple of Hk)."""
    j = _jax().numpy
    t = lambda x: j.swapaxes(x, 1, 2)  # noqa: E731
    o = _jax().nn.dot_product_attention(t(q4), t(k4), t(v4), scale=scale, is_causal=causal,
                                        implementation="cudnn")
    return t(o)


def _platform_kernel(q5, k, bias, dt):
    """The platform's fused kernel for this call, or None (the XLA blockwise path)."""
    from torchtpu._device import runtime

    plat = runtime.platform()
    if plat == "tpu" and _tpu_pallas_ok(q5, k, bias, dt):
        return "tpu"
    if plat == "gpu" and bias is None and dt in (torch.float16, torch.bfloat16):
        return "gpu"
    return None


def _run_platform(kind, q5, k, v, causal, scale, dt):
    """Run the platform kernel in the inputs' dtype on (N*?, H, L, D) layout."""
    j = _jax().numpy
    N, Hk, G, L, D = q5.shape
    npd = _np_dtype(dt)
    q4 = q5.reshape(N, Hk * G, L, D).astype(npd)
    k4, v4 = k.astype(npd), v.astype(npd)
    if kind == "tpu":
        if G > 1:
            k4, v4 = j.repeat(k4, G, axis=1), j.repeat(v4, G, axis=1)
        return _tpu_attention(q4, k4, v4, causal, scale)
    return _gpu_attention(q4, k4, v4, causal, scale)


def _np_dtype(dt):
    from torchtpu._device import runtime

    return runtime.to_np_dtype(dt)


# ==================================================================== private ops

_LIB = torch.library.Library("torchtpu_attn", "DEF")
_LIB.define("flash_fwd(Tensor q, Tensor k, Tensor v, Tensor? bias, bool is_causal, "
            "float? scale) -> (Tensor, Tensor)")
_LIB.define("flash_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor? bias, "
            "Tensor out, Tensor lse, bool is_causal, float? scale, bool bias_grad) "
            "-> (Tensor, Tensor, Tensor, Tensor)")


def _meta_fwd(q, k, v, bias, is_causal, scale):
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    lse_shape = (q.shape[0], q.shape[1], q.shape[2]) if q.dim() == 4 else (1,) + tuple(q.shape[:2])
    return out, q.new_empty(lse_shape, dtype=torch.float32)


def _meta_bwd(grad_out, q, k, v, bias, out, lse, is_causal, scale, bias_grad):
    gb = torch.empty_like(bias) if (bias_grad and bias is not None) else q.new_empty((0,))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), gb


_LIB.impl("flash_fwd", _meta_fwd, "Meta")
_LIB.impl("flash_bwd", _meta_bwd, "Meta")


def _to5(q, k, v, bias):
    """(…, Hq, L, D) arrays -> the kernels' 5-D layout (+ the bias reshaped)."""
    Hq, L, D = q.shape[-3:]
    Hk, S = k.shape[-3], k.shape[-2]
    N = int(math.prod(q.shape[:-3]))
    G = Hq // Hk
    q5 = q.reshape(N, Hk, G, L, D)
    k4 = k.reshape(N, Hk, S, D)
    v4 = v.reshape(N, Hk, S, v.shape[-1])
    b5 = None
    if bias is not None:
        b = bias.reshape((1,) * (4 - bias.ndim) + tuple(bias.shape))
        Nb, Hb, Lb, Sb = b.shape
        b5 = b.reshape(Nb, Hk, G, Lb, Sb) if Hb == Hq and Hq > 1 else b.reshape(Nb, 1, 1, Lb, Sb)
    return q5, k4, v4, b5


def _compute_dtype(dt):
    return torch.float64 if dt == torch.float64 else torch.float32


def _precision(dt):
    from torchtpu.ops._util import matmul_precision

    return matmul_precision(dt)


def flash_fwd(q, k, v, bias, is_causal, scale):
    from torchtpu.ops._util import tdtype

    dt = tdtype(q)
    D = q.shape[-1]
    sc = (1.0 / math.sqrt(D)) if scale is None else scale
    ct = _np_dtype(_compute_dtype(dt))
    q5, k4, v4, b5 = _to5(q, k, v, bias)
    kind = _platform_kernel(q5, k4, b5, dt)
    lse_shape = (q.shape[0], q.shape[1], q.shape[2]) if q.ndim == 4 else (1,) + tuple(q.shape[:2])
    if kind is not None:
        try:
            out = _run_platform(kind, q5, k4, v4, is_causal, sc, dt)
            _, lse = blockwise_fwd(q5.astype(ct), k4.astype(ct), v4.astype(ct), None, is_causal,
                                   sc, _precision(dt), with_out=False)
            return out.reshape(q.shape[:-1] + (v.shape[-1],)), lse.reshape(lse_shape)
        except Exception:  # the platform kernel refused the shapes: the XLA path
            pass
    out, lse = blockwise_fwd(q5.astype(ct), k4.astype(ct), v4.astype(ct),
                             None if b5 is None else b5.astype(ct), is_causal, sc, _precision(dt))
    return out.reshape(q.shape[:-1] + (v.shape[-1],)), lse.reshape(lse_shape)


def flash_bwd(grad_out, q, k, v, bias, out, lse, is_causal, scale, bias_grad):
    from torchtpu.ops._util import tdtype

    jax = _jax()
    j = jax.numpy
    dt = tdtype(q)
    D = q.shape[-1]
    sc = (1.0 / math.sqrt(D)) if scale is None else scale
    ct = _np_dtype(_compute_dtype(dt))
    q5, k4, v4, b5 = _to5(q, k, v, bias)
    kind = _platform_kernel(q5, k4, b5, dt)
    if kind is not None:
        try:
            _, vjp = jax.vjp(lambda a, b, c: _run_platform(kind, a, b, c, is_causal, sc, dt),
                             q5, k4, v4)
            N, Hk, G, L, _ = q5.shape
            g = grad_out.reshape(N, Hk * G, L, v.shape[-1]).astype(_np_dtype(dt))
            dq, dk, dv = vjp(g)
            return (dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape),
                    j.zeros((0,), q.dtype))
        except Exception:  # the platform kernel refused the shapes: the XLA path
            pass
    N, Hk, G, L, _ = q5.shape
    Dv = v.shape[-1]
    do5 = grad_out.reshape(N, Hk, G, L, Dv).astype(ct)
    o5 = out.reshape(N, Hk, G, L, Dv).astype(ct)
    lse5 = lse.reshape(N, Hk, G, L).astype(ct)
    dq, dk, dv, db = blockwise_bwd(do5, q5.astype(ct), k4.astype(ct), v4.astype(ct),
                                   None if b5 is None else b5.astype(ct), o5, lse5, is_causal,
                                   sc, _precision(dt), bias_grad and bias is not None)
    gb = db.reshape(bias.shape) if db is not None else j.zeros((0,), ct)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), gb


_FWD = torch.ops.torchtpu_attn.flash_fwd.default
_BWD = torch.ops.torchtpu_attn.flash_bwd.default


def _ensure_lowered():
    # not through @lower: the import-time loop that gives lowered ops a direct
    # PrivateUse1 kernel registers names in the aten namespace only; these private ops
    # reach the executor through the PrivateUse1 fallback
    if _FWD not in LOWERINGS:
        LOWERINGS[_FWD] = Lowering(flash_fwd, precision=True)
        LOWERINGS[_BWD] = Lowering(flash_bwd, precision=True)



# ================================================= the overrideable ATen op pair


@decomp(aten._scaled_dot_product_fused_attention_overrideable.default)
def _fused_overrideable(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                        return_debug_mask=False, scale=None):
    """PyTorch's fused-attention op for out-of-tree backends, on tpu: the blockwise /
    platform kernel (``flash_fwd``).  ``dropout_p > 0`` and ``return_debug_mask`` are
    refused (the public entry point routes dropout to the math path)."""
    _ensure_lowered()
    if dropout_p > 0.0 or return_debug_mask:
        raise NotImplementedError(
            "torchtpu: aten._scaled_dot_product_fused_attention_overrideable with dropout_p > 0 "
            "or return_debug_mask=True is not implemented for the tpu device "
            "(F.scaled_dot_product_attention runs dropout on the math path)")
    out, lse = _FWD(query, key, value, attn_bias, is_causal, scale)
    seed = torch.zeros((), dtype=torch.int64, device=query.device)
    offset = torch.zeros((), dtype=torch.int64, device=query.device)
    return (out, lse, None, None, query.shape[-2], key.shape[-2], seed, offset, None)


@decomp(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def _fused_overrideable_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out,
                                 logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                 is_causal, philox_seed, philox_offset, scale=None):
    _ensure_lowered()
    if dropout_p > 0.0:
        raise NotImplementedError(
            "torchtpu: aten._scaled_dot_product_fused_attention_overrideable_backward with "
            "dropout_p > 0 is not implemented for the tpu device")
    bias_grad = attn_bias is not None and bool(grad_input_mask[3])
    gq, gk, gv, gb = _BWD(grad_out, query, key, value, attn_bias, out, logsumexp, is_causal,
                          scale, bias_grad)
    return gq, gk, gv, (gb if bias_grad else None)


_ATEN = torch.library.Library("aten", "IMPL")
# Both have a CompositeExplicitAutograd kernel (which raises for unknown backends), so the
# PrivateUse1 fallback never sees them: their own PrivateUse1 kernel runs the decomposition.
_ATEN.impl("_scaled_dot_product_fused_attention_overrideable", _fused_overrideable,
           "PrivateUse1")
_ATEN.impl("_scaled_dot_product_fused_attention_overrideable_backward",
           _fused_overrideable_backward, "PrivateUse1")


# ============================================================ the public entry point

_SDPA = aten.scaled_dot_product_attention.default
_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _fused_ok(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:
    """Whether the fused path computes exactly what PyTorch's math path computes for this
    call (any other call, errors included, goes to PyTorch's composite kernel)."""
    if dropout_p != 0.0 or not (q.dim() == k.dim() == v.dim()) or q.dim() not in (3, 4):
        return False
    if q.dtype not in _FUSED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    if q.device != k.device or q.device != v.device or q.is_nested or k.is_nested:
        return False
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        return False
    Hq, L, D = q.shape[-3:]
    Hk, S = k.shape[-3], k.shape[-2]
    if 0 in q.shape or 0 in k.shape or v.shape[-1] == 0:
        return False
    if Hq != Hk and not (enable_gqa and Hk > 0 and Hq % Hk == 0):
        return False
    if attn_mask is not None:
        if is_causal or attn_mask.device != q.device or attn_mask.dim() > q.dim():
            return False
        if attn_mask.dtype not in (torch.bool, q.dtype):
            return False
        want = tuple(q.shape[:-1]) + (S,)
        m = (1,) * (q.dim() - attn_mask.dim()) + tuple(attn_mask.shape)
        if any(a not in (1, b) for a, b in zip(m, want)) or m[-3] not in (1, Hq):
            return False
    return True


def _no_backend():
    raise RuntimeError("No viable backend for scaled_dot_product_attention was found. This is "
                       "likely due to turning off both the math kernel and the fused kernels.")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, *, scale=None, enable_gqa=False):
    """``aten::scaled_dot_product_attention`` for tpu tensors (PrivateUse1 and
    AutogradPrivateUse1 kernel, replacing PyTorch's composite kernel there).

    Picks the fused path (``_scaled_dot_product_fused_attention_overrideable``: blockwise
    XLA attention / Pallas / cuDNN, see the module docstring) when
    ``torch.nn.attention.sdpa_kernel`` allows FLASH_ATTENTION, EFFICIENT_ATTENTION or
    OVERRIDEABLE and the call is one it computes (3-D or 4-D inputs of one floating dtype,
    no dropout, masks broadcastable to ``(B, Hq, L, S)``); otherwise PyTorch's own composite
    kernel (the math decomposition, PyTorch's checks and error messages) when MATH is
    allowed; otherwise raises CPU's ``RuntimeError("No viable backend ...")``.  The choice
    is counted in ``torchtpu.metrics()["sdpa"]`` (``"fused"`` / ``"math"``).
    """
    from torchtpu import _metrics

    _ensure_lowered()
    C = torch._C
    fused_on = (C._get_flash_sdp_enabled() or C._get_mem_efficient_sdp_enabled()
                or C._get_overrideable_sdp_enabled())
    if fused_on and _fused_ok(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        _metrics.METRICS.sdpa["fused"] += 1
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:
            # PyTorch's convert_boolean_attn_mask: True keeps, False -> -inf
            bias = torch.zeros(bias.shape, dtype=query.dtype, device=bias.device).masked_fill_(
                bias.logical_not(), float("-inf"))
        return aten._scaled_dot_product_fused_attention_overrideable(
            query, key, value, bias, 0.0, is_causal, False, scale=scale)[0]
    if not C._get_math_sdp_enabled():
        _no_backend()
    _metrics.METRICS.sdpa["math"] += 1
    return _SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                           enable_gqa=enable_gqa)


_ATEN.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")
_ATEN.impl("scaled_dot_product_attention", scaled_dot_product_attention, "PrivateUse1")
