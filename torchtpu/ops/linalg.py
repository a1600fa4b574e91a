"""linalg lowerings: matrix products (mm, bmm, addmm, addmv, mv, dot, vdot, baddbmm,
addbmm, addr, _grouped_mm).

Precision: by default every product is computed with ``precision=jax.lax.Precision.HIGHEST``.
On TPU (and on GPUs with TF32) XLA's default precision multiplies float32 operands in
bfloat16 passes; PyTorch's CPU result is a true float32 product, so by default we ask for
the full-precision algorithm.  ``torch.set_float32_matmul_precision("high" | "medium")``
lowers the float32 products of mm/bmm/mv/dot/addmm/addmv/baddbmm/addbmm to HIGH / DEFAULT
(``_util.matmul_precision``; docs/precision.md); the linalg solvers keep HIGHEST.  float16/bfloat16 operands are multiplied with a float32
accumulator (``preferred_element_type``) and rounded once, like PyTorch's CPU kernels.
``matmul``/``linear``/``einsum`` are CompositeImplicit in PyTorch and reach the backend as
``mm``/``bmm``/``addmm``/``mv``/``dot`` (plus view ops).
"""

from __future__ import annotations

import torch

from torchtpu.ops import aten, lower
from torchtpu.ops._scalar import fits
from torchtpu.ops._util import (
    cast, jnp, lax, matmul_precision, npdt, opmath, promote, round_to, scalar_type_name,
    tdtype,
)

# C++ names of dtypes, as CPU's mm error spells them
_CPP_NAME = {torch.float32: "float", torch.float64: "double", torch.int64: "long int",
             torch.int32: "int", torch.int16: "short int", torch.int8: "signed char",
             torch.uint8: "unsigned char", torch.bool: "bool", torch.bfloat16: "c10::BFloat16",
             torch.float16: "c10::Half", torch.complex64: "c10::complex<float>",
             torch.complex128: "c10::complex<double>"}


def _product_checks(self_, a, b):
    """CPU's operand checks of mm/bmm/mv/dot (``self_`` None) and addmm/addmv/baddbmm:
    one dtype for all operands (no promotion), and no Bool kernel (trace time)."""
    da, db = tdtype(a), tdtype(b)
    ds = tdtype(self_) if self_ is not None else None
    name = scalar_type_name
    if b.ndim == 1 and a.ndim == 2:  # mv / addmv
        s = db if ds is None else ds
        if not (s == da == db):
            raise RuntimeError(f"addmv input tensors must have the same dtype, but got "
                               f"{name(s)}, {name(da)}, and {name(db)}")
        kernel = "addmv_impl_cpu"
    elif a.ndim == 2 and b.ndim == 2:  # mm / addmm
        if ds is not None and ds != db:
            raise RuntimeError(f"self and mat2 must have the same dtype, but got {name(ds)} "
                               f"and {name(db)}")
        if da != db:
            if ds is None:
                raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                                   f"{_CPP_NAME.get(da, name(da))} != {_CPP_NAME.get(db, name(db))}")
            raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got {name(da)} "
                               f"and {name(db)}")
        kernel = "addmm_impl_cpu_"
    else:  # bmm / baddbmm / dot: PyTorch's own checks already refuse mixed dtypes
        kernel = "dot" if a.ndim == 1 else "bmm"
    if da is torch.bool:
        raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\'')


def highest():
    return lax().Precision.HIGHEST


def _acc_dtype(dt: torch.dtype):
    """numpy dtype a product of ``dt`` operands accumulates in."""
    from torchtpu.ops._util import npdt

    return npdt(opmath(dt))


def matmul_(a, b, dt: torch.dtype | None = None, follow_setting: bool = False):
    """``a @ b`` (jnp.matmul broadcasting) in PyTorch's precision; result in opmath(dt).
    ``follow_setting``: float32 products follow ``torch.set_float32_matmul_precision``
    (the calling lowering is registered with ``precision=True``)."""
    if dt is None:
        dt = promote(a, b)
    a, b = cast(a, dt), cast(b, dt)
    prec = matmul_precision(dt) if follow_setting else highest()
    return jnp().matmul(a, b, precision=prec, preferred_element_type=_acc_dtype(dt))


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


@lower(aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default, precision=True)
def mm(a, b):
    """mm / bmm / mv / dot: one matrix product (float32 at the matmul precision setting)."""
    _product_checks(None, a, b)
    return matmul_(a, b, follow_setting=True)


def _grouped_mm_cpu_checks(mat_a, mat_b, offs, out_dtype):
    """The argument checks of CPU's ``_grouped_mm`` kernel, with its messages (RuntimeError):
    the output dtype, where ``offs`` is required and its dtype, and the operands' strides
    (row- or column-major, the leading stride a multiple of 16 bytes)."""
    torch._check(out_dtype is None or out_dtype == mat_a.dtype,
                 lambda: "Grouped gemm output dtype must match `mat_a` dtype")
    torch._check((offs is None) == (mat_a.dim() == 3 and mat_b.dim() == 3),
                 lambda: "Have to provide offsets if there is a 2d matrix, or no offset if "
                         "both matrices are 3d")
    torch._check(offs is None or offs.dtype == torch.int32,
                 lambda: "Offsets have to be int32")
    for mat in (mat_a, mat_b):
        if mat.dim() < 2:
            continue
        st, sh = mat.stride(), mat.shape
        align = max(1, 16 // mat.element_size())
        if st[-1] == 1 and st[-2] >= max(1, sh[-1]):
            lead = st[-2]
        elif st[-2] == 1 and st[-1] >= max(1, sh[-2]):
            lead = st[-1]
        else:
            torch._check(False, lambda: f"Invalid strides/sizes, got {list(st)} for strides "
                                        f"and {list(sh)} for sizes")
        torch._check(lead % align == 0, lambda: "strides should be multiple of 16 bytes")


def grouped_mm_meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Meta (or fake) output of ``aten._grouped_mm`` as CPU's kernel and this lowering
    accept it: any floating dtype shared by both operands (PyTorch's meta kernel, written
    after CUDA's, takes bfloat16 only; for bfloat16 it is used as is), after CPU's own
    argument checks (``_grouped_mm_cpu_checks``).  Raises RuntimeError for mixed dtypes,
    wrong ranks, a missing or extra ``offs`` or mismatched contraction sizes."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor, meta_grouped_mm

    _grouped_mm_cpu_checks(mat_a, mat_b, offs, out_dtype)
    if mat_a.dtype is torch.bfloat16 and mat_b.dtype is torch.bfloat16:
        return meta_grouped_mm(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)
    torch._check(mat_a.dtype == mat_b.dtype and mat_a.dtype.is_floating_point,
                 lambda: f"_grouped_mm: expected floating inputs of one dtype, got "
                         f"mat_a.dtype={mat_a.dtype} and mat_b.dtype={mat_b.dtype}")
    torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
                 lambda: f"Multiplicands must be 2D or 3D but got mat_a.dim()={mat_a.dim()} "
                         f"and mat_b.dim()={mat_b.dim()}")
    torch._check(mat_a.size(-1) == mat_b.size(-2),
                 lambda: f"contraction dimension of mat_a and mat_b must match, got "
                         f"{mat_a.size(-1)} and {mat_b.size(-2)}")
    out = _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype or mat_a.dtype)
    return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device="meta")


@lower(aten._grouped_mm.default, precision=True, meta=grouped_mm_meta)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """``torch._grouped_mm`` (mixture-of-experts layers): products of groups that ``offs``
    (int32[G], cumulative group ends) cuts out of one operand.  2D x 3D: the rows of
    ``a`` in group g times ``b[g]`` -> (M, N); 3D x 2D: ``a[g]`` times the columns of
    ``b`` in group g -> (M, N); 2D x 2D: the contraction split into groups -> (G, M, N);
    3D x 3D: ``bmm``.  Rows/columns past ``offs[-1]`` are zeros (CPU's kernel leaves them
    uninitialized).  Eager mode reaches CPU's composite of ``mm`` calls instead; this
    lowering serves compiled graphs, where the op stays whole."""
    if bias is not None:
        raise NotImplementedError("torchtpu: _grouped_mm with a bias")
    j = jnp()
    dt = promote(a, b)
    if a.ndim == 3 and b.ndim == 3:
        return matmul_(a, b, dt, follow_setting=True)
    # the grouped forms compute in opmath (XLA:CPU has no batched bf16 x bf16 -> f32 dot;
    # a product of two bf16/f16 values is exact in float32, so the float32 accumulation
    # rounded once is the same)
    dt = opmath(dt)
    a, b = cast(a, dt), cast(b, dt)
    ends = offs.astype(j.int32)
    groups = ends.shape[0]
    if a.ndim == 2 and b.ndim == 2:  # the contraction (K) in groups
        k = j.arange(a.shape[1])
        starts = j.concatenate([j.zeros((1,), j.int32), ends[:-1]])
        inside = (k[None, :] >= starts[:, None]) & (k[None, :] < ends[:, None])  # (G, K)
        parts = j.where(inside[:, None, :], a[None], 0)  # (G, M, K)
        return matmul_(parts, b, dt, follow_setting=True)
    rows = a.ndim == 2  # 2D x 3D: rows of a in groups; 3D x 2D: columns of b in groups
    n = a.shape[0] if rows else b.shape[1]
    g = j.searchsorted(ends, j.arange(n, dtype=j.int32), side="right")  # group per row/col
    prods = matmul_(a[None] if rows else a, b if rows else b[None], dt,
                    follow_setting=True)  # (G, M, N)
    gi = j.clip(g, 0, groups - 1)
    if rows:
        out = j.take_along_axis(prods, gi[None, :, None], axis=0)[0]
        return j.where((g < groups)[:, None], out, j.zeros_like(out))
    out = j.take_along_axis(prods, j.broadcast_to(gi[None, None, :], (1,) + prods.shape[1:]),
                            axis=0)[0]
    return j.where((g < groups)[None, :], out, j.zeros_like(out))


@lower(aten.vdot.default)
def vdot(a, b):
    dt = promote(a, b)
    return matmul_(jnp().conj(cast(a, dt)), b, dt)


# beta/alpha: CPU's checked Scalar::to<T>() on the compute type (float for float16 and
# bfloat16 in addmm/baddbmm/addbmm's BLAS paths; the tensor's dtype in addmv/addr)
@lower(aten.addmv.default, prepare=fits(3, 4), precision=True)
@lower(aten.addmm.default, aten.baddbmm.default, prepare=fits(3, 4, opmath=True), precision=True)
def addmm(self_, m1, m2, beta=1, alpha=1):
    """addmm / addmv / baddbmm: ``beta * self + alpha * (m1 @ m2)``."""
    _product_checks(self_, m1, m2)
    dt = promote(m1, m2)
    return _scaled_add(matmul_(m1, m2, dt, follow_setting=True), self_, beta, alpha, dt)


@lower(aten.addbmm.default, prepare=fits(3, 4, opmath=True), precision=True)
def addbmm(self_, b1, b2, beta=1, alpha=1):
    dt = promote(b1, b2)
    a, b = cast(b1, dt), cast(b2, dt)
    # sum over the batch inside the contraction: one dot_general, f32 accumulation
    prod = lax().dot_general(
        a, b, (((0, 2), (0, 1)), ((), ())), precision=matmul_precision(dt),
        preferred_element_type=_acc_dtype(dt))
    return _scaled_add(prod, self_, beta, alpha, dt)


@lower(aten.addr.default, prepare=fits(3, 4))
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



# ------------------------------------------------------------------ decompositions
#
# LAPACK-style factorizations through ``jax.lax.linalg`` with PyTorch's output
# conventions: pivots are 1-based int32 (LAPACK ``getrf``), ``info`` is int32 with the
# batch shape, ``svd`` returns ``(U, S, Vh)``, ``eigh`` returns ascending eigenvalues.
# Matrices with a zero dimension are handled here (XLA's kernels reject some of them).
# Only float32/float64/complex inputs reach these (PyTorch's CPU kernels reject others).


def _mT(x):
    return jnp().swapaxes(x, -1, -2)


def _mH(x):
    return jnp().conj(_mT(x))


def _eye_like(batch, n, dtype):
    j = jnp()
    return j.broadcast_to(j.eye(n, dtype=dtype), tuple(batch) + (n, n))


def _i32():
    from torchtpu.ops._util import npdt

    return npdt(torch.int32)


def _lu_factor(A):
    """(LU, 1-based int32 pivots, 0-based row permutation) of ``A`` (..., m, n)."""
    j = jnp()
    m, n = A.shape[-2:]
    k = min(m, n)
    batch = A.shape[:-2]
    if A.size == 0:
        piv = j.broadcast_to(j.arange(1, k + 1, dtype=_i32()), batch + (k,))
        perm = j.broadcast_to(j.arange(m, dtype=_i32()), batch + (m,))
        return A, piv, perm
    lu, piv, perm = lax().linalg.lu(A)
    return lu, piv.astype(_i32()) + 1, perm.astype(_i32())


def _lu_info(lu):
    """LAPACK getrf's info: 1-based index of the first exactly-zero pivot, else 0."""
    j = jnp()
    k = min(lu.shape[-2:])
    if k == 0:
        return j.zeros(lu.shape[:-2], _i32())
    z = j.diagonal(lu, axis1=-2, axis2=-1) == 0
    return j.where(j.any(z, axis=-1), j.argmax(z, axis=-1) + 1, 0).astype(_i32())


def _pivots_to_perm(piv, m):
    """0-based permutation ``perm`` with ``A[perm] = L @ U`` from 1-based LAPACK pivots."""
    j = jnp()
    if piv.shape[-1] == 0:
        return j.broadcast_to(j.arange(m, dtype=_i32()), piv.shape[:-1] + (m,))
    return lax().linalg.lu_pivots_to_permutation(piv.astype(_i32()) - 1, m)


def _bcast_batch(a, b):
    """Broadcast the batch dims (all but the last two) of ``a`` and ``b``."""
    j = jnp()
    batch = tuple(j.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    return j.broadcast_to(a, batch + a.shape[-2:]), j.broadcast_to(b, batch + b.shape[-2:])


def _tri(a, b, lower, unit=False, adjoint=False):
    """Solve ``op(a) x = b`` for triangular ``a`` (left side); op = identity or ^H."""
    if a.shape[-1] == 0 or b.size == 0:
        return jnp().zeros(b.shape, b.dtype)
    return lax().linalg.triangular_solve(
        a, b, left_side=True, lower=lower, transpose_a=adjoint, conjugate_a=adjoint,
        unit_diagonal=unit)


def _take_rows(x, perm):
    j = jnp()
    perm = j.broadcast_to(perm, x.shape[:-2] + perm.shape[-1:])
    return j.take_along_axis(x, perm[..., :, None].astype(j.int32), axis=-2)


def _lu_solve_left(lu, perm, B, adjoint=False):
    """``A X = B`` (or ``A^H X = B``) with ``A[perm] = L U``; batch dims broadcast."""
    j = jnp()
    lu, B = _bcast_batch(lu, B)
    perm = j.broadcast_to(perm, lu.shape[:-2] + perm.shape[-1:])
    if not adjoint:
        y = _tri(lu, _take_rows(B, perm), lower=True, unit=True)
        return _tri(lu, y, lower=False)
    # A^H = U^H L^H P^T: X = P L^-H U^-H B
    y = _tri(lu, B, lower=False, adjoint=True)
    y = _tri(lu, y, lower=True, unit=True, adjoint=True)
    inv = j.argsort(perm, axis=-1)
    return _take_rows(y, inv)


def _lu_solve(lu, perm, B, left=True, adjoint=False):
    if left:
        return _lu_solve_left(lu, perm, B, adjoint)
    # X op(A) = B  <=>  op(A)^H X^H = B^H
    return _mH(_lu_solve_left(lu, perm, _mH(B), not adjoint))


@lower(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(A, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("torchtpu: linalg_lu_factor_ex with pivot=False")
    lu, piv, _ = _lu_factor(A)
    return lu, piv, _lu_info(lu)


@lower(aten.linalg_lu.default)
def linalg_lu(A, pivot=True):
    if not pivot:
        raise NotImplementedError("torchtpu: linalg_lu with pivot=False")
    j = jnp()
    m, n = A.shape[-2:]
    k = min(m, n)
    lu, _, perm = _lu_factor(A)
    L = j.tril(lu[..., :, :k], -1) + j.eye(m, k, dtype=A.dtype)
    U = j.triu(lu[..., :k, :])
    # A = P L U with P[perm[i], i] = 1
    P = (perm[..., None, :] == j.arange(m)[:, None]).astype(A.dtype)
    return P, L, U


@lower(aten.lu_unpack.default)
def lu_unpack(LU, pivots, unpack_data=True, unpack_pivots=True):
    j = jnp()
    m, n = LU.shape[-2:]
    k = min(m, n)
    if unpack_data:
        L = j.tril(LU[..., :, :k], -1) + j.eye(m, k, dtype=LU.dtype)
        U = j.triu(LU[..., :k, :])
    else:
        L = j.zeros((0,), LU.dtype)
        U = j.zeros((0,), LU.dtype)
    if unpack_pivots:
        perm = _pivots_to_perm(pivots, m)
        P = (perm[..., None, :] == j.arange(m)[:, None]).astype(LU.dtype)
    else:
        P = j.zeros((0,), LU.dtype)
    return P, L, U


@lower(aten.linalg_lu_solve.default)
def linalg_lu_solve(LU, pivots, B, left=True, adjoint=False):
    perm = _pivots_to_perm(pivots, LU.shape[-1])
    return _lu_solve(LU, perm, B, left, adjoint)


def _lu_of(A):
    """PyTorch factors ``A^T`` (F-contiguous when ``A`` is contiguous) for real inputs in
    solve/det/slogdet; we follow the contiguous case."""
    return _mT(A) if not jnp().iscomplexobj(A) else A


# _linalg_solve_ex is a decomposition (ops/decomp_overrides.py): PyTorch's backward formula
# reuses its LU/pivots outputs and decides from A's *layout* whether they factor A or A^T,
# which a value-only lowering cannot see.


def _lu_solve_left_T(lu, perm, B):
    """``A^T X = B`` (plain transpose) with ``A[perm] = L U``."""
    j = jnp()
    return j.conj(_lu_solve_left(lu, perm, j.conj(B), adjoint=True))


@lower(aten.linalg_inv_ex.default)
def linalg_inv_ex(A, check_errors=False):
    n = A.shape[-1]
    lu, _, perm = _lu_factor(A)
    X = _lu_solve_left(lu, perm, _eye_like(A.shape[:-2], n, A.dtype))
    return X, _lu_info(lu)


def _lu_det_parts(A):
    """LU (as CPU factors it), pivots, U's diagonal and the permutation's sign."""
    j = jnp()
    lu, piv, _ = _lu_factor(_lu_of(A))
    n = A.shape[-1]
    d = j.diagonal(lu, axis1=-2, axis2=-1)
    odd = j.sum(piv != j.arange(1, n + 1, dtype=piv.dtype), axis=-1) % 2
    return lu, piv, d, j.where(odd == 1, -1, 1).astype(A.dtype)


@lower(aten._linalg_det.default)
def _linalg_det(A):
    lu, piv, d, sgn = _lu_det_parts(A)
    return sgn * jnp().prod(d, axis=-1), lu, piv


@lower(aten._linalg_slogdet.default)
def _linalg_slogdet(A):
    j = jnp()
    lu, piv, d, sgn = _lu_det_parts(A)
    ad = j.abs(d)
    if j.iscomplexobj(A):
        phase = j.prod(j.where(ad == 0, 0, d / j.where(ad == 0, 1, ad)), axis=-1)
    else:
        phase = j.prod(j.sign(d), axis=-1)
    return sgn * phase, j.sum(j.log(ad), axis=-1), lu, piv


def _chol_info(A):
    """potrf's info: 1-based order of the first leading minor that is not positive
    definite (0 if none), from the pivots of unpivoted elimination on the lower triangle."""
    j = jnp()
    n = A.shape[-1]
    if n == 0:
        return j.zeros(A.shape[:-2], _i32())
    H = j.tril(A) + _mH(j.tril(A, -1))

    def body(i, carry):
        M, info = carry
        p = M[..., i, i]
        pr = j.real(p)
        bad = ~(pr > 0)
        info = j.where((info == 0) & bad, i + 1, info)
        col = M[..., :, i] / j.where(bad, 1, p)[..., None]
        mask = (j.arange(n) > i)
        upd = col[..., :, None] * M[..., i, :][..., None, :]
        M = M - j.where(mask[:, None] & mask[None, :], upd, 0)
        return M, info

    _, info = lax().fori_loop(0, n, body, (H, j.zeros(A.shape[:-2], _i32())))
    return info


@lower(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(A, upper=False, check_errors=False):
    j = jnp()
    if upper:
        A = _mH(A)  # potrf('U') reads the upper triangle: its conjugate is A^H's lower
    if A.size == 0:
        L = A
    else:
        L = j.tril(lax().linalg.cholesky(A, symmetrize_input=False))
    info = _chol_info(A)
    return (_mH(L) if upper else L), info


@lower(aten._linalg_eigh.default)
def _linalg_eigh(A, UPLO="L", compute_v=True):
    j = jnp()
    rdt = j.finfo(A.dtype).dtype if j.iscomplexobj(A) else A.dtype
    if A.size == 0:
        w = j.zeros(A.shape[:-1], rdt)
        v = A
    else:
        X = _widened(A)
        v, w = lax().linalg.eigh(X, lower=(UPLO.upper() == "L"), symmetrize_input=False,
                                 sort_eigenvalues=True)
        v, w = v.astype(A.dtype), w.astype(rdt)
    if not compute_v:
        return w, j.zeros((0,), A.dtype)
    return w, v


def _widened(A):
    """``A`` in float64/complex128 where it is float32/complex64 and the platform has
    native float64 (CPU, GPU): the factorizations XLA gives in single precision (SVD,
    Hermitian eigendecomposition) err 2-3x more than LAPACK's, and their gradients
    amplify that by 1/(s_i^2 - s_j^2); in float64 they round once.  On a TPU, which has
    no native float64, ``A`` itself.  See docs/precision.md."""
    from torchtpu._device import runtime

    j = jnp()
    wide = {j.dtype(j.float32): j.float64, j.dtype(j.complex64): j.complex128}.get(
        j.dtype(A.dtype))
    if wide is None or runtime.platform() == "tpu":
        return A
    return A.astype(wide)


@lower(aten._linalg_svd.default)
def _linalg_svd(A, full_matrices=False, compute_uv=True, driver=None):
    j = jnp()
    m, n = A.shape[-2:]
    k = min(m, n)
    batch = A.shape[:-2]
    rdt = j.finfo(A.dtype).dtype if j.iscomplexobj(A) else A.dtype
    if A.size == 0:
        S = j.zeros(batch + (k,), rdt)
        if full_matrices:
            U, Vh = _eye_like(batch, m, A.dtype), _eye_like(batch, n, A.dtype)
        else:
            U, Vh = j.zeros(batch + (m, k), A.dtype), j.zeros(batch + (k, n), A.dtype)
    else:
        X = _widened(A)  # float64 where native: XLA's float32 SVD errs ~3x LAPACK's
        if compute_uv:
            U, S, Vh = lax().linalg.svd(X, full_matrices=full_matrices, compute_uv=True)
            U, Vh = U.astype(A.dtype), Vh.astype(A.dtype)
        else:
            S = lax().linalg.svd(X, full_matrices=False, compute_uv=False)
        S = S.astype(rdt)
    if not compute_uv:
        e = j.zeros((0,), A.dtype)
        return e, S, e
    return U, S, Vh


@lower(aten.linalg_qr.default)
def linalg_qr(A, mode="reduced"):
    j = jnp()
    m, n = A.shape[-2:]
    k = min(m, n)
    batch = A.shape[:-2]
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of "
                           "'reduced' (default), 'r', or 'complete'")
    full = mode == "complete"
    if A.size == 0:
        Q = _eye_like(batch, m, A.dtype) if full else j.zeros(batch + (m, k), A.dtype)
        R = j.zeros(batch + ((m if full else k), n), A.dtype)
    else:
        Q, R = lax().linalg.qr(A, full_matrices=full)
    if mode == "r":
        return j.zeros((0,), A.dtype), R
    return Q, R


# Ops whose ``check_errors=True`` makes PyTorch raise from their ``info`` output, as
# ``_linalg_check_errors(info, api, is_matrix=A.dim() == 2)`` would: op -> (the API named
# in the error, the position of ``info`` among the outputs).  The lowerings compute
# ``info``; the eager executor (``executor._CheckErrors``) and compiled graphs
# (``compile.graph``) check it on the host.  (``torch.cholesky``, which always checks, is
# a decomposition: ``ops.decomp_overrides.cholesky``.)
CHECK_ERRORS = {aten.linalg_inv_ex.default: ("linalg.inv_ex", 1),
                aten.linalg_cholesky_ex.default: ("linalg.cholesky_ex", 1),
                aten.linalg_lu_factor_ex.default: ("torch.linalg.lu_factor_ex", 2)}


@lower(aten.cholesky_inverse.default)
def cholesky_inverse(L, upper=False):
    """``(L L^H)^-1`` (``(U^H U)^-1`` when ``upper``)."""
    n = L.shape[-1]
    eye = _eye_like(L.shape[:-2], n, L.dtype)
    if upper:
        # A = U^H U:  A^-1 = U^-1 U^-H
        y = _tri(L, eye, lower=False, adjoint=True)
        return _tri(L, y, lower=False)
    y = _tri(L, eye, lower=True)
    return _tri(L, y, lower=True, adjoint=True)


@lower(aten._cholesky_solve_helper.default)
def _cholesky_solve_helper(B, L, upper=False):
    L, B = _bcast_batch(L, B)
    if upper:
        return _tri(L, _tri(L, B, lower=False, adjoint=True), lower=False)
    return _tri(L, _tri(L, B, lower=True), lower=True, adjoint=True)


@lower(aten.linalg_cross.default)
def linalg_cross(a, b, dim=-1):
    j = jnp()
    dt = promote(a, b)
    a, b = cast(a, dt), cast(b, dt)
    shape = j.broadcast_shapes(a.shape, b.shape)
    a, b = j.broadcast_to(a, shape), j.broadcast_to(b, shape)
    d = dim % len(shape)
    a0, a1, a2 = (j.take(a, i, axis=d) for i in range(3))
    b0, b1, b2 = (j.take(b, i, axis=d) for i in range(3))
    if dt in (torch.float16, torch.bfloat16):
        # CPU rounds each product to the dtype before the difference; XLA:CPU keeps a
        # float16 product in float32 through the subtraction (1 ulp off in ~1 of 3), and
        # drops a float32 -> float16 -> float32 round trip (round_to; the difference of
        # two float16 values rounds once in float32)
        def mul(x, y):
            return round_to(cast(x, torch.float32) * cast(y, torch.float32), dt)
    else:
        def mul(x, y):
            return x * y
    return j.stack([mul(a1, b2) - mul(a2, b1), mul(a2, b0) - mul(a0, b2),
                    mul(a0, b1) - mul(a1, b0)], axis=d).astype(npdt(dt))


def _geqrf_layout(vals, i, shape):
    """``Lowering.layout`` of ``geqrf``: CPU's factor is column-major per matrix (LAPACK),
    its ``tau`` row-major."""
    if i != 0:
        return None
    n = len(shape)
    return tuple(range(n - 2)) + (n - 1, n - 2)


@lower(aten.geqrf.default, dynamic_shape=True, layout=_geqrf_layout)
def geqrf(A):
    j = jnp()
    m, n = A.shape[-2:]
    if A.size == 0:
        return A, j.zeros(A.shape[:-2] + (min(m, n),), A.dtype)
    # geqrf is not re-exported by jax.lax.linalg (PyTorch has no meta kernel for it, so
    # this runs eagerly as a dynamic-shape op)
    from jax._src.lax import linalg as _jl

    return _jl.geqrf(A)


@lower(aten.linalg_householder_product.default)
def linalg_householder_product(A, tau):
    j = jnp()
    if A.size == 0 or tau.shape[-1] == 0:
        m, n = A.shape[-2:]
        return j.broadcast_to(j.eye(m, n, dtype=A.dtype), A.shape)
    return lax().linalg.householder_product(A, tau)


@lower(aten.ormqr.default)
def ormqr(A, tau, C, left=True, transpose=False):
    """``op(Q) C`` (or ``C op(Q)``) with Q the full m x m product of the reflectors."""
    j = jnp()
    m = A.shape[-2]
    k = tau.shape[-1]
    if k == 0 or A.size == 0:
        return C
    # full Q: pad the reflectors with zero columns (tau = 0 is the identity reflector)
    Ap = A[..., :, :k]
    if k < m:
        Ap = j.concatenate([Ap, j.zeros(Ap.shape[:-1] + (m - k,), A.dtype)], axis=-1)
        taup = j.concatenate([tau, j.zeros(tau.shape[:-1] + (m - k,), tau.dtype)], axis=-1)
    else:
        taup = tau
    Q = lax().linalg.householder_product(Ap, taup)
    if transpose:
        Q = _mH(Q)
    return matmul_(Q, C) if left else matmul_(C, Q)


@lower(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(A, B, upper, left=True, unitriangular=False):
    dt = promote(A, B)
    A, B = _bcast_batch(cast(A, dt), cast(B, dt))
    if A.shape[-1] == 0 or B.size == 0:
        return jnp().zeros(B.shape, B.dtype)
    return lax().linalg.triangular_solve(A, B, left_side=left, lower=not upper,
                                         unit_diagonal=unitriangular)


@lower(aten.triangular_solve.default)
def triangular_solve(b, A, upper=True, transpose=False, unitriangular=False):
    A2, b2 = _bcast_batch(A, b)
    if A2.shape[-1] == 0 or b2.size == 0:
        X = jnp().zeros(b2.shape, b2.dtype)
    else:
        X = lax().linalg.triangular_solve(A2, b2, left_side=True, lower=not upper,
                                          transpose_a=transpose, unit_diagonal=unitriangular)
    return X, A2


@lower(aten.trace.default)
def trace(x):
    j = jnp()
    dt = tdtype(x)
    if not (dt.is_floating_point or dt.is_complex):
        x = x.astype(j.int64)
    return j.trace(x)


# ------------------------------------------------------------ lstsq / eig (issue 8)

from torchtpu.ops.decomp_overrides import decomp  # noqa: E402

_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


@decomp(aten.linalg_lstsq.default, aten.linalg_lstsq.out)
def linalg_lstsq(A, B, rcond=None, *, driver=None):
    """``torch.linalg.lstsq`` with CPU's outputs for each LAPACK driver (default
    ``gelsy``), computed from an SVD of ``A`` (batch dims broadcast):

    * solution (..., n, k): the minimum-norm least-squares solution, singular values at
      most ``rcond * max(s)`` dropped (``rcond`` default: eps(dtype) * max(m, n));
    * residuals (..., k): squared residual norms when m > n and the driver is not
      ``gelsy`` (``gelsd``/``gelss``: only if every matrix has rank n — read on the host,
      a sync point as on CPU); else empty;
    * rank: (...) int64, empty for ``gels``;
    * singular_values (..., min(m, n)) for ``gelsd``/``gelss``, else empty.

    ``gels`` assumes full rank as LAPACK does; ``gelsy``'s pivoted-QR rank estimate is
    the SVD count here (they agree unless a singular value sits at the cutoff).
    """
    drv = driver or "gelsy"
    if drv not in _LSTSQ_DRIVERS:
        raise RuntimeError("torch.linalg.lstsq: parameter `driver` should be one of "
                           "(gels, gelsy, gelsd, gelss)")
    if A.dim() < 2:
        raise RuntimeError("torch.linalg.lstsq: input must have at least 2 dimensions.")
    vector = B.dim() == A.dim() - 1
    Bm = B.unsqueeze(-1) if vector else B
    m, n = A.shape[-2:]
    batch = torch.broadcast_shapes(A.shape[:-2], Bm.shape[:-2])
    A_ = A.expand(batch + A.shape[-2:])
    B_ = Bm.expand(batch + Bm.shape[-2:])
    real = A.real.dtype if A.is_complex() else A.dtype
    if rcond is None:
        rcond = torch.finfo(real).eps * max(m, n)
    U, S, Vh = torch.linalg.svd(A_, full_matrices=False)
    smax = S.amax(-1, keepdim=True) if S.shape[-1] else S
    keep = S > rcond * smax
    inv = torch.where(keep, 1 / torch.where(keep, S, torch.ones_like(S)), torch.zeros_like(S))
    X = Vh.mH @ (inv.to(A.dtype).unsqueeze(-1) * (U.mH @ B_))
    rank = keep.sum(-1)
    empty = A.new_empty(0, dtype=real)
    residuals = empty
    if m > n and drv != "gelsy":
        full = True
        if drv in ("gelsd", "gelss"):
            full = bool((rank == n).all().item())
        if full:
            r = A_ @ X - B_
            residuals = (r * r.conj()).real.sum(-2) if r.is_complex() else (r * r).sum(-2)
    if vector:
        X = X.squeeze(-1)
    rank_out = rank if drv != "gels" else A.new_empty(0, dtype=torch.int64)
    sv = S if drv in ("gelsd", "gelss") else empty
    return X, residuals, rank_out, sv


@lower(aten.linalg_eig.default)
def linalg_eig(A):
    """Eigenvalues and right eigenvectors of a square (batched) matrix, complex
    (``complex64`` for float32/complex64 input, ``complex128`` for float64/complex128),
    eigenvectors of unit norm, as LAPACK ``geev`` (CPU's kernel) returns them.

    XLA implements the general eigendecomposition only on its CPU platform: on GPU/TPU
    this raises NotImplementedError (enable the CPU fallback to run it on the host).
    """
    from torchtpu._device import runtime

    if runtime.platform() != "cpu":
        raise NotImplementedError(
            f"torchtpu: aten.linalg_eig (torch.linalg.eig) has no XLA implementation on the "
            f"{runtime.platform()} platform (XLA's general eigensolver is CPU-only); set "
            f"torch.tpu.enable_cpu_fallback = True to run it on the host CPU")
    j = jnp()
    if A.size == 0:
        cdt = j.result_type(A.dtype, j.complex64)
        return j.zeros(A.shape[:-1], cdt), j.zeros(A.shape, cdt)
    w, v = runtime.jax().numpy.linalg.eig(A)
    return w, v


# --- quantized matrix products (torchao's int8 / int8-weight / float8 paths) ----------

def _int_mm_meta(a, b, out=None):
    """Output of ``aten._int_mm`` (``out``: ``_int_mm.out``'s destination) after CPU's
    checks (``_int_mm_out_cpu``, RuntimeError with its messages; PyTorch's meta kernel
    words them differently)."""
    torch._check(a.dim() == 2, lambda: f"int_mm_out_cpu: Expected self to be of dimension 2 "
                                       f"but got {a.dim()}")
    torch._check(b.dim() == 2, lambda: f"int_mm_out_cpu: Expected mat2 to be of dimension 2 "
                                       f"but got {b.dim()}")
    torch._check(a.size(1) == b.size(0),
                 lambda: f"int_mm_out_cpu: self.size(1) needs to match mat2.size(0) but got "
                         f"{a.size(1)} and {b.size(0)}")
    torch._check(a.dtype in (torch.int8, torch.uint8),
                 lambda: f"int_mm_out_cpu: Expected self dtype to be int8 or uint8 but got "
                         f"{_CPP_NAME.get(a.dtype, scalar_type_name(a.dtype))}")
    torch._check(b.dtype is torch.int8,
                 lambda: f"int_mm_out_cpu: Expected mat2 dtype to be of type int8 but got "
                         f"{_CPP_NAME.get(b.dtype, scalar_type_name(b.dtype))}")
    torch._check(out is None or out.dtype is torch.int32,
                 lambda: f"int_mm_out_cpu: Expected result dtype to be of type kInt but got "
                         f"{_CPP_NAME.get(out.dtype, scalar_type_name(out.dtype))}")
    if out is not None:  # CPU's out= is checked, never resized
        for i, want in ((0, a.size(0)), (1, b.size(1))):
            got = out.size(i) if out.dim() > i else None
            torch._check(got == want, lambda i=i, want=want, got=got:
                         f"int_mm_out_cpu: Expected result.size({i}) to be {want} but got "
                         f"{got}")
        torch._check(out.dim() == 2, lambda: f"int_mm_out_cpu: Expected result to be of "
                                             f"dimension 2 but got {out.dim()}")
        torch._check(out.is_contiguous(),
                     lambda: "int_mm_out_cpu: Expected result to be contiguous.")
    return torch.empty((a.size(0), b.size(1)), dtype=torch.int32, device="meta")


@lower(aten._int_mm.default, meta=_int_mm_meta)
def _int_mm(a, b):
    """``torch._int_mm``: int8 (M, K) (or uint8) x int8 (K, N) -> int32 (M, N), an XLA
    integer dot accumulating in int32 (no float conversion), like CPU's
    ``_int_mm_out_cpu`` (LinearAlgebra.cpp): exact, and a sum past the int32 range wraps
    around as CPU's does.  Errors (RuntimeError, CPU's messages, ``_int_mm_meta``): either
    operand not 2-D, ``a.size(1) != b.size(0)``, ``a`` not int8/uint8, ``b`` not int8.
    CPU has no size constraints (M, N, K of any size, zero included).  ``_int_mm.out``
    runs this and writes the result through (its destination must be int32)."""
    j = jnp()
    i32 = j.int32
    if a.dtype != b.dtype:  # uint8 x int8: both widened to int16 (exact)
        a, b = a.astype(j.int16), b.astype(j.int16)
    return lax().dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=i32)


def _weight_int8pack_mm_meta(x, w, scales):
    """Output of ``aten._weight_int8pack_mm`` after CPU's checks
    (``_weight_int8pack_mm_cpu``, RuntimeError with its messages; a 1-D ``x`` is an
    IndexError there, from ``x.size(1)``)."""
    x.size(1)  # IndexError for a 0-d / 1-d x, as on CPU
    name = "_weight_int8pack_mm_cpu"
    torch._check(x.dtype in (torch.float32, torch.bfloat16, torch.float16),
                 lambda: f"{name} : expect A to be either 32-bit or 16-bit float tensor.")
    torch._check(w.dtype is torch.int8, lambda: f"{name} : expect B to be int8 tensor.")
    torch._check(w.is_contiguous(), lambda: f"{name} : expect B to be contiguous.")
    torch._check(w.dim() == 2 and w.size(1) == x.size(1),
                 lambda: f"{name} : expect B to be 2D tensor with size(1) == A.size(1).")
    n = w.size(0)
    torch._check(scales.dim() == 1 and scales.size(0) == n,
                 lambda: f"{name} : expect scales to be 1d tensor with size {n}")
    torch._check(x.dim() == 2, lambda: f"{name} : expect A to be 2D tensor.")
    torch._check(scales.dtype == x.dtype,
                 lambda: f"expected scalar type {scalar_type_name(x.dtype)} but found "
                         f"{scalar_type_name(scales.dtype)}")
    return torch.empty((x.size(0), n), dtype=x.dtype, device="meta")


@lower(aten._weight_int8pack_mm.default, meta=_weight_int8pack_mm_meta)
def _weight_int8pack_mm(x, w, scales):
    """``torch._weight_int8pack_mm`` (int8 weight-only linear): ``x`` (M, K) float32 /
    bfloat16 / float16, ``w`` int8 (N, K), ``scales`` (N,) in ``x``'s dtype -> (M, N) in
    ``x``'s dtype: ``(x @ w.T)`` accumulated in float32, times ``scales`` in float32,
    rounded once to ``x``'s dtype, as CPU's ``int8pack_mm_kernel`` (int8mm_kernel.cpp)
    does.  ``w`` enters the dot converted to ``x``'s dtype (exact: int8 fits every float
    format's significand) with a float32 accumulator.  Errors (``_weight_int8pack_mm_meta``,
    CPU's types and messages): ``x`` not float32/bfloat16/float16 or not 2-D, ``w`` not
    int8, K mismatch, ``scales`` not (N,) or not ``x``'s dtype."""
    j = jnp()
    f32 = j.float32
    dt = tdtype(x)
    acc = lax().dot_general(x, cast(w, dt), (((1,), (1,)), ((), ())), precision=highest(),
                            preferred_element_type=f32)
    return cast(acc * scales.astype(f32)[None, :], dt)


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _scaled_mm_meta(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                    use_fast_accum=False):
    """Output of ``aten._scaled_mm`` after the checks of CPU's emulated kernel
    (``_scaled_mm_out_cpu`` -> ``_scaled_mm_out_cpu_emulated``, LinearAlgebra.cpp), with
    its exception types and messages; PyTorch's meta kernel follows CUDA (K a multiple of
    16, column-major ``mat2``), which CPU does not ask for.  ValueError: not float8
    operands / scales neither tensor-wise (one float32 element each) nor row-wise
    (float32 (M, 1) and (1, N), contiguous).  RuntimeError: an operand not 2-D, K
    mismatch, ``scale_result`` not one float32 element, ``bias`` without N elements."""
    def tensorwise(t, s):
        return t.dtype in _FP8 and s.dtype == torch.float32 and s.numel() == 1

    def rowwise(t, s):
        return (t.dtype in _FP8 and s.dtype == torch.float32 and s.dim() == 2
                and s.size(0) == t.size(0) and s.size(1) == 1 and s.is_contiguous())

    bt = b.t() if b.dim() == 2 else b
    if not (tensorwise(a, scale_a) and tensorwise(bt, scale_b)):
        if not (a.dim() == 2 and b.dim() == 2 and rowwise(a, scale_a)
                and rowwise(bt, scale_b.t() if scale_b.dim() == 2 else scale_b)):
            raise ValueError(
                "Invalid scaling configuration.\n- For TensorWise scaling, a and b should be "
                "float8, scales should be float and singletons.\n- For RowWise scaling, a and "
                "b should be float8, scales should be float, scale_a should be "
                f"({a.size(0) if a.dim() else 1}, 1) and scale_b should be "
                f"(1, {b.size(-1) if b.dim() else 1}), and both should be contiguous.\n"
                f"Got mat_a.dtype()={a.dtype}, scale_a.dtype()={scale_a.dtype}, "
                f"scale_a.size()={list(scale_a.shape)}, mat_b.dtype()={b.dtype}, "
                f"scale_b.dtype()={scale_b.dtype}, scale_b.size()={list(scale_b.shape)}")
    torch._check(a.dim() == 2, lambda: "mat1 must be a matrix")
    torch._check(b.dim() == 2, lambda: "mat2 must be a matrix")
    torch._check(a.size(1) == b.size(0),
                 lambda: f"mat_a and mat_b shapes cannot be multiplied ({a.size(0)}x{a.size(1)} "
                         f"and {b.size(0)}x{b.size(1)})")
    torch._check(scale_result is None or (scale_result.numel() == 1
                                          and scale_result.dtype == torch.float32),
                 lambda: "scale_result must be a float scalar")
    torch._check(bias is None or bias.numel() == b.size(1),
                 lambda: f"Bias must be size {b.size(1)} but got {bias.numel()}")
    if bias is not None:
        torch.broadcast_shapes(bias.shape, (a.size(0), b.size(1)))  # RuntimeError, as add_
    return torch.empty((a.size(0), b.size(1)), dtype=out_dtype or a.dtype, device="meta")


@lower(aten._scaled_mm.default, precision=False, meta=_scaled_mm_meta)
def _scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
               use_fast_accum=False):
    """``torch._scaled_mm`` for float8 (float8_e4m3fn / float8_e5m2, mixed allowed) operands
    ``a`` (M, K), ``b`` (K, N), as CPU's emulated kernel (``_scaled_mm_out_cpu_emulated``)
    computes it: ``(float32(a) * scale_a) @ (float32(b) * scale_b)`` in float32 (full
    precision), ``+ bias`` (promoted, as ``add_`` into the float32 result), times
    ``1 / scale_result`` only where ``out_dtype`` is given and float8, then cast to
    ``out_dtype`` (default: ``a``'s dtype; float8_e4m3fn saturates like PyTorch's cast).
    Scales are tensor-wise (one float32 element each) or row-wise (float32 (M, 1) and
    (1, N)); CPU multiplies them into the operands before the product, so an fp8 x fp8
    XLA dot scaled afterwards would round differently: the dot is float32 x float32.
    ``use_fast_accum`` is ignored, as on CPU.  Errors: ``_scaled_mm_meta``.  (CPUs with
    AMX run oneDNN's fp8 kernel instead, whose float32 sums may differ in the last ulp.)"""
    j = jnp()
    f32 = j.float32
    sa = scale_a.astype(f32).reshape(() if scale_a.size == 1 else scale_a.shape)
    sb = scale_b.astype(f32).reshape(() if scale_b.size == 1 else scale_b.shape)
    fa = a.astype(f32) * sa
    fb = b.astype(f32) * sb
    out = j.matmul(fa, fb, precision=highest(), preferred_element_type=f32)
    if bias is not None:
        ct = torch.promote_types(torch.float32, tdtype(bias))
        out = cast(cast(out, ct) + cast(bias, ct), torch.float32)
    if out_dtype in _FP8 and scale_result is not None:
        inv = (j.float32(1) / scale_result.astype(f32)).reshape(())
        out = out * inv
    return cast(out, out_dtype or tdtype(a))
