"""linalg lowerings: matrix products (mm, bmm, addmm, addmv, mv, dot, vdot, baddbmm,
addbmm, addr).

Precision: every product is computed with ``precision=jax.lax.Precision.HIGHEST``.  On
TPU (and on GPUs with TF32) XLA's default precision multiplies float32 operands in
bfloat16 passes; PyTorch's CPU result is a true float32 product, so we always ask for the
full-precision algorithm.  float16/bfloat16 operands are multiplied with a float32
accumulator (``preferred_element_type``) and rounded once, like PyTorch's CPU kernels.
``matmul``/``linear``/``einsum`` are CompositeImplicit in PyTorch and reach the backend as
``mm``/``bmm``/``addmm``/``mv``/``dot`` (plus view ops).
"""

from __future__ import annotations

import torch

from torchtpu.ops import aten, lower
from torchtpu.ops._util import cast, jnp, lax, opmath, promote


def highest():
    return lax().Precision.HIGHEST


def _acc_dtype(dt: torch.dtype):
    """numpy dtype a product of ``dt`` operands accumulates in."""
    from torchtpu.ops._util import npdt

    return npdt(opmath(dt))


def matmul_(a, b, dt: torch.dtype | None = None):
    """``a @ b`` (jnp.matmul broadcasting) in PyTorch's precision; result in opmath(dt)."""
    if dt is None:
        dt = promote(a, b)
    a, b = cast(a, dt), cast(b, dt)
    return jnp().matmul(a, b, precision=highest(), preferred_element_type=_acc_dtype(dt))


def _scaled_add(prod, self_, beta, alpha, dt):
    """``beta * self + alpha * prod`` with PyTorch's rule that beta == 0 ignores self
    (NaN/inf in self are not propagated) and alpha == 1 / beta == 1 are exact."""
    j = jnp()
    ct = opmath(dt)
    prod = cast(prod, ct)
    if alpha is not None:
        prod = prod * cast(alpha, ct)
    s = cast(self_, ct)
    if beta is None:
        return s + prod
    b = cast(beta, ct)
    sb = j.where(b == 0, j.zeros_like(s), s * b)
    return sb + prod


@lower(aten.mm.default)
def mm(a, b):
    return matmul_(a, b)


@lower(aten.bmm.default)
def bmm(a, b):
    return matmul_(a, b)


@lower(aten.mv.default)
def mv(a, v):
    return matmul_(a, v)


@lower(aten.dot.default)
def dot(a, b):
    return matmul_(a, b)


@lower(aten.vdot.default)
def vdot(a, b):
    dt = promote(a, b)
    return matmul_(jnp().conj(cast(a, dt)), b, dt)


@lower(aten.addmm.default)
def addmm(self_, m1, m2, beta=1, alpha=1):
    dt = promote(m1, m2)
    return _scaled_add(matmul_(m1, m2, dt), self_, beta, alpha, dt)


@lower(aten.addmv.default)
def addmv(self_, mat, vec, beta=1, alpha=1):
    dt = promote(mat, vec)
    return _scaled_add(matmul_(mat, vec, dt), self_, beta, alpha, dt)


@lower(aten.baddbmm.default)
def baddbmm(self_, b1, b2, beta=1, alpha=1):
    dt = promote(b1, b2)
    return _scaled_add(matmul_(b1, b2, dt), self_, beta, alpha, dt)


@lower(aten.addbmm.default)
def addbmm(self_, b1, b2, beta=1, alpha=1):
    dt = promote(b1, b2)
    a, b = cast(b1, dt), cast(b2, dt)
    # sum over the batch inside the contraction: one dot_general, f32 accumulation
    prod = lax().dot_general(
        a, b, (((0, 2), (0, 1)), ((), ())), precision=highest(),
        preferred_element_type=_acc_dtype(dt))
    return _scaled_add(prod, self_, beta, alpha, dt)


@lower(aten.addr.default)
def addr(self_, v1, v2, beta=1, alpha=1):
    dt = promote(v1, v2)
    ct = opmath(dt)
    prod = cast(v1, ct)[:, None] * cast(v2, ct)[None, :]
    if dt is torch.bool:
        # bool addr: logical ops (beta and alpha act as bools)
        j = jnp()
        p = (cast(v1, dt)[:, None] & cast(v2, dt)[None, :]) & (cast(alpha, torch.bool))
        s = cast(self_, torch.bool) & cast(beta, torch.bool)
        return j.logical_or(s, p)
    return _scaled_add(prod, self_, beta, alpha, dt)

