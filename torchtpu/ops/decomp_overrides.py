"""Decompositions of our own for ops PyTorch's ``torch._decomp`` does not cover
(or covers in a way that is wrong for XLA).  Keyed by ATen overload, like
``torch._decomp.decomposition_table``; consulted after the lowering table."""

from __future__ import annotations

import functools
import math

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
    """Our own decompositions only (see :func:`decompositions` for the full set)."""
    return _TABLE


_ALL = None


def decompositions() -> dict:
    """Every decomposition torchtpu uses, ``{OpOverload: fn}``: PyTorch's
    ``torch._decomp.decomposition_table`` proper (its ``torch._refs`` entries lower to
    prims, which would dispatch straight back to the op they implement) updated with
    ours.  The eager executor consults it after the lowering table; torch.compile hands
    the entries the lowering table lacks to AOTAutograd.  Computed once."""
    global _ALL
    if _ALL is None:
        from torch._decomp import decomposition_table

        d = {
            op: fn
            for op, fn in decomposition_table.items()
            if not getattr(fn, "__module__", "").startswith("torch._refs")
        }
        d.update(_TABLE)
        _ALL = d
    return _ALL


@decomp(aten.equal.default)
def equal(a, b):
    """``torch.equal``: same shape and every element equal (NaN != NaN), a Python bool
    (a sync point)."""
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.eq(a, b).all().item())


ASSERT_ASYNC_MESSAGE = "Expected Tensor with single nonzero value, but got zero"


def ambiguous_bool(numel: int) -> str:
    """PyTorch's error for the truth value of a tensor of ``numel != 1`` elements."""
    return ("Boolean value of Tensor with "
            f"{'no values' if numel == 0 else 'more than one value'} is ambiguous")


def _assert_nonzero(t, message: str) -> None:
    if t.numel() != 1:
        raise RuntimeError(ambiguous_bool(t.numel()))
    if not bool(t.reshape(()).item()):
        raise RuntimeError(message)


@decomp(aten._assert_async.default)
def _assert_async(self):
    """``torch._assert_async(t)``: raise PyTorch's error unless the one-element ``t`` is
    nonzero.  In eager mode it is checked at once (a sync point, as on CPU; CUDA checks
    it on the device).  Compiled graphs keep it whole and check it on the device
    (``compile.graph``): it raises at the next sync point."""
    _assert_nonzero(self, ASSERT_ASYNC_MESSAGE)


@decomp(aten._assert_async.msg)
def _assert_async_msg(self, assert_msg):
    """``torch._assert_async(t, msg)``: as :func:`_assert_async`, raising ``msg``."""
    _assert_nonzero(self, assert_msg)


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


def _coef_dtype(p):
    """dtype of a fused optimizer's per-step coefficients (bias corrections, decayed lr):
    float64 for float64 parameters, else float32."""
    return torch.float64 if p.dtype == torch.float64 else torch.float32


def _fused_adam_impl(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr,
                     beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale,
                     found_inf, decoupled):
    for i, p in enumerate(params):
        g = grads[i]
        if grad_scale is not None:
            g = _unscale_in_place(grads[i], p, grad_scale, found_inf)
        if maximize:
            g = -g
        # the bias corrections in float64 for float64 parameters (CPU computes them in
        # double; in float32 they would round float64 results to float32 precision)
        step = state_steps[i].to(p.device, _coef_dtype(p))
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


def _unscaled(g, p, grad_scale, found_inf, maximize, weight_decay):
    """A fused optimizer's effective gradient: unscaled (AMP; written back to ``g`` as
    CPU's fused kernels do, see :func:`_unscale_in_place`), negated (``maximize``), plus
    ``weight_decay * p``."""
    if grad_scale is not None:
        g = _unscale_in_place(g, p, grad_scale, found_inf)
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    return g


def _unscale_in_place(g, p, grad_scale, found_inf):
    """``g / grad_scale``, also written back to ``g`` (CPU's fused Adam/AdamW/SGD/Adagrad
    kernels leave the gradients unscaled; not where ``found_inf`` is set, where they
    change nothing)."""
    u = g / grad_scale.to(p.device)
    g.copy_(_skip_where(found_inf, p, g, u))
    return u


def _skip_where(found_inf, p, old, new):
    """``new``, or ``old`` where AMP found an inf/NaN gradient (``found_inf`` != 0)."""
    if found_inf is None:
        return new
    return torch.where(found_inf.to(p.device) != 0, old, new)


@decomp(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr)
def _fused_sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening,
               nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
    """SGD(fused=True): per parameter, ``buf = g`` on the first step else
    ``momentum * buf + (1 - dampening) * g`` (when ``momentum`` != 0), the step along
    ``g + momentum * buf`` (``nesterov``) or ``buf``, times ``lr``; as SGD's for-loop
    implementation.  ``momentum_buffer_list`` is empty when ``momentum`` is 0."""
    if isinstance(lr, torch.Tensor):
        lr = lr.item()
    for i, p in enumerate(params):
        g = _unscaled(grads[i], p, grad_scale, found_inf, maximize, weight_decay)
        if momentum != 0:
            buf = momentum_buffer_list[i]
            new_buf = g if is_first_step else buf * momentum + g * (1 - dampening)
            g = g + momentum * new_buf if nesterov else new_buf
            buf.copy_(_skip_where(found_inf, p, buf, new_buf))
        p.copy_(_skip_where(found_inf, p, p, p - lr * g))


@decomp(aten._fused_adagrad_.default, aten._fused_adagrad_.tensor_lr)
def _fused_adagrad(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
                   maximize, grad_scale=None, found_inf=None):
    """Adagrad(fused=True): per parameter (its step count already incremented by the
    optimizer), ``sum += g * g``, ``p -= lr / (1 + (step - 1) * lr_decay) * g /
    (sqrt(sum) + eps)``; as Adagrad's for-loop implementation."""
    if isinstance(lr, torch.Tensor):
        lr = lr.item()
    for i, p in enumerate(params):
        g = _unscaled(grads[i], p, grad_scale, found_inf, maximize, weight_decay)
        step = state_steps[i].to(p.device, _coef_dtype(p))
        clr = lr / (1 + (step - 1) * lr_decay)
        s = state_sums[i].addcmul(g, g)
        new_p = p - clr * (g / (s.sqrt() + eps))
        state_sums[i].copy_(_skip_where(found_inf, p, state_sums[i], s))
        p.copy_(_skip_where(found_inf, p, p, new_p))


# ------------------------------------------------------------------ embedding bag
# nn.EmbeddingBag / F.embedding_bag (mode 0 sum, 1 mean, 2 max), written with lowered ops.


def _bags(offsets, n, include_last_offset):
    starts = offsets[:-1] if include_last_offset else offsets
    pos = torch.arange(n, device=offsets.device)
    return starts.numel(), torch.searchsorted(starts, pos, right=True) - 1


def _cpu_fast_path(weight, per_sample_weights, padding_idx) -> bool:
    """Whether CPU's sum/mean EmbeddingBag takes its FBGEMM fast path (float32/half types,
    no padding_idx, unit inner strides), whose results differ from the generic path's in
    two ways that are visible: see :func:`_round_bag_sums` and the trailing indices in
    :func:`_embedding_bag`."""
    return (weight.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and (padding_idx is None or padding_idx < 0) and weight.stride(1) == 1
            and (per_sample_weights is None or per_sample_weights.stride(0) == 1))


def _round_bag_sums(out, weight, per_sample_weights, padding_idx):
    """float32 bag sums of a half-type ``weight`` rounded to its dtype as CPU does: its
    FBGEMM fast path converts float32 to bfloat16 rounding halfway cases away from zero
    (add 0x8000, truncate); the other paths, and float16, round to nearest even."""
    if weight.dtype != torch.bfloat16 or not _cpu_fast_path(weight, per_sample_weights,
                                                            padding_idx):
        return out.to(weight.dtype)
    bits = (out.contiguous().view(torch.int32) + 0x8000) & ~0xFFFF
    return bits.view(torch.float32).to(torch.bfloat16)


@decomp(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    n, d = indices.numel(), weight.shape[1]
    b, offset2bag = _bags(offsets, n, include_last_offset)
    keep = indices != padding_idx if padding_idx >= 0 else torch.ones_like(indices, dtype=torch.bool)
    rows = weight.index_select(0, indices)
    # sum/mean of half types: CPU accumulates (and weighs) in float32 and rounds once
    # (see _round_bag_sums), then divides by the bag size in the half type
    acc = torch.float32 if mode != 2 and weight.dtype in (torch.bfloat16, torch.float16) \
        else weight.dtype
    rows = rows.to(acc)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(acc).unsqueeze(1)
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
        fast = _cpu_fast_path(weight, per_sample_weights, padding_idx)
        add = keep
        if include_last_offset and fast and n:
            # indices past offsets[-1] (outside the documented contract): CPU's fast path
            # stops there, its generic path adds them to the last bag; bag_size counts
            # them either way (so a mean divides by it)
            add = keep & (torch.arange(n, device=offsets.device) < offsets[-1:])
        rows = rows * add.unsqueeze(1).to(rows.dtype)
        out = torch.zeros(b, d, dtype=acc, device=weight.device).index_add(
            0, offset2bag, rows)
        if mode == 0 and fast:
            # as CPU: the fast sum path computes no offset2bag; the backward rebuilds it
            # from the offsets (_embedding_bag_backward)
            offset2bag = offset2bag.new_empty(0)
        if acc != weight.dtype:
            out = _round_bag_sums(out, weight, per_sample_weights, padding_idx)
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
    if offset2bag.numel() == 0 and indices.numel() != 0:
        # the forward's fast sum path returned none (as CPU's): rebuild it; indices past
        # the last offset (include_last_offset) get no gradient, as that path added them
        # to no bag
        b, n = grad.shape[0], indices.numel()
        last = offsets.numel() == b + 1
        _, offset2bag = _bags(offsets, n, last)
        if last:
            past = torch.arange(n, device=offsets.device) >= offsets[-1:]
            offset2bag = torch.where(past, torch.full_like(offset2bag, b), offset2bag)
            grad = torch.cat([grad, grad.new_zeros(1, grad.shape[1])])
            g = _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size,
                                              maximum_indices, num_weights,
                                              scale_grad_by_freq, mode, per_sample_weights,
                                              padding_idx)
            return g
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
    if check_errors:  # CPU's kernel checks under this API name (batch element and all)
        aten._linalg_check_errors(info, "torch.linalg.solve_ex", is_matrix=A.dim() == 2)
    return x, lu, pivots, info


# Structured ops (functional form = allocate + call .out) whose decomposition above must be
# reached as the functional op itself: give them their own PrivateUse1 kernel.
_DIRECT = torch.library.Library("aten", "IMPL")
_DIRECT.impl("_linalg_solve_ex", _linalg_solve_ex, "PrivateUse1")
# Autograd through the pieces (lu_factor_ex and lu_solve have exact backward formulas):
# PyTorch's own solve backward, fed our LU/pivots, gave wrong gradients (cause not found).
_DIRECT.impl("_linalg_solve_ex", _linalg_solve_ex, "AutogradPrivateUse1")


if hasattr(aten, "cholesky"):  # torch.cholesky (deprecated) is gone from torch 2.14's ATen
    @decomp(aten.cholesky.default)
    def cholesky(self, upper=False):
        """``torch.cholesky`` (deprecated): ``linalg_cholesky_ex`` then PyTorch's own check
        of its ``info`` under the name "cholesky" (a sync point), as CPU raises it."""
        L, info = aten.linalg_cholesky_ex(self, upper=upper)
        aten._linalg_check_errors(info, "cholesky", is_matrix=self.dim() == 2)
        return L


# ------------------------------------------------------------ as_strided_scatter


def check_scatter_src(src, size) -> None:
    """``as_strided_scatter``'s check that ``src`` has the target geometry's sizes (CPU's
    message); also used by its graph form (``compile.composites``)."""
    if list(src.shape) != list(size):
        raise RuntimeError(
            f"expected src to have a size equal to the slice of self. src size = "
            f"{list(src.shape)}, slice size = {list(size)}")


@decomp(aten.as_strided_scatter.default)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    """PyTorch's definition, storage-exact: a copy of ``self``'s whole storage viewed with
    ``self``'s sizes, strides and storage offset (``clone_preserve_strides``), with ``src``
    written through ``as_strided(size, stride, storage_offset)`` of that copy: the
    geometry addresses the storage, not ``self``'s elements, so a non-contiguous or offset
    ``self`` sees the write only where its view covers it.  A ``self`` with internal
    overlap is cloned plainly (as PyTorch does)."""
    size, stride = list(size), list(stride)
    check_scatter_src(src, size)
    if torch._debug_has_internal_overlap(self) == 1:
        out = self.clone()
    else:
        n = self.untyped_storage().nbytes() // self.element_size()
        full = self.as_strided((n,), (1,), 0).clone()
        out = full.as_strided(self.shape, self.stride(), self.storage_offset())
    out.as_strided(size, stride, storage_offset).copy_(src)
    return out


# ------------------------------------------------------------ in-place shifts


@decomp(aten.__ilshift__.Tensor, aten.__ilshift__.Scalar)
def __ilshift__(self, other):
    """``a <<= b``: CPU's kernel is ``bitwise_left_shift_``'s (one TensorIterator writing
    ``a``): "result type Long can't be cast to the desired output type Bool" for a Bool
    ``a`` shifted by an integer.  PyTorch's decomposition (``a.copy_(a << b)``) casts the
    result into ``a`` instead."""
    return self.bitwise_left_shift_(other)


@decomp(aten.__irshift__.Tensor, aten.__irshift__.Scalar)
def __irshift__(self, other):
    """``a >>= b``: as :func:`__ilshift__`."""
    return self.bitwise_right_shift_(other)


# ------------------------------------------------------------ isin


def _isin_brute_force_view_check(elements, test_elements) -> None:
    """CPU's ``isin`` with few test elements (fewer than ``int(10 * n ** 0.145)`` for
    ``n`` elements, NumPy's heuristic; none when ``n == 0``) runs its brute-force kernel,
    which reads ``test_elements.to(common_dtype).view(-1)``: a ``test_elements`` already
    of the common dtype that no 1-d view covers (``t[:, :2]``, ``t.t()``) raises "view
    size is not compatible with input tensor's size and stride".  (The sorting kernel
    and PyTorch's decomposition take any strides.)  Eager only: a compiled graph (fake
    tensors) computes the value, as Inductor's CPU code does."""
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(test_elements):
        return
    n = elements.numel() if isinstance(elements, torch.Tensor) else 1
    m = test_elements.numel()
    if n == 0 or m >= int(10.0 * math.pow(n, 0.145)):
        return
    t = torch.empty_strided(test_elements.shape, test_elements.stride(),
                            dtype=test_elements.dtype, device="meta")
    common = torch.result_type(elements, test_elements)
    if common != test_elements.dtype:
        # CPU's .to() copies it: with the same strides where they are dense (a
        # transpose), contiguous otherwise
        t = torch.empty_like(t, dtype=common)
    t.view(-1)


def _isin_as_cpu(op):
    from torch._decomp import decomposition_table

    torch_decomp = decomposition_table[op]

    @functools.wraps(torch_decomp)  # (its signature: the out= adaptation reads it)
    def isin(elements, test_elements, *args, **kwargs):
        _isin_brute_force_view_check(elements, test_elements)
        return torch_decomp(elements, test_elements, *args, **kwargs)

    _TABLE[op] = isin


for _op in (aten.isin.Tensor_Tensor, aten.isin.Tensor_Tensor_out, aten.isin.Scalar_Tensor,
            aten.isin.Scalar_Tensor_out):
    _isin_as_cpu(_op)


# ------------------------------------------------------------ grid_sampler_2d, half types


@decomp(aten.grid_sampler_2d.default)
def grid_sampler_2d(input, grid, interpolation_mode=0, padding_mode=0, align_corners=False):
    """float32/float64: PyTorch's decomposition.  bfloat16/float16: CPU's vectorized
    kernel step by step in the tensor's dtype (each operation rounds, as its
    ``Vectorized<Half/BFloat16>`` arithmetic does); computing in float32 and rounding once
    differs from CPU by up to 0.16 on unit-scale inputs."""
    from torch._decomp import decomposition_table

    if input.dtype not in (torch.bfloat16, torch.float16) or input.dim() != 4 \
            or grid.dtype != input.dtype:
        return decomposition_table[aten.grid_sampler_2d.default](
            input, grid, interpolation_mode, padding_mode, align_corners)
    if interpolation_mode not in (0, 1, 2) or padding_mode not in (0, 1, 2):
        return NotImplemented
    N, C, H, W = input.shape
    dt, dev = input.dtype, input.device
    if N == 0 or C == 0 or grid.shape[1] * grid.shape[2] == 0:
        return input.new_zeros(N, C, grid.shape[1], grid.shape[2])

    def cst(v):
        return torch.tensor(v, dtype=dt, device=dev)

    class Loc:
        """CPU's ComputeLocation<scalar_t, padding, align_corners> for one dim."""

        def __init__(self, size):
            self.max_val = cst(float(size - 1))
            if align_corners:
                self.scale = cst(float(size - 1)) / 2
                self.low = cst(0.0)
                self.twice_span = cst(float(size - 1)) * 2
                self.empty = size <= 1
            else:
                self.scale = cst(float(size)) / 2
                self.low = cst(-0.5)
                self.twice_span = cst(float(size)) * 2
                self.empty = size <= 0

        def unnormalize(self, g):
            if align_corners:
                return (g + 1) * self.scale
            return (g + 1) * self.scale - 0.5

        def clip(self, x):
            x = torch.where(torch.isnan(x), torch.zeros_like(x), x)  # NaN clamps to 0
            return torch.minimum(torch.maximum(x, cst(0.0)), self.max_val)

        def reflect(self, x):
            if self.empty:
                return torch.zeros_like(x)
            a = (x - self.low).abs() if not align_corners else x.abs()
            flips = (a / self.twice_span).trunc()
            extra = a - flips * self.twice_span
            r = torch.minimum(extra, self.twice_span - extra)
            return r if align_corners else r + self.low

        def coords(self, x):  # compute_coordinates: padding of a location
            if padding_mode == 1:
                return self.clip(x)
            if padding_mode == 2:
                return self.clip(self.reflect(x))
            return x

        def apply(self, g):
            return self.coords(self.unnormalize(g))

    lw, lh = Loc(W), Loc(H)
    gx, gy = grid[..., 0], grid[..., 1]  # (N, oH, oW)
    flat = input.reshape(N, C, H * W)

    def gather(ix, iy):
        """input at integer-valued locations (float tensors) with zeros outside; CPU
        converts them by truncation."""
        ixl = ix.trunc()
        iyl = iy.trunc()
        ok = (ixl > -1) & (ixl < W) & (iyl > -1) & (iyl < H)
        lin = (iyl.clamp(0, H - 1).long() * W + ixl.clamp(0, W - 1).long())
        lin = torch.where(ok, lin, torch.zeros_like(lin)).reshape(N, 1, -1).expand(N, C, -1)
        v = flat.gather(2, lin).reshape(N, C, *ix.shape[1:])
        return torch.where(ok.unsqueeze(1), v, torch.zeros_like(v))

    if interpolation_mode == 0:  # bilinear
        x, y = lw.apply(gx), lh.apply(gy)
        x_w, y_n = x.floor(), y.floor()
        w = x - x_w
        e = 1 - w
        n = y - y_n
        s = 1 - n
        nw, ne, sw, se = s * e, s * w, n * e, n * w
        x_e, y_s = x_w + 1, y_n + 1
        out = gather(x_w, y_n) * nw.unsqueeze(1)
        out = out + gather(x_e, y_n) * ne.unsqueeze(1)
        out = out + gather(x_w, y_s) * sw.unsqueeze(1)
        out = out + gather(x_e, y_s) * se.unsqueeze(1)
        return out
    if interpolation_mode == 1:  # nearest (round half to even)
        return gather(lw.apply(gx).round(), lh.apply(gy).round())
    # bicubic: unnormalized locations, padding applied to each tap's integer location
    a_ = cst(-0.75)
    x, y = lw.unnormalize(gx), lh.unnormalize(gy)
    ix, iy = x.floor(), y.floor()

    def coeffs(t):
        def outer(z):
            return ((a_ * z - 5 * a_) * z + 8 * a_) * z - 4 * a_

        def inner(z):
            return ((a_ + 2) * z - (a_ + 3)) * z * z + 1

        return [outer(t + 1), inner(t), inner(1 - t), outer(2 - t)]

    cx, cy = coeffs(x - ix), coeffs(y - iy)

    def tap(dx, dy):
        return gather(lw.coords(ix + dx), lh.coords(iy + dy))

    rows = []
    for i in range(4):
        r = cx[0].unsqueeze(1) * tap(-1, -1 + i)
        r = r + cx[1].unsqueeze(1) * tap(0, -1 + i)
        r = r + cx[2].unsqueeze(1) * tap(1, -1 + i)
        r = r + cx[3].unsqueeze(1) * tap(2, -1 + i)
        rows.append(r)
    out = cy[0].unsqueeze(1) * rows[0]
    for i in range(1, 4):
        out = out + cy[i].unsqueeze(1) * rows[i]
    return out
