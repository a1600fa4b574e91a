"""Decompositions of our own for ops PyTorch's ``torch._decomp`` does not cover
(or covers in a way that is wrong for XLA).  Keyed by ATen overload, like
``torch._decomp.decomposition_table``; consulted after the lowering table."""

from __future__ import annotations

import torch

aten = torch.ops.aten
_TABLE: dict = {}


def decomp(*ops):
    def deco(fn):
        for op in ops:
            _TABLE[op] = fn
        return fn

    return deco


def table() -> dict:
    return _TABLE


@decomp(aten.equal.default)
def equal(a, b):
    """``torch.equal``: same shape and every element equal (NaN != NaN), a Python bool
    (a sync point)."""
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.eq(a, b).all().item())


# ------------------------------------------------------------ fused RNN cells
# nn.LSTM / nn.GRU on a non-CPU device call the fused cell kernels (CUDA has them; PyTorch
# has no decomposition).  Written with ordinary ops, which are lowered; the workspace
# layout is ours (only our backward reads it): LSTM [i, f, g, o] activated gates,
# GRU [r, z, n, hx, hn].


@decomp(aten._thnn_fused_lstm_cell.default)
def _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


@decomp(aten._thnn_fused_lstm_cell_backward_impl.default)
def _thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = workspace.chunk(4, 1)
    tcy = cy.tanh()
    gh = grad_hy if grad_hy is not None else torch.zeros_like(cy)
    d_cy = gh * o * (1 - tcy * tcy)
    if grad_cy is not None:
        d_cy = d_cy + grad_cy
    d_o = gh * tcy
    grad_gates = torch.cat([d_cy * g * i * (1 - i), d_cy * cx * f * (1 - f),
                            d_cy * i * (1 - g * g), d_o * o * (1 - o)], 1)
    grad_bias = grad_gates.sum(0) if has_bias else torch.empty(0, dtype=cy.dtype, device=cy.device)
    return grad_gates, d_cy * f, grad_bias


@decomp(aten._thnn_fused_gru_cell.default)
def _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    ir, ii, inn = input_gates.chunk(3, 1)
    hr, hi, hn = hidden_gates.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (ii + hi).sigmoid()
    n = (inn + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat([r, z, n, hx, hn], 1)


@decomp(aten._thnn_fused_gru_cell_backward.default)
def _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    d_n = grad_hy * (1 - z) * (1 - n * n)
    d_z = grad_hy * (hx - n) * z * (1 - z)
    d_r = d_n * hn * r * (1 - r)
    grad_input = torch.cat([d_r, d_z, d_n], 1)
    grad_hidden = torch.cat([d_r, d_z, d_n * r], 1)
    if has_bias:
        gib, ghb = grad_input.sum(0), grad_hidden.sum(0)
    else:
        gib = ghb = torch.empty(0, dtype=hx.dtype, device=hx.device)
    return grad_input, grad_hidden, grad_hy * z, gib, ghb


# ------------------------------------------------------------ fused optimizers
# Adam/AdamW(fused=True) call these (CUDA/CPU have fused kernels).  The step counts are
# already incremented by the optimizer; a found_inf step (AMP) leaves everything as is.


def _fused_adam_impl(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr,
                     beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale,
                     found_inf, decoupled):
    for i, p in enumerate(params):
        g = grads[i]
        if grad_scale is not None:
            g = g / grad_scale
        if maximize:
            g = -g
        step = state_steps[i].to(p.device, torch.float32)
        new_p = p
        if weight_decay != 0:
            if decoupled:
                new_p = p * (1 - lr * weight_decay)
            else:
                g = g + weight_decay * p
        m = exp_avgs[i] * beta1 + g * (1 - beta1)
        v = exp_avg_sqs[i] * beta2 + g * g * (1 - beta2)
        bc1 = 1 - torch.pow(beta1, step)
        bc2_sqrt = (1 - torch.pow(beta2, step)).sqrt()
        if amsgrad:
            vmax = torch.maximum(max_exp_avg_sqs[i], v)
            denom = vmax.sqrt() / bc2_sqrt + eps
        else:
            denom = v.sqrt() / bc2_sqrt + eps
        new_p = new_p - (lr / bc1) * m / denom
        if found_inf is not None:
            skip = found_inf.to(p.device) != 0
            new_p, m, v = (torch.where(skip, a, b) for a, b in
                           ((p, new_p), (exp_avgs[i], m), (exp_avg_sqs[i], v)))
            if amsgrad:
                vmax = torch.where(skip, max_exp_avg_sqs[i], vmax)
        p.copy_(new_p)
        exp_avgs[i].copy_(m)
        exp_avg_sqs[i].copy_(v)
        if amsgrad:
            max_exp_avg_sqs[i].copy_(vmax)


def _fused(decoupled):
    def fn(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
           beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        if isinstance(lr, torch.Tensor):
            lr = lr.item()
        _fused_adam_impl(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                         lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale,
                         found_inf, decoupled)

    return fn


decomp(aten._fused_adam_.default, aten._fused_adam_.tensor_lr)(_fused(False))
decomp(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr)(_fused(True))


# ------------------------------------------------------------------ embedding bag
# nn.EmbeddingBag / F.embedding_bag (mode 0 sum, 1 mean, 2 max), written with lowered ops.


def _bags(offsets, n, include_last_offset):
    starts = offsets[:-1] if include_last_offset else offsets
    pos = torch.arange(n, device=offsets.device)
    return starts.numel(), torch.searchsorted(starts, pos, right=True) - 1


@decomp(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    n, d = indices.numel(), weight.shape[1]
    b, offset2bag = _bags(offsets, n, include_last_offset)
    keep = indices != padding_idx if padding_idx >= 0 else torch.ones_like(indices, dtype=torch.bool)
    rows = weight.index_select(0, indices)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1)
    bag_size = torch.zeros(b, dtype=torch.long, device=weight.device).index_add(
        0, offset2bag, keep.long())
    max_indices = torch.zeros(b, d, dtype=torch.long, device=weight.device) if mode == 2 else \
        torch.zeros(b, dtype=torch.long, device=weight.device)
    if mode == 2:
        neg = torch.full_like(rows, float("-inf"))
        masked = torch.where(keep.unsqueeze(1), rows, neg)
        idx2 = offset2bag.unsqueeze(1).expand(n, d)
        out = torch.full((b, d), float("-inf"), dtype=weight.dtype, device=weight.device)
        out = out.scatter_reduce(0, idx2, masked, "amax", include_self=True)
        # the first position reaching the max, then its weight row
        hit = (masked == out.index_select(0, offset2bag)) & keep.unsqueeze(1)
        pos = torch.arange(n, device=weight.device).unsqueeze(1).expand(n, d)
        first = torch.full((b, d), n, dtype=torch.long, device=weight.device).scatter_reduce(
            0, idx2, torch.where(hit, pos, torch.full_like(pos, n)), "amin", include_self=True)
        empty = (bag_size == 0).unsqueeze(1)
        max_indices = torch.where(empty, torch.zeros_like(first),
                                  indices.index_select(0, first.clamp(max=max(n - 1, 0)).view(-1)
                                                       ).view(b, d) if n else first)
        out = torch.where(empty, torch.zeros_like(out), out)
    else:
        rows = rows * keep.unsqueeze(1).to(rows.dtype)
        out = torch.zeros(b, d, dtype=weight.dtype, device=weight.device).index_add(
            0, offset2bag, rows)
        if mode == 1:
            out = out / bag_size.clamp(min=1).unsqueeze(1).to(out.dtype)
    return out, offset2bag, bag_size, max_indices


@decomp(aten._embedding_bag_dense_backward.default)
def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                  num_weights, scale_grad_by_freq, mode,
                                  per_sample_weights, padding_idx=-1):
    d = grad.shape[1]
    gw = torch.zeros(num_weights, d, dtype=grad.dtype, device=grad.device)
    if mode == 2:
        valid = (bag_size > 0).unsqueeze(1).expand_as(maximum_indices)
        cols = torch.arange(d, device=grad.device).expand_as(maximum_indices)
        g = torch.where(valid, grad, torch.zeros_like(grad))
        return gw.index_put((maximum_indices.reshape(-1), cols.reshape(-1)), g.reshape(-1),
                            accumulate=True)
    rows = grad.index_select(0, offset2bag)
    if mode == 1:
        rows = rows / bag_size.index_select(0, offset2bag).clamp(min=1).unsqueeze(1).to(rows.dtype)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1)
    if padding_idx >= 0:
        rows = rows * (indices != padding_idx).unsqueeze(1).to(rows.dtype)
    if scale_grad_by_freq:
        counts = torch.zeros(num_weights, dtype=grad.dtype, device=grad.device).index_add(
            0, indices, torch.ones_like(indices, dtype=grad.dtype))
        rows = rows / counts.index_select(0, indices).unsqueeze(1)
    return gw.index_add(0, indices, rows)


@decomp(aten._embedding_bag_backward.default)
def _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                            num_weights, scale_grad_by_freq, mode, sparse,
                            per_sample_weights, padding_idx=-1):
    if sparse:
        raise NotImplementedError("torchtpu: EmbeddingBag(sparse=True) gradients")
    return _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                         num_weights, scale_grad_by_freq, mode,
                                         per_sample_weights, padding_idx)


@decomp(aten._linalg_solve_ex.default)
def _linalg_solve_ex(A, B, left=True, check_errors=False):
    """As PyTorch's CPU kernel: factor ``A^T`` when ``A`` is contiguous and real (else
    ``A``) and solve with ``adjoint`` accordingly.  The choice depends on A's layout, and
    the LU/pivots outputs are what solve's backward formula reuses, so it must be the same
    choice as CPU's (a value-only lowering cannot see the layout)."""
    use_a_t = A.is_contiguous() and not A.is_complex()
    lu, pivots, info = torch.linalg.lu_factor_ex(A.mT if use_a_t else A)
    vector = B.dim() == 1 or (A.dim() - 1 == B.dim() and B.shape == A.shape[:-1])
    bm = B.unsqueeze(-1) if vector else B
    x = torch.linalg.lu_solve(lu, pivots, bm, left=left, adjoint=use_a_t)
    if vector:
        x = x.squeeze(-1)
    if check_errors and bool((info != 0).any()):
        raise torch.linalg.LinAlgError("linalg.solve: The solver failed because the input "
                                       "matrix is singular.")
    return x, lu, pivots, info


# Structured ops (functional form = allocate + call .out) whose decomposition above must be
# reached as the functional op itself: give them their own PrivateUse1 kernel.
_DIRECT = torch.library.Library("aten", "IMPL")
_DIRECT.impl("_linalg_solve_ex", _linalg_solve_ex, "PrivateUse1")
# Autograd through the pieces (lu_factor_ex and lu_solve have exact backward formulas):
# PyTorch's own solve backward, fed our LU/pivots, gave wrong gradients (cause not found).
_DIRECT.impl("_linalg_solve_ex", _linalg_solve_ex, "AutogradPrivateUse1")


# ------------------------------------------------------------ as_strided_scatter


@decomp(aten.as_strided_scatter.default)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    """PyTorch's definition, storage-exact: a copy of ``self``'s whole storage viewed with
    ``self``'s sizes, strides and storage offset (``clone_preserve_strides``), with ``src``
    written through ``as_strided(size, stride, storage_offset)`` of that copy: the
    geometry addresses the storage, not ``self``'s elements, so a non-contiguous or offset
    ``self`` sees the write only where its view covers it.  A ``self`` with internal
    overlap is cloned plainly (as PyTorch does)."""
    size, stride = list(size), list(stride)
    if list(src.shape) != size:
        raise RuntimeError(
            f"expected src to have a size equal to the slice of self. src size = "
            f"{list(src.shape)}, slice size = {size}")
    if torch._debug_has_internal_overlap(self) == 1:
        out = self.clone()
    else:
        n = self.untyped_storage().nbytes() // self.element_size()
        full = self.as_strided((n,), (1,), 0).clone()
        out = full.as_strided(self.shape, self.stride(), self.storage_offset())
    out.as_strided(size, stride, storage_offset).copy_(src)
    return out
