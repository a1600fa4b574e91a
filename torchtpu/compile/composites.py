"""Graph-only decompositions of ATen ops that PyTorch implements as C++ composites.

Eager mode never receives these ops: their ``CompositeExplicitAutograd`` /
``CompositeExplicitAutogradNonFunctional`` C++ kernels serve every backend, ``tpu``
included, and call ops our lowering table has.  AOTAutograd's trace keeps them whole
(they have their own autograd formulas), and PyTorch ships no Python decomposition for
them, so a graph holding one would name an op without a lowering.  Each function below
computes what the C++ kernel computes, from the same sub-ops, in the same order where the
order decides rounding; ``torchtpu.compile.decompositions.decompositions`` adds them to the set
AOTAutograd applies.

- ``linalg_pinv.atol_rtol_tensor`` (``torch.linalg.pinv``, ``torch.pinverse``): the
  pseudo-inverse from the SVD (``hermitian=True``: the eigendecomposition), singular
  values at or below ``max(atol, rtol * largest)`` dropped; the default ``rtol`` is
  ``eps(dtype) * max(m, n)``, or 0 when a positive ``atol`` is given (float64 tolerances,
  as PyTorch builds them).
- ``cholesky_solve``: the batch dimensions of both operands broadcast, then
  ``_cholesky_solve_helper`` (which the lowering table has).
- ``_foreach_norm.Scalar`` (``clip_grad_norm_``): one ``linalg_vector_norm`` per tensor,
  PyTorch's per-tensor fallback.
- ``masked_scatter_backward``: a running count places the selected gradient elements
  (static shapes, where PyTorch's kernel reads a count from the values).
- ``_trilinear`` (``torch.nn.functional.bilinear``): two products summed over the
  contracted dimensions, as PyTorch's kernel pairs them (the first two operands over the
  dimensions the third lacks, then with the third).

(``as_strided_scatter`` is not decomposed in graphs: its result depends on its input's
storage offset, which Dynamo does not guard, so it runs in eager mode as a sync node of a
staged graph, ``torchtpu.compile.staged``.)
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _real_eps(dtype: torch.dtype) -> float:
    real = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)
    return torch.finfo(real).eps


def linalg_pinv(A, *, atol=None, rtol=None, hermitian=False):
    """``aten.linalg_pinv.atol_rtol_tensor``: ``A`` (..., m, n) float32/float64/complex
    -> (..., n, m), the Moore-Penrose pseudo-inverse (torch.linalg.pinv's documented
    semantics; ``atol`` / ``rtol`` optional real tensors broadcast over the batch)."""
    m, n = A.shape[-2], A.shape[-1]
    opts = dict(dtype=torch.float64, device=A.device)
    atol_t = atol if atol is not None else torch.zeros((), **opts)
    if rtol is None:
        default = torch.full((), _real_eps(A.dtype) * max(m, n), **opts)
        rtol = torch.where(atol > 0, torch.zeros((), **opts), default) if atol is not None \
            else default
    if A.numel() == 0:
        U, S, V = torch.svd(A)
        return torch.matmul(V * S.reciprocal().unsqueeze(-2), U.mH)
    if not hermitian:
        U, S, V = torch.svd(A)
        largest = S.narrow(-1, 0, 1)  # singular values come in descending order
        tol = torch.max(atol_t.unsqueeze(-1), rtol.unsqueeze(-1) * largest)
        inv = torch.where(S > tol, S.reciprocal(), torch.zeros((), dtype=S.dtype,
                                                               device=S.device)).to(A.dtype)
        return torch.matmul(V * inv.unsqueeze(-2), U.mH)
    L, Q = torch.linalg.eigh(A)
    absL = L.abs()
    largest = absL.amax(-1, keepdim=True)
    tol = torch.max(atol_t.unsqueeze(-1), rtol.unsqueeze(-1) * largest)
    inv = torch.where(absL > tol, L.reciprocal(), torch.zeros((), dtype=L.dtype,
                                                              device=L.device)).to(A.dtype)
    return torch.matmul(Q * inv.unsqueeze(-2), Q.mH)


def cholesky_solve(B, L, upper=False):
    """``aten.cholesky_solve``: ``B`` (..., n, k), ``L`` (..., n, n) a Cholesky factor ->
    (broadcast batch, n, k), the solution of ``(L L^H) X = B``."""
    batch = torch.broadcast_shapes(B.shape[:-2], L.shape[:-2])
    Bb = B.expand(*batch, *B.shape[-2:])
    Lb = L.expand(*batch, *L.shape[-2:])
    return aten._cholesky_solve_helper(Bb, Lb, upper)


def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """``aten._trilinear``: the three operands unsqueezed at their ``expand`` dimensions
    (all then have ``i1.dim() + len(expand1)`` dimensions), multiplied and summed over
    ``sumdim`` (those dimensions dropped).  PyTorch's kernel loops over ``unroll_dim`` to
    bound memory; the sums are the same."""
    total = i1.dim() + len(expand1)
    ex1, ex2, ex3 = (set(d % total for d in e) for e in (expand1, expand2, expand3))
    sums = set(d % total for d in sumdim)
    a, b, c = i1, i2, i3
    sizes = []
    sum12, sum23 = [], []
    for d in range(total):
        s = 0
        if d in ex1:
            a = a.unsqueeze(d)
        else:
            s = a.shape[d]
        if d in ex2:
            b = b.unsqueeze(d)
        else:
            s = b.shape[d]
        if d in ex3:
            c = c.unsqueeze(d)
            if d in sums:
                sum12.append(d)
        else:
            s = c.shape[d]
            if d in sums:
                sum23.append(d)
        sizes.append(1 if d in sums else s)
    if any(s == 0 for s in sizes):
        out = torch.zeros(sizes, dtype=i1.dtype, device=i1.device)
    else:
        buf = a * b
        if sum12:
            buf = buf.sum(sum12, keepdim=True)
        out = buf * c
        if sum23:
            out = out.sum(sum23, keepdim=True)
        out = out.expand(sizes) if list(out.shape) != sizes else out
    for d in sorted(sums, reverse=True):
        out = out.squeeze(d)
    return out.to(i1.dtype)


def masked_scatter_backward(grad, mask, sizes):
    """``aten.masked_scatter_backward``: the gradient of ``masked_scatter``'s ``source``
    (shape ``sizes``): ``grad``'s elements where ``mask`` (broadcast with it) is set, in
    order, then zeros.  PyTorch's kernel is ``masked_select`` (a size read from the
    values) plus padding; here each selected element's position is a running count and
    one ``index_put`` writes them (the unselected ones into a spare slot past the end),
    so the graph keeps static shapes."""
    numel = 1
    for d in sizes:
        numel = numel * d
    g, m = torch.broadcast_tensors(grad, mask)
    g, m = g.reshape(-1), m.reshape(-1)
    pos = torch.cumsum(m.to(torch.int64), 0) - 1
    pos = torch.where(m, pos, torch.full_like(pos, numel))
    out = torch.zeros(numel + 1, dtype=grad.dtype, device=grad.device)
    out = out.index_put((pos,), g)
    return out[:numel].view(sizes)


def foreach_norm(self, ord=2, dtype=None):
    """``torch._foreach_norm`` (``clip_grad_norm_``'s per-gradient norms): one
    ``linalg_vector_norm`` per tensor, as PyTorch's own per-tensor fallback computes it
    (eager tpu runs that fallback; a graph keeps the foreach op whole)."""
    return [aten.linalg_vector_norm.default(t, ord, dtype=dtype) for t in self]


def decompositions() -> dict:
    """``{OpOverload: function}`` of this module's decompositions."""
    return {aten._foreach_norm.Scalar: foreach_norm,
            aten.linalg_pinv.atol_rtol_tensor: linalg_pinv,
            aten.cholesky_solve.default: cholesky_solve,
            aten._trilinear.default: trilinear,
            aten.masked_scatter_backward.default: masked_scatter_backward}
