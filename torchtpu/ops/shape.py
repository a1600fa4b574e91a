"""Shape lowerings: cat, padding, flip/roll/repeat, the ``*_scatter`` ops, tril/triu,
pairwise distances, im2col/col2im and FFTs.

Pure view ops (view, permute, select, slice, diagonal, as_strided...) never come here:
the executor re-dispatches them to PyTorch's CPU view kernel (metadata only).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from torchtpu.ops import aten, lower
from torchtpu.ops._util import cast, jnp, lax, npdt, opmath, promote, tdtype


def _nd(ndim: int, dim: int) -> int:
    return dim + max(ndim, 1) if dim < 0 else dim


# ------------------------------------------------------------------ cat / pad


@lower(aten.cat.default)
def cat(tensors, dim=0):
    """Concatenate in the promoted dtype; 1-D empty tensors are skipped (legacy rule)."""
    dt = promote(*tensors)
    keep = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not keep:
        return jnp().zeros((0,), npdt(dt))
    d = _nd(keep[0].ndim, dim)
    return jnp().concatenate([cast(t, dt) for t in keep], axis=d)


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    """``pad`` pairs start at the last dim; negative entries crop (``lax.pad`` allows)."""
    j = jnp()
    n = len(pad) // 2
    cfg = [(0, 0, 0)] * x.ndim
    for i in range(n):
        d = x.ndim - 1 - i
        cfg[d] = (pad[2 * i], pad[2 * i + 1], 0)
    v = cast(value, tdtype(x))
    if any(s == 0 for s in x.shape) or any(
        x.shape[d] + lo + hi <= 0 for d, (lo, hi, _) in enumerate(cfg)
    ):
        shape = tuple(max(0, x.shape[d] + lo + hi) for d, (lo, hi, _) in enumerate(cfg))
        if math.prod(shape) == 0:
            return j.zeros(shape, x.dtype)
        # an empty input padded to a non-empty shape: all fill value
        return j.full(shape, v, x.dtype)
    return lax().pad(x, j.asarray(v, x.dtype), cfg)


def _pad_mode(x, padding, nd, mode, name):
    """reflection/replication pad of the last ``nd`` dims; negative pads crop."""
    j = jnp()
    if x.ndim not in (nd + 1, nd + 2):
        raise NotImplementedError(f"torchtpu: {name} expects a {nd + 1}D or {nd + 2}D input")
    cfg = [(0, 0)] * x.ndim
    crop = [(0, 0)] * x.ndim
    for i in range(nd):
        d = x.ndim - 1 - i
        lo, hi = padding[2 * i], padding[2 * i + 1]
        cfg[d] = (max(lo, 0), max(hi, 0))
        crop[d] = (max(-lo, 0), max(-hi, 0))
    y = j.pad(x, cfg, mode=mode)
    if any(c != (0, 0) for c in crop):
        y = y[tuple(slice(a, y.shape[d] - b) for d, (a, b) in enumerate(crop))]
    return y


def _pad_meta(op):
    """The output geometry of a 2-d/3-d reflection/replication pad: PyTorch's meta kernel,
    in the input's memory format where a 4-D (5-D) input suggests channels_last
    (channels_last_3d), as CPU's kernels lay it out (an unbatched 3-d pad of a 4-D
    channels_last input too); the meta kernel gives a contiguous output."""

    def meta(x, padding):
        from torch._prims_common import suggest_memory_format

        out = op(x, padding)
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
        if fmt is not None and suggest_memory_format(x) == fmt:
            return torch.empty(out.shape, dtype=out.dtype, device="meta", memory_format=fmt)
        return out

    return meta


def _reg_pad(op, nd, mode, name):
    @lower(op, meta=_pad_meta(op) if nd > 1 else None)
    def pad(x, padding):
        return _pad_mode(x, padding, nd, mode, name)

    return pad


_reg_pad(aten.reflection_pad1d.default, 1, "reflect", "reflection_pad1d")
_reg_pad(aten.reflection_pad2d.default, 2, "reflect", "reflection_pad2d")
_reg_pad(aten.reflection_pad3d.default, 3, "reflect", "reflection_pad3d")
_reg_pad(aten.replication_pad1d.default, 1, "edge", "replication_pad1d")
_reg_pad(aten.replication_pad2d.default, 2, "edge", "replication_pad2d")
_reg_pad(aten.replication_pad3d.default, 3, "edge", "replication_pad3d")


# ------------------------------------------------------------------ flip / roll / repeat


@lower(aten.flip.default)
def flip(x, dims):
    if x.ndim == 0 or not dims:
        return x
    return jnp().flip(x, tuple(_nd(x.ndim, d) for d in dims))


@lower(aten.roll.default)
def roll(x, shifts, dims=()):
    j = jnp()
    if x.size == 0:
        return x
    if not dims:
        return j.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return j.roll(x, tuple(shifts), tuple(_nd(x.ndim, d) for d in dims))


@lower(aten.repeat.default)
def repeat(x, repeats):
    j = jnp()
    lead = len(repeats) - x.ndim
    x = x.reshape((1,) * lead + tuple(x.shape))
    out = tuple(s * r for s, r in zip(x.shape, repeats))
    if math.prod(out) == 0:
        return j.zeros(out, x.dtype)
    return j.tile(x, tuple(repeats))


# ------------------------------------------------------------------ scatters


@lower(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    d = _nd(x.ndim, dim)
    i = index + x.shape[d] if index < 0 else index
    return x.at[(slice(None),) * d + (i,)].set(cast(src, tdtype(x)))


def _slice_bounds(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, step


@lower(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    d = _nd(x.ndim, dim)
    s, e, st = _slice_bounds(x.shape[d], start, end, step)
    if src.size == 0:
        return x
    return x.at[(slice(None),) * d + (slice(s, e, st),)].set(cast(src, tdtype(x)))


@lower(aten.slice_backward.default)
def slice_backward(g, input_sizes, dim, start, end, step):
    """The gradient of ``x[..., start:end:step, ...]``: zeros of ``input_sizes`` with
    ``g`` in the slice (PyTorch's composite: ``zeros`` + ``copy_`` into the slice)."""
    sizes = tuple(input_sizes)
    d = _nd(len(sizes), dim)
    s, e, st = _slice_bounds(sizes[d], start, end, step)
    out = jnp().zeros(sizes, g.dtype)
    if g.size == 0:
        return out
    return out.at[(slice(None),) * d + (slice(s, e, st),)].set(g)


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    j = jnp()
    d1, d2 = _nd(x.ndim, dim1), _nd(x.ndim, dim2)
    xt = j.moveaxis(x, (d1, d2), (-2, -1))
    n1, n2 = xt.shape[-2], xt.shape[-1]
    if offset >= 0:
        length = max(0, min(n1, n2 - offset))
    else:
        length = max(0, min(n1 + offset, n2))
    if length == 0:
        return x
    rows = np.arange(length) + max(-offset, 0)
    cols = np.arange(length) + max(offset, 0)
    xt = xt.at[..., rows, cols].set(cast(src, tdtype(x)))
    return j.moveaxis(xt, (-2, -1), (d1, d2))


# as_strided_scatter is a decomposition (ops/decomp_overrides.py): its ``size``/``stride``/
# ``storage_offset`` address the whole storage of ``self``, which a lowering never sees.


# ------------------------------------------------------------------ tril / triu


def _tri_mask(x, diagonal, lower_: bool):
    r, c = x.shape[-2], x.shape[-1]
    i = lax().broadcasted_iota(np.int64, (r, c), 0)
    k = lax().broadcasted_iota(np.int64, (r, c), 1)
    return (k - i <= diagonal) if lower_ else (k - i >= diagonal)


@lower(aten.tril.default)
def tril(x, diagonal=0):
    return jnp().where(_tri_mask(x, diagonal, True), x, jnp().zeros((), x.dtype))


@lower(aten.triu.default)
def triu(x, diagonal=0):
    return jnp().where(_tri_mask(x, diagonal, False), x, jnp().zeros((), x.dtype))


# ------------------------------------------------------------------ distances


def _pnorm_last(d, p: float):
    """p-norm of ``d`` over its last axis (PyTorch's cdist/pdist rules for p)."""
    j = jnp()
    a = j.abs(d)
    if p == 0:
        return j.sum((a != 0).astype(a.dtype), axis=-1)
    if p == 1:
        return j.sum(a, axis=-1)
    if p == 2:
        return j.sqrt(j.sum(a * a, axis=-1))
    if p == math.inf:
        return j.max(a, axis=-1) if a.shape[-1] else j.zeros(a.shape[:-1], a.dtype)
    pv = j.asarray(p, a.dtype)
    return j.sum(a ** pv, axis=-1) ** (j.asarray(1.0, a.dtype) / pv)


def _euclidean_mm(x1, x2):
    """PyTorch's ``_euclidean_dist`` (the matmul form cdist uses for large inputs)."""
    j = jnp()
    hi = lax().Precision.HIGHEST
    n1 = j.sum(x1 * x1, axis=-1, keepdims=True)
    n2 = j.sum(x2 * x2, axis=-1, keepdims=True)
    o1, o2 = j.ones_like(n1), j.ones_like(n2)
    a = j.concatenate([x1 * j.asarray(-2, x1.dtype), n1, o1], axis=-1)
    b = j.concatenate([x2, o2, n2], axis=-1)
    r = j.matmul(a, j.swapaxes(b, -1, -2), precision=hi)
    return j.sqrt(j.maximum(r, j.zeros((), r.dtype)))


@lower(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    j = jnp()
    dt = tdtype(x1)
    ct = opmath(dt)
    a, b = cast(x1, ct), cast(x2, ct)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    r1, r2, m = a.shape[-2], b.shape[-2], a.shape[-1]
    a = j.broadcast_to(a, tuple(batch) + (r1, m))
    b = j.broadcast_to(b, tuple(batch) + (r2, m))
    mode = 0 if compute_mode is None else compute_mode
    if r1 == 0 or r2 == 0:
        return j.zeros(tuple(batch) + (r1, r2), a.dtype)
    if m == 0:
        return j.zeros(tuple(batch) + (r1, r2), a.dtype)
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))):
        return _euclidean_mm(a, b)
    d = a[..., :, None, :] - b[..., None, :, :]
    return _pnorm_last(d, float(p))


@lower(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, cdist):
    """Gradient of ``_cdist_forward`` w.r.t. ``x1`` (autograd gets ``x2``'s by swapping
    the operands), with CPU's per-p rules: 0 where the distance is 0 (p=2, general p,
    and p < 2, where also a zero difference gives 0 for p < 1), ``sign(diff)`` for p=1,
    the arg-max coordinates for p=inf, zeros for p=0."""
    j = jnp()
    ct = opmath(tdtype(x1))
    a, b, g, dist = cast(x1, ct), cast(x2, ct), cast(grad, ct), cast(cdist, ct)
    if a.size == 0 or b.size == 0 or g.size == 0:
        return j.zeros(a.shape, a.dtype)  # CPU: a zero tensor of x1's shape
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    r1, r2, m = a.shape[-2], b.shape[-2], a.shape[-1]
    a = j.broadcast_to(a, batch + (r1, m))
    b = j.broadcast_to(b, batch + (r2, m))
    p = float(p)
    diff = a[..., :, None, :] - b[..., None, :, :]
    gg, dd = g[..., None], dist[..., None]
    zero = j.zeros((), a.dtype)
    pv = j.asarray(p, a.dtype)
    if p == 0:
        res = j.zeros_like(diff)
    elif p == 1:
        res = gg * j.sign(diff)
    elif p == 2:
        res = j.where(dd == 0, zero, gg * diff / j.where(dd == 0, 1, dd))
    elif p == math.inf:
        res = gg * j.sign(diff) * (j.abs(diff) == dd).astype(a.dtype)
    elif p < 2:
        safe = j.where(dd == 0, 1, dd)
        res = j.abs(diff) ** (pv - 1) * j.sign(diff) * gg / safe ** (pv - 1)
        res = j.where((dd == 0) | ((diff == 0) & (p < 1)), zero, res)
    else:
        safe = j.where(dd == 0, 1, dd)
        res = j.where(dd == 0, zero, diff * j.abs(diff) ** (pv - 2) * gg / safe ** (pv - 1))
    return res.sum(axis=-2)


@lower(aten._pdist_forward.default)
def pdist_forward(x, p=2):
    j = jnp()
    ct = opmath(tdtype(x))
    a = cast(x, ct)
    n = a.shape[0]
    if n <= 1:
        return j.zeros((0,), a.dtype)
    i, k = np.triu_indices(n, 1)
    d = a[i] - a[k]
    return _pnorm_last(d, float(p))


@lower(aten._pdist_backward.default)
def pdist_backward(grad, x, p, pdist):
    """Gradient of ``_pdist_forward``: the pair distances scattered into an ``n x n``
    matrix (row ``i`` < column ``k``), then :func:`cdist_backward` (CPU's per-p rules)
    for each side of every pair."""
    j = jnp()
    ct = npdt(opmath(tdtype(x)))
    n = x.shape[0]
    if n <= 1 or grad.size == 0:
        return j.zeros(x.shape, ct)
    i, k = np.triu_indices(n, 1)
    g = j.zeros((n, n), ct).at[i, k].set(grad.astype(ct))
    d = j.zeros((n, n), ct).at[i, k].set(pdist.astype(ct))
    d = d + d.T
    return cdist_backward(g, x, x, p, d) + cdist_backward(g.T, x, x, p, d)


# ------------------------------------------------------------------ im2col / col2im


def _pair(v):
    return tuple(v) if len(v) == 2 else (v[0], v[0])


@lower(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    j = jnp()
    kh, kw = _pair(kernel_size)
    dh, dw = _pair(dilation)
    ph, pw = _pair(padding)
    sh, sw = _pair(stride)
    batched = x.ndim == 4
    if not batched:
        x = x[None]
    n, c, h, w = x.shape
    oh = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    ow = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    xp = j.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = []
    for a in range(kh):
        for b in range(kw):
            r0, c0 = a * dh, b * dw
            cols.append(xp[:, :, r0: r0 + sh * (oh - 1) + 1: sh, c0: c0 + sw * (ow - 1) + 1: sw])
    out = j.stack(cols, axis=2)  # n, c, kh*kw, oh, ow
    out = out.reshape(n, c * kh * kw, oh * ow)
    return out if batched else out[0]


@lower(aten.col2im.default)
def col2im(x, output_size, kernel_size, dilation, padding, stride):
    j = jnp()
    kh, kw = _pair(kernel_size)
    dh, dw = _pair(dilation)
    ph, pw = _pair(padding)
    sh, sw = _pair(stride)
    h, w = _pair(output_size)
    batched = x.ndim == 3
    if not batched:
        x = x[None]
    n = x.shape[0]
    c = x.shape[1] // (kh * kw)
    oh = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    ow = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    ct = opmath(tdtype(x))
    cols = cast(x, ct).reshape(n, c, kh, kw, oh, ow)
    out = j.zeros((n, c, h + 2 * ph, w + 2 * pw), cols.dtype)
    for a in range(kh):
        for b in range(kw):
            r0, c0 = a * dh, b * dw
            out = out.at[:, :, r0: r0 + sh * (oh - 1) + 1: sh,
                         c0: c0 + sw * (ow - 1) + 1: sw].add(cols[:, :, a, b])
    out = out[:, :, ph: ph + h, pw: pw + w]
    return out if batched else out[0]


# ------------------------------------------------------------------ FFT


def _fft_scale(y, n: int, normalization: int):
    j = jnp()
    if normalization == 0 or n == 0:
        return y
    rdt = j.real(y).dtype if j.iscomplexobj(y) else y.dtype
    s = 1.0 / math.sqrt(n) if normalization == 1 else 1.0 / n
    return y * j.asarray(s, rdt)


def _ndims(x, dim):
    return [_nd(x.ndim, d) for d in dim]


@lower(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    j = jnp()
    dims = _ndims(x, dim)
    y = x
    for d in dims:
        if y.shape[d] == 0:
            return y
        y = j.fft.fft(y, axis=d, norm="backward") if forward else j.fft.ifft(
            y, axis=d, norm="forward")
    return _fft_scale(y, math.prod(x.shape[d] for d in dims), normalization)


@lower(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    j = jnp()
    dims = _ndims(x, dim)
    if x.size == 0:
        raise NotImplementedError("torchtpu: _fft_r2c of an empty tensor")
    last = dims[-1]
    y = j.fft.rfft(x, axis=last, norm="backward") if onesided else j.fft.fft(
        x, axis=last, norm="backward")
    for d in dims[:-1]:
        y = j.fft.fft(y, axis=d, norm="backward")
    return _fft_scale(y, math.prod(x.shape[d] for d in dims), normalization)


@lower(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    j = jnp()
    dims = _ndims(x, dim)
    if x.size == 0:
        raise NotImplementedError("torchtpu: _fft_c2r of an empty tensor")
    y = x
    for d in dims[:-1]:
        y = j.fft.ifft(y, axis=d, norm="forward")
    last = dims[-1]
    y = j.fft.irfft(y, n=last_dim_size, axis=last, norm="forward")
    n = math.prod(x.shape[d] for d in dims[:-1]) * last_dim_size
    return _fft_scale(y, n, normalization)
