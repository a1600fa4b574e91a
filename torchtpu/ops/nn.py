"""nn lowerings: convolution, pooling, normalization, softmax, activations, losses,
embedding backward, upsampling.

Conventions (see ``docs/ARCHITECTURE.md``):

* float16/bfloat16 inputs compute in float32 (PyTorch's opmath) and round once.
* Convolutions and the matrix products inside use ``precision=HIGHEST`` (full float32;
  see ``ops/linalg.py``).
* Backward ops whose ``output_mask`` can leave outputs undefined (``convolution_backward``,
  ``native_layer_norm_backward``, ``native_group_norm_backward``,
  ``native_batch_norm_backward``): the executor cannot return ``None`` outputs, so each
  goes through a decomposition (``ops.decomp_overrides``) calling a private op
  ``torchtpu_nn::<name>`` that returns an empty tensor for each masked output; the
  decomposition turns those into ``None``.
* Batch norm with running statistics: ``native_batch_norm`` / ``_native_batch_norm_legit``
  mutate ``running_mean``/``running_var`` (``native_batch_norm``'s schema does not even
  say so), which a lowering cannot express; they decompose into the lowered functional
  ``_native_batch_norm_legit_functional`` plus ``copy_`` into the running buffers.
* Index-dependent losses (``nll_loss``): an out-of-range class index is a device-side
  check (``ops._checks``: IndexError at the next sync point, as CUDA's assert); the
  loss also becomes NaN, never a wrong value.  ``binary_cross_entropy`` checks its input
  range the same way.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from torchtpu.ops import Lowering, LOWERINGS, _checks, aten, lower
from torchtpu.ops._scalar import clamp_integer_bounds, fits, scalar_check
from torchtpu.ops._util import (cast, float_compute, ieee_div, jnp, lax, npdt, opmath, round_to,
                                scalar_type_name, tdtype, to_float_compute)
from torchtpu.ops.decomp_overrides import decomp
from torchtpu.ops._util import matmul_precision
from torchtpu.ops.linalg import highest


def _jax():
    from torchtpu._device import runtime

    return runtime.jax()


_ct = float_compute
_f = to_float_compute


def _tup(v, n):
    v = list(v)
    if len(v) == 1:
        v = v * n
    return tuple(int(i) for i in v)


# ============================================================ masked-output machinery

_LIB = torch.library.Library("torchtpu_nn", "DEF")
_PRIVATE: dict = {}
_ATEN_IMPL = torch.library.Library("aten", "IMPL")


def _masked_op(aten_op, fn, mask_arg="output_mask", precision=False):
    """Lower ``aten_op`` (outputs may be undefined per ``output_mask``) through a private
    op that returns an empty tensor for each masked output (see the module docstring)."""
    base = aten_op._schema.name.split("::")[1]
    name = base if aten_op._overloadname == "default" else f"{base}_{aten_op._overloadname}"
    sch = str(aten_op._schema)
    _LIB.define(name + sch[sch.index("("):])
    pkt = getattr(torch.ops.torchtpu_nn, name)
    priv = pkt.default

    names = [a.name for a in aten_op._schema.arguments]
    mi = names.index(mask_arg)

    def meta(*args, **kwargs):
        # Some of PyTorch's meta kernels compute every output whatever output_mask says
        # (native_batch_norm_backward); the mask decides, as the lowering does.
        res = aten_op(*args, **kwargs)
        mask = args[mi] if mi < len(args) else kwargs[mask_arg]
        return tuple(
            torch.empty(0, device="meta") if r is None or not m else torch.empty_like(r)
            for r, m in zip(res, mask)
        )

    _LIB.impl(name, meta, "Meta")

    LOWERINGS[priv] = Lowering(fn, precision=precision)

    def decomposition(*args, **kwargs):
        mask = args[mi] if mi < len(args) else kwargs[mask_arg]
        res = priv(*args, **kwargs)
        return tuple(r if m else None for r, m in zip(res, mask))

    decomp(aten_op)(decomposition)
    # Some of these ops have a CompositeExplicitAutograd kernel (convolution_backward) or
    # one that raises (convolution_backward_overrideable), so the fallback never sees
    # them: give them their own PrivateUse1 kernel running the decomposition.
    opname = aten_op._schema.name.split("::")[1]
    if aten_op._overloadname != "default":
        opname += "." + aten_op._overloadname
    _ATEN_IMPL.impl(opname, decomposition, "PrivateUse1")
    _PRIVATE[aten_op] = priv
    return fn


def _empty():
    return jnp().zeros((0,), jnp().float32)


# ============================================================ convolution

_SPATIAL = {1: "H", 2: "HW", 3: "DHW"}


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups, prec=None):
    """Convolution of x (N, C, *sp) with w, no bias, result in the compute dtype; ``prec``:
    the XLA precision (``matmul_precision`` of the inputs' dtype; HIGHEST if None)."""
    if prec is None:
        prec = highest()
    nd = x.ndim - 2
    s = _tup(stride, nd)
    p = _tup(padding, nd)
    d = _tup(dilation, nd)
    sp = _SPATIAL[nd]
    dn = lax().conv_dimension_numbers(x.shape, w.shape, ("NC" + sp, "OI" + sp, "NC" + sp))
    if not transposed:
        return lax().conv_general_dilated(
            x, w, window_strides=s, padding=[(pi, pi) for pi in p], rhs_dilation=d,
            feature_group_count=groups, dimension_numbers=dn, precision=prec)
    op = _tup(output_padding, nd)
    cin, coutg = w.shape[0], w.shape[1]
    k = w.shape[2:]
    w2 = w.reshape((groups, cin // groups, coutg) + tuple(k))
    w2 = jnp().swapaxes(w2, 1, 2).reshape((groups * coutg, cin // groups) + tuple(k))
    w2 = jnp().flip(w2, axis=tuple(range(2, 2 + nd)))
    pads = [(d[i] * (k[i] - 1) - p[i], d[i] * (k[i] - 1) - p[i] + op[i]) for i in range(nd)]
    dn = lax().conv_dimension_numbers(x.shape, w2.shape, ("NC" + sp, "OI" + sp, "NC" + sp))
    return lax().conv_general_dilated(
        x, w2, window_strides=(1,) * nd, padding=pads, lhs_dilation=s, rhs_dilation=d,
        feature_group_count=groups, dimension_numbers=dn, precision=prec)


def _conv_dtype(x, w):
    dt = tdtype(x)
    if dt != tdtype(w):
        names = {torch.float32: "Float", torch.float64: "Double", torch.bfloat16: "BFloat16",
                 torch.float16: "Half", torch.int64: "Long", torch.int32: "Int"}
        # CPU's error (its wording varies with the dtypes; the type does not)
        raise RuntimeError(f"expected scalar type {names.get(dt, dt)} but found "
                           f"{names.get(tdtype(w), tdtype(w))}")
    if dt.is_complex or dt is torch.bool:
        raise NotImplementedError(f"torchtpu: convolution does not support {dt} inputs")
    return opmath(dt) if dt.is_floating_point else dt  # integers: XLA's exact integer conv


def _check_output_padding(nd, stride, dilation, output_padding):
    """CPU's transposed-convolution shape check: each ``output_padding`` must be smaller
    than its ``stride`` or its ``dilation``; the message names the dimensions as CPU's
    2-D/3-D kernels do (a 1-D convolution runs as 2-D with a height of 1)."""
    op, st, dl = (_tup(v, nd) for v in (output_padding, stride, dilation))
    if all(p < s or p < d for p, s, d in zip(op, st, dl)):
        return
    if nd == 1:
        op, st, dl = (0,) + op, (1,) + st, (1,) + dl
    names = ("depth", "height", "width")[-len(op):]
    parts = [f"{what}_{n}: {v}" for what, vs in (("output_padding", op), ("stride", st),
                                                 ("dilation", dl)) for n, v in zip(names, vs)]
    raise RuntimeError("output padding must be smaller than either stride or dilation, but "
                       "got " + " ".join(parts))


def _conv_memory_format(x, w):
    """CPU's memory format for a convolution's output: channels_last (channels_last_3d)
    when the input or the weight suggests it (``suggest_memory_format``), else None
    (contiguous).  PyTorch's meta kernel looks at the input only, off CUDA."""
    from torch._prims_common import suggest_memory_format

    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(w.dim())
    if fmt is None:
        return None
    if suggest_memory_format(w) == fmt or (x.dim() == w.dim() and
                                           suggest_memory_format(x) == fmt):
        return fmt
    return None


def _conv_meta(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """The output's geometry: PyTorch's meta kernel, laid out as CPU lays it out
    (:func:`_conv_memory_format`; an unbatched 2-d input: the batched layout, squeezed;
    a 3-d convolution of one sample, batched or not: contiguous, as CPU gives it)."""
    out = aten.convolution.default(x, w, bias, stride, padding, dilation, transposed,
                                   output_padding, groups)
    fmt = _conv_memory_format(x, w)
    unbatched = out.dim() == w.dim() - 1
    if fmt is None or (w.dim() == 5 and (unbatched or out.shape[0] == 1)):
        return out  # (CPU: a 3-d convolution of one sample stays contiguous)
    shape = ((1,) if unbatched else ()) + tuple(out.shape)
    laid = torch.empty(shape, dtype=out.dtype, device="meta", memory_format=fmt)
    return laid[0] if unbatched else laid


@lower(aten.convolution_overrideable.default, aten.convolution.default, precision=True,
       meta=_conv_meta)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    ct = _conv_dtype(x, w)
    if not ct.is_floating_point and ct is not torch.int64:
        # CPU's transposed and dilated kernels have integer variants for int64 only
        if transposed:
            kernel = ("slow_conv_transpose3d_out_cpu" if w.ndim == 5
                      else "slow_conv_transpose2d_out_cpu")
        elif any(d != 1 for d in dilation):
            kernel = "slow_conv_dilated<>"
        else:
            kernel = None
        if kernel is not None:
            raise NotImplementedError(
                f'"{kernel}" not implemented for \'{scalar_type_name(ct)}\'')
    if transposed:
        _check_output_padding(w.ndim - 2, stride, dilation, output_padding)
    unbatched = x.ndim == w.ndim - 1
    xx = cast(x, ct)
    if unbatched:
        xx = xx[None]
    out = _conv(xx, cast(w, ct), stride, padding, dilation, transposed, output_padding, groups,
                matmul_precision(tdtype(x)))
    if bias is not None:
        out = out + cast(bias, ct).reshape((1, -1) + (1,) * (out.ndim - 2))
    return out[0] if unbatched else out


def convolution_backward(grad_output, x, w, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask, bias_sizes=None):
    ct = _conv_dtype(x, w)
    g = cast(grad_output, ct)
    xx, ww = cast(x, ct), cast(w, ct)
    unbatched = x.ndim == w.ndim - 1
    if unbatched:
        xx, g = xx[None], g[None]
    prec = matmul_precision(tdtype(x))
    f = lambda a, b: _conv(a, b, stride, padding, dilation, transposed, output_padding, groups, prec)  # noqa: E731
    _, vjp = _jax().vjp(f, xx, ww)
    gi, gw = vjp(g)
    if unbatched:
        gi = gi[0]
    gb = jnp().sum(g, axis=(0,) + tuple(range(2, g.ndim)))
    outs = (gi, gw, gb)
    return tuple(o if m else _empty() for o, m in zip(outs, output_mask))


_masked_op(aten.convolution_backward_overrideable.default, convolution_backward, precision=True)
_masked_op(aten.convolution_backward.default,
           lambda go, x, w, bias_sizes, *rest: convolution_backward(go, x, w, *rest),
           precision=True)


# ============================================================ pooling


def _pool_out(size, k, s, p, d, ceil):
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)
    out = num // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def _windows(x, nd, k, s, p, d, ceil, pad_value):
    """Pooling windows of the trailing ``nd`` dims of x.

    Returns (patches list, one array per kernel offset shaped (..., *out); positions list
    of static numpy arrays (*out) of flat input indices; valid list of static bool masks;
    out sizes)."""
    j = jnp()
    insz = x.shape[-nd:]
    out = [_pool_out(insz[i], k[i], s[i], p[i], d[i], ceil) for i in range(nd)]
    hi = [max(0, (out[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 - insz[i] - p[i]) for i in range(nd)]
    lead = x.ndim - nd
    xp = j.pad(x, [(0, 0)] * lead + [(p[i], hi[i]) for i in range(nd)], constant_values=pad_value)
    patches, positions, valid = [], [], []
    grids = np.meshgrid(*[np.arange(o) for o in out], indexing="ij")
    instr = [int(np.prod(insz[i + 1:])) for i in range(nd)]
    for offs in itertools.product(*[range(ki) for ki in k]):
        sl = tuple(slice(offs[i] * d[i], offs[i] * d[i] + (out[i] - 1) * s[i] + 1, s[i])
                   for i in range(nd))
        patches.append(xp[(Ellipsis,) + sl])
        coords = [grids[i] * s[i] - p[i] + offs[i] * d[i] for i in range(nd)]
        ok = np.ones(out, bool)
        flat = np.zeros(out, np.int64)
        for i in range(nd):
            ok &= (coords[i] >= 0) & (coords[i] < insz[i])
            flat += coords[i] * instr[i]
        positions.append(flat)
        valid.append(ok)
    return patches, positions, valid, out


def _max_pool(x, nd, kernel_size, stride, padding, dilation, ceil_mode):
    k = _tup(kernel_size, nd)
    s = _tup(stride, nd) if len(stride) else k
    p = _tup(padding, nd)
    d = _tup(dilation, nd)
    j = jnp()
    dt = x.dtype
    isf = j.issubdtype(dt, j.floating)
    low = -j.inf if isf else j.iinfo(dt).min
    patches, positions, valid, out = _windows(x, nd, k, s, p, d, ceil_mode, low)
    # PyTorch's scan: the first valid position starts, `val > max || isnan(val)` updates
    first = np.full(out, -1, np.int64)
    for pos, ok in zip(positions, valid):
        first = np.where((first < 0) & ok, pos, first)
    maxval = j.full(patches[0].shape, low, dt)
    maxidx = j.broadcast_to(j.asarray(first), patches[0].shape)
    for v, pos, ok in zip(patches, positions, valid):
        upd = v > maxval
        if isf:
            upd = upd | j.isnan(v)
        upd = upd & j.asarray(ok)
        maxval = j.where(upd, v, maxval)
        maxidx = j.where(upd, j.asarray(pos), maxidx)
    return maxval, maxidx


@lower(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lower(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


def _max_pool_backward(g, x, nd, indices):
    j = jnp()
    ct = _ct(x)
    lead = x.shape[:-nd]
    b = int(np.prod(lead))
    n_in = int(np.prod(x.shape[-nd:]))
    n_out = int(np.prod(g.shape[-nd:]))
    gg = cast(g, ct).reshape(b, n_out)
    idx = indices.reshape(b, n_out)
    gi = j.zeros((b, n_in), npdt(ct)).at[j.arange(b)[:, None], idx].add(gg)
    return gi.reshape(x.shape)


@lower(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(g, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(g, x, 2, indices)


@lower(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(g, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(g, x, 3, indices)


def _avg_pool(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k = _tup(kernel_size, nd)
    s = _tup(stride, nd) if len(stride) else k
    p = _tup(padding, nd)
    ct = _ct(x)
    xx = cast(x, ct)
    patches, positions, valid, out = _windows(xx, nd, k, s, p, (1,) * nd, ceil_mode, 0)
    total = patches[0]
    for v in patches[1:]:
        total = total + v
    insz = x.shape[-nd:]
    # divisor per output position (PyTorch's CPU rule), static
    grids = np.meshgrid(*[np.arange(o) for o in out], indexing="ij")
    pool = np.ones(out, np.int64)
    cnt = np.ones(out, np.int64)
    for i in range(nd):
        start = grids[i] * s[i] - p[i]
        end = np.minimum(start + k[i], insz[i] + p[i])
        pool *= end - start
        cnt *= np.minimum(end, insz[i]) - np.maximum(start, 0)
    if divisor_override:
        div = np.full(out, divisor_override, np.int64)
    elif count_include_pad:
        div = pool
    else:
        div = cnt
    return total / jnp().asarray(div.astype(npdt(ct)))


@lower(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lower(aten.avg_pool3d.default)
def avg_pool3d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _vjp_x(f, x, g):
    ct = _ct(x)
    _, vjp = _jax().vjp(f, cast(x, ct))
    return vjp(cast(g, ct))[0]


@lower(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(g, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _vjp_x(lambda a: _avg_pool(a, 2, kernel_size, stride, padding, ceil_mode,
                                      count_include_pad, divisor_override), x, g)


@lower(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(g, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _vjp_x(lambda a: _avg_pool(a, 3, kernel_size, stride, padding, ceil_mode,
                                      count_include_pad, divisor_override), x, g)


def _adaptive_matrix(n_in, n_out):
    m = np.zeros((n_out, n_in), np.float64)
    cnt = np.zeros(n_out, np.int64)
    for i in range(n_out):
        a = (i * n_in) // n_out
        b = -((-(i + 1) * n_in) // n_out)
        m[i, a:b] = 1
        cnt[i] = b - a
    return m, cnt


def _adaptive_avg(x, nd, output_size):
    osz = _tup(output_size, nd)
    ct = _ct(x)
    y = cast(x, ct)
    div = np.ones((), np.int64)
    for i in range(nd):
        ax = x.ndim - nd + i
        m, cnt = _adaptive_matrix(x.shape[ax], osz[i])
        y = jnp().moveaxis(
            jnp().tensordot(y, jnp().asarray(m.astype(npdt(ct))), axes=([ax], [1]),
                            precision=highest()), -1, ax)
        div = np.multiply.outer(div, cnt)
    return y / jnp().asarray(div.astype(npdt(ct)))


@lower(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg(x, 2, output_size)


@lower(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(x, output_size):
    if tdtype(x) in (torch.bfloat16, torch.float16):
        return _adaptive_avg3d_half(x, _tup(output_size, 3))
    return _adaptive_avg(x, 3, output_size)


def _adaptive_avg3d_half(x, osz):
    """bfloat16/float16 adaptive_avg_pool3d as CPU's kernel computes it: each window
    summed in order (depth, height, width) in the tensor's dtype, rounding after every
    addition, then divided by kT, kH and kW in turn (rounding each time).  Accumulating in
    float32 instead differs from CPU by up to a few ulps of the sum."""
    j = jnp()
    lead = x.shape[:-3]
    sp = x.shape[-3:]
    if x.size == 0 or any(o == 0 for o in osz):
        return j.zeros(lead + tuple(osz), x.dtype)
    idx, valid, count = [], [], []
    for d in range(3):
        n, o = sp[d], osz[d]
        st = np.array([(i * n) // o for i in range(o)])
        en = np.array([-((-(i + 1) * n) // o) for i in range(o)])
        k = int((en - st).max())
        pos = st[:, None] + np.arange(k)[None, :]
        valid.append(pos < en[:, None])
        idx.append(np.minimum(pos, n - 1))
        count.append(en - st)
    (it, vt), (ih, vh), (iw, vw) = zip(idx, valid)
    # (..., oT, oH, oW, kT, kH, kW)
    g = x[..., it[:, None, None, :, None, None], ih[None, :, None, None, :, None],
          iw[None, None, :, None, None, :]]
    ok = (vt[:, None, None, :, None, None] & vh[None, :, None, None, :, None]
          & vw[None, None, :, None, None, :])
    kk = ok.shape[-3] * ok.shape[-2] * ok.shape[-1]
    g = g.reshape(lead + tuple(osz) + (kk,))
    ok = ok.reshape(tuple(osz) + (kk,))
    f32 = npdt(torch.float32)

    def step(acc, kv):
        v, m = kv
        s = (acc.astype(f32) + v.astype(f32)).astype(x.dtype)
        return j.where(m, s, acc), None

    acc0 = j.zeros(lead + tuple(osz), x.dtype)
    acc, _ = lax().scan(step, acc0, (j.moveaxis(g, -1, 0),
                                     j.asarray(np.moveaxis(ok, -1, 0))))
    ct, ch, cw = count
    for c in (ct[:, None, None], ch[None, :, None], cw[None, None, :]):
        acc = (acc.astype(f32) / j.asarray(c.astype(np.float32))).astype(x.dtype)
    return acc


@lower(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(g, x):
    return _vjp_x(lambda a: _adaptive_avg(a, 2, g.shape[-2:]), x, g)


@lower(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(g, x):
    return _vjp_x(lambda a: _adaptive_avg(a, 3, g.shape[-3:]), x, g)


def _adaptive_max(x, nd, output_size):
    """Adaptive max pooling: (values, int64 flat indices into the pooled dims).  Windows
    ``[floor(i*n/o), ceil((i+1)*n/o))``; the first maximum wins, a NaN always wins (the
    last NaN of a window, like PyTorch's CPU kernel)."""
    j = jnp()
    osz = _tup(output_size, nd)
    lead = x.ndim - nd
    sp = x.shape[lead:]
    if any(o == 0 for o in osz) or x.size == 0:
        shape = x.shape[:lead] + tuple(osz)
        return j.zeros(shape, x.dtype), j.zeros(shape, npdt(torch.int64))
    y = x
    flat = np.zeros((), np.int64)
    valid = np.ones((), bool)
    ks = []
    for d in range(nd):
        n, o = sp[d], osz[d]
        starts = [(i * n) // o for i in range(o)]
        ends = [-((-(i + 1) * n) // o) for i in range(o)]
        k = max(e - s for s, e in zip(starts, ends))
        idx = np.array([[min(s + t, e - 1) for t in range(k)] for s, e in zip(starts, ends)])
        ok = np.array([[s + t < e for t in range(k)] for s, e in zip(starts, ends)])
        ax = lead + 2 * d
        y = j.take(y, j.asarray(idx.reshape(-1)), axis=ax)
        y = y.reshape(y.shape[:ax] + (o, k) + y.shape[ax + 1:])
        stride = int(np.prod(sp[d + 1:], dtype=np.int64))
        flat = np.add.outer(flat, idx * stride)   # (O1, K1, ..., Od, Kd)
        valid = np.logical_and.outer(valid, ok)
        ks.append(k)
    # (..., O1, K1, ..., Ond, Knd) -> (..., O1..Ond, K1*...*Knd)
    perm = list(range(lead)) + [lead + 2 * d for d in range(nd)] + [lead + 2 * d + 1 for d in range(nd)]
    y = j.transpose(y, perm).reshape(x.shape[:lead] + tuple(osz) + (-1,))
    fperm = [2 * d for d in range(nd)] + [2 * d + 1 for d in range(nd)]
    flat = np.transpose(flat, fperm).reshape(tuple(osz) + (-1,))
    valid = np.transpose(valid, fperm).reshape(tuple(osz) + (-1,))
    K = flat.shape[-1]
    validj = j.asarray(valid)
    if j.issubdtype(y.dtype, j.floating):
        low = j.asarray(-j.inf, y.dtype)
    elif y.dtype == j.bool_:
        low = j.asarray(False)
    else:
        low = j.asarray(j.iinfo(y.dtype).min, y.dtype)
    ym = j.where(validj, y, low)
    mx = j.max(ym, axis=-1, keepdims=True)
    pos = j.arange(K)
    first = j.min(j.where(validj & (ym == mx), pos, K), axis=-1)
    if j.issubdtype(y.dtype, j.floating):
        isn = validj & j.isnan(y)
        last_nan = j.max(j.where(isn, pos, -1), axis=-1)
        first = j.where(last_nan >= 0, last_nan, first)
        mx = j.where(j.any(isn, axis=-1, keepdims=True), j.nan, mx)
    first = j.minimum(first, K - 1)
    if j.issubdtype(y.dtype, j.floating):
        # the value is the element at that index (CPU's): XLA's max of -0.0 and 0.0 is
        # +0.0 whatever comes first.  A zero maximum takes the sign of that element (a
        # max over it and -inf: no tie left)
        at = j.max(j.where(pos == first[..., None], ym, low), axis=-1, keepdims=True)
        mx = j.where(mx == 0, at, mx)
    ind = j.take_along_axis(j.broadcast_to(j.asarray(flat), y.shape), first[..., None], axis=-1)
    return mx[..., 0], ind[..., 0].astype(npdt(torch.int64))


@lower(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(x, output_size):
    return _adaptive_max(x, 2, output_size)


@lower(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(x, output_size):
    return _adaptive_max(x, 3, output_size)


# ============================================================ softmax


def _dim(d, nd):
    return d % nd if nd else 0


def _softmax_dtype_check(x, dim, name):
    """CPU's kernels have no integer/bool instantiation (dtype= converts first)."""
    dt = tdtype(x)
    if not (dt.is_floating_point or dt.is_complex) and x.size:
        last = x.ndim == 0 or _dim(dim, x.ndim) == x.ndim - 1
        kernel = f"{name}_lastdim_kernel_impl" if last else f"{name}_kernel_impl"
        raise NotImplementedError(f'"{kernel}" not implemented for \'{scalar_type_name(dt)}\'')


@lower(aten._softmax.default)
def softmax(x, dim, half_to_float):
    _softmax_dtype_check(x, dim, "softmax")
    xx = _f(x)
    if x.ndim == 0:
        return jnp().ones_like(xx)
    return _jax().nn.softmax(xx, axis=_dim(dim, x.ndim))


@lower(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float):
    _softmax_dtype_check(x, dim, "log_softmax")
    xx = _f(x)
    if x.ndim == 0:
        return jnp().zeros_like(xx)
    return _jax().nn.log_softmax(xx, axis=_dim(dim, x.ndim))


@lower(aten._softmax_backward_data.default)
def softmax_backward_data(g, out, dim, input_dtype):
    gg, o = _f(g), _f(out)
    if out.ndim == 0:
        return jnp().zeros_like(gg)
    ax = _dim(dim, out.ndim)
    return o * (gg - jnp().sum(gg * o, axis=ax, keepdims=True))


@lower(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(g, out, dim, input_dtype):
    gg, o = _f(g), _f(out)
    if out.ndim == 0:
        return jnp().zeros_like(gg)
    ax = _dim(dim, out.ndim)
    return gg - jnp().exp(o) * jnp().sum(gg, axis=ax, keepdims=True)


# ============================================================ normalization


def _bshape(c_axis, ndim, v):
    shape = [1] * ndim
    shape[c_axis] = -1
    return v.reshape(shape)


def stats_dtype(x_dtype: torch.dtype, *params) -> torch.dtype | None:
    """The dtype of the statistics (mean, rstd / invstd) CPU's layer and batch norm
    kernels return: float32 for a float16/bfloat16 input with float32 parameters ("mixed
    type"), else the input's dtype.  ``None`` where that is the meta kernel's dtype
    already; PyTorch's meta kernels (like CUDA) give float32 for every float16/bfloat16
    input."""
    if x_dtype in (torch.float16, torch.bfloat16) and not any(
            p is not None and p.dtype == torch.float32 for p in params):
        return x_dtype
    return None


def _norm_stats_dtypes(x_pos, *param_pos):
    """``out_dtypes`` hook: outputs 1 and 2 (the statistics) in :func:`stats_dtype`."""

    def out_dtypes(vals, dts):
        sd = stats_dtype(vals[x_pos].dtype, *(vals[i] for i in param_pos))
        if sd is None:
            return dts
        return [dts[0], sd, sd, *dts[3:]]

    return out_dtypes


@lower(aten.native_layer_norm.default, out_dtypes=_norm_stats_dtypes(0, 2, 3))
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    j = jnp()
    ct = _ct(x)
    xx = cast(x, ct)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = j.mean(xx, axis=axes, keepdims=True)
    var = j.mean(j.square(xx - mean), axis=axes, keepdims=True)
    rstd = lax().rsqrt(var + eps)
    out = (xx - mean) * rstd
    if weight is not None:
        out = out * cast(weight, ct)
    if bias is not None:
        out = out + cast(bias, ct)
    return out, mean, rstd


def native_layer_norm_backward(g, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    j = jnp()
    ct = _ct(x)
    xx, gg = cast(x, ct), cast(g, ct)
    m, r = cast(mean, ct), cast(rstd, ct)
    n = len(normalized_shape)
    axes = tuple(range(x.ndim - n, x.ndim))
    lead = tuple(range(x.ndim - n))
    xhat = (xx - m) * r
    gx = gg * cast(weight, ct) if weight is not None else gg
    cnt = int(np.prod(normalized_shape)) if n else 1
    gi = (r / cnt) * (cnt * gx - j.sum(gx, axis=axes, keepdims=True)
                      - xhat * j.sum(gx * xhat, axis=axes, keepdims=True))
    gw = j.sum(gg * xhat, axis=lead) if weight is not None else _empty()
    gb = j.sum(gg, axis=lead) if bias is not None else _empty()
    outs = (gi, gw, gb)
    return tuple(o if mk else _empty() for o, mk in zip(outs, output_mask))


_masked_op(aten.native_layer_norm_backward.default, native_layer_norm_backward)


def _group_stats(xx, n, group, eps):
    j = jnp()
    xg = xx.reshape(n, group, xx.size // max(n * group, 1) if n * group else 0)
    mean = j.mean(xg, axis=2)
    var = j.mean(j.square(xg - mean[..., None]), axis=2)
    return xg, mean, lax().rsqrt(var + eps)


@lower(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    ct = _ct(x)
    xx = cast(x, ct)
    xg, mean, rstd = _group_stats(xx, N, group, eps)
    out = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    if weight is not None:
        out = out * _bshape(1, x.ndim, cast(weight, ct))
    if bias is not None:
        out = out + _bshape(1, x.ndim, cast(bias, ct))
    return out, mean, rstd


def native_group_norm_backward(g, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    j = jnp()
    ct = _ct(x)
    xx, gg = cast(x, ct), cast(g, ct)
    m, r = cast(mean, ct), cast(rstd, ct)
    per = C // group * HxW
    xg = xx.reshape(N, group, per)
    xhat = ((xg - m[..., None]) * r[..., None]).reshape(x.shape)
    gx = gg * _bshape(1, x.ndim, cast(weight, ct)) if weight is not None else gg
    gxg = gx.reshape(N, group, per)
    xhg = xhat.reshape(N, group, per)
    cnt = xg.shape[-1]
    gi = (r[..., None] / cnt) * (cnt * gxg - j.sum(gxg, axis=2, keepdims=True)
                                 - xhg * j.sum(gxg * xhg, axis=2, keepdims=True))
    gi = gi.reshape(x.shape)
    red = (0,) + tuple(range(2, x.ndim))
    gw = j.sum(gg * xhat, axis=red)
    gb = j.sum(gg, axis=red)
    outs = (gi, gw, gb)
    return tuple(o if mk else _empty() for o, mk in zip(outs, output_mask))


_masked_op(aten.native_group_norm_backward.default, native_group_norm_backward)


def _bn_train(x, weight, bias, eps):
    j = jnp()
    ct = _ct(x)
    xx = cast(x, ct)
    red = (0,) + tuple(range(2, x.ndim))
    mean = j.mean(xx, axis=red)
    var = j.mean(j.square(xx - _bshape(1, x.ndim, mean)), axis=red)
    invstd = lax().rsqrt(var + eps)
    out = (xx - _bshape(1, x.ndim, mean)) * _bshape(1, x.ndim, invstd)
    out = _affine(out, weight, bias, ct)
    return out, mean, var, invstd


def _affine(out, weight, bias, ct):
    if weight is not None:
        out = out * _bshape(1, out.ndim, cast(weight, ct))
    if bias is not None:
        out = out + _bshape(1, out.ndim, cast(bias, ct))
    return out


def _bn_eval(x, weight, bias, rm, rv, eps):
    ct = _ct(x)
    xx = cast(x, ct)
    invstd = lax().rsqrt(cast(rv, ct) + eps)
    out = (xx - _bshape(1, x.ndim, cast(rm, ct))) * _bshape(1, x.ndim, invstd)
    return _affine(out, weight, bias, ct)


@lower(aten._native_batch_norm_legit_functional.default,
       out_dtypes=_norm_stats_dtypes(0, 1, 2, 3, 4))
def native_batch_norm_legit_functional(x, weight, bias, rm, rv, training, momentum, eps):
    if not training:
        # (a functionalized ``_native_batch_norm_legit(training=False)``): the eval
        # normalization, the running statistics unchanged; the saved statistics follow
        # the meta kernel's (C,), as ``_native_batch_norm_legit_no_training`` does
        out = _bn_eval(x, weight, bias, rm, rv, eps)
        ct = _ct(x)
        return out, cast(rm, ct), lax().rsqrt(cast(rv, ct) + eps), rm, rv
    out, mean, var, invstd = _bn_train(x, weight, bias, eps)
    n = x.size // x.shape[1]
    ct = opmath(tdtype(rm))
    unbiased = var * (n / (n - 1)) if n > 1 else var * float("inf")
    new_rm = (1 - momentum) * cast(rm, ct) + momentum * cast(mean, ct)
    new_rv = (1 - momentum) * cast(rv, ct) + momentum * cast(unbiased, ct)
    return out, mean, invstd, new_rm, new_rv


@lower(aten._native_batch_norm_legit.no_stats, out_dtypes=_norm_stats_dtypes(0, 1, 2))
def native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    if not training:
        raise NotImplementedError("_native_batch_norm_legit.no_stats with training=False")
    out, mean, _, invstd = _bn_train(x, weight, bias, eps)
    return out, mean, invstd


@lower(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(x, weight, bias, rm, rv, momentum, eps):
    # PyTorch's meta kernel gives (C,) saved stats (the CPU kernel returns empty ones);
    # the executor follows the meta kernel: the running stats the backward uses.
    out = _bn_eval(x, weight, bias, rm, rv, eps)
    ct = _ct(x)
    return out, cast(rm, ct), lax().rsqrt(cast(rv, ct) + eps)


@decomp(aten._native_batch_norm_legit.default)
def _bn_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training:
        out = aten._native_batch_norm_legit_no_training(
            x, weight, bias, running_mean, running_var, momentum, eps)[0]
        # like the CPU kernel: empty saved statistics in eval mode
        sd = stats_dtype(x.dtype, weight, bias, running_mean, running_var) or (
            torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype)
        return out, x.new_empty((0,), dtype=sd), x.new_empty((0,), dtype=sd)
    out, mean, invstd, nrm, nrv = aten._native_batch_norm_legit_functional(
        x, weight, bias, running_mean, running_var, True, momentum, eps)
    running_mean.copy_(nrm)
    running_var.copy_(nrv)
    return out, mean, invstd


@decomp(aten._batch_norm_with_update.default)
def _bn_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    """Training batch norm updating the running stats in place; CPU's ``reserve`` output
    is an empty uint8 tensor."""
    out, mean, invstd = _bn_legit(x, weight, bias, running_mean, running_var, True, momentum,
                                  eps)
    return out, mean, invstd, x.new_empty((0,), dtype=torch.uint8)


@decomp(aten.native_batch_norm.default)
def _native_bn(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if running_mean is None and running_var is None:
        return aten._native_batch_norm_legit.no_stats(x, weight, bias, training, momentum, eps)
    if running_mean is None or running_var is None:
        raise NotImplementedError("native_batch_norm with only one of running_mean/running_var")
    return _bn_legit(x, weight, bias, running_mean, running_var, training, momentum, eps)


def native_batch_norm_backward(g, x, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    j = jnp()
    ct = _ct(x)
    xx, gg = cast(x, ct), cast(g, ct)
    nd = x.ndim
    red = (0,) + tuple(range(2, nd))
    if train:
        mean, invstd = cast(save_mean, ct), cast(save_invstd, ct)
    else:
        mean = cast(running_mean, ct)
        invstd = lax().rsqrt(cast(running_var, ct) + eps)
    xhat = (xx - _bshape(1, nd, mean)) * _bshape(1, nd, invstd)
    w = cast(weight, ct) if weight is not None else j.ones_like(mean)
    sg = j.sum(gg, axis=red)
    sgx = j.sum(gg * xhat, axis=red)
    if train:
        n = x.size // x.shape[1]
        gi = _bshape(1, nd, w * invstd / n) * (
            n * gg - _bshape(1, nd, sg) - xhat * _bshape(1, nd, sgx))
    else:
        gi = gg * _bshape(1, nd, w * invstd)
    outs = (gi, sgx, sg)
    return tuple(o if mk else _empty() for o, mk in zip(outs, output_mask))


_masked_op(aten.native_batch_norm_backward.default, native_batch_norm_backward)


# ============================================================ activations


@lower(aten.relu.default)
def relu(x):
    if x.dtype == jnp().bool_:
        return x
    # CPU: clamp_min(x, 0), ``x < 0 ? 0 : x``: relu(-0.0) is -0.0 (XLA's max gives +0.0)
    return jnp().where(x < 0, jnp().zeros((), x.dtype), x)


@lower(aten.gelu.default)
def gelu(x, approximate="none"):
    j = jnp()
    xx = _f(x)
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        return 0.5 * xx * (1 + j.tanh(k * (xx + 0.044715 * xx * xx * xx)))
    return xx * 0.5 * (1 + lax().erf(xx * (1 / math.sqrt(2))))


@lower(aten.gelu_backward.default)
def gelu_backward(g, x, approximate="none"):
    j = jnp()
    xx, gg = _f(x), _f(g)
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        kb = 0.044715
        inner = k * (xx + kb * xx * xx * xx)
        t = j.tanh(inner)
        left = 0.5 * xx
        right = 1 + t
        left_d = 0.5 * right
        right_d = left * (1 - t * t) * (k * (1 + 3 * kb * xx * xx))
        return gg * (left_d + right_d)
    cdf = 0.5 * (1 + lax().erf(xx * (1 / math.sqrt(2))))
    pdf = j.exp(-0.5 * xx * xx) * (1 / math.sqrt(2 * math.pi))
    return gg * (cdf + xx * pdf)


@lower(aten.silu.default)
def silu(x):
    xx = _f(x)
    return xx * _jax().nn.sigmoid(xx)


@lower(aten.silu_backward.default)
def silu_backward(g, x):
    xx, gg = _f(x), _f(g)
    s = _jax().nn.sigmoid(xx)
    return gg * s * (1 + xx * (1 - s))


@lower(aten.mish.default)
def mish(x):
    xx = _f(x)
    return xx * jnp().tanh(_jax().nn.softplus(xx))


@lower(aten.mish_backward.default)
def mish_backward(g, x):
    xx, gg = _f(x), _f(g)
    s = _jax().nn.sigmoid(xx)
    t = jnp().tanh(_jax().nn.softplus(xx))
    return gg * (t + xx * s * (1 - t * t))


_hardtanh_fits_213 = fits(1, 2)


@scalar_check
def _hardtanh_fits(vals):
    """Bounds checked as CPU's ``clamp`` checks them (torch 2.15: integer bounds
    saturate or raise, ``clamp_integer_bounds``; before: CPU's checked conversion)."""
    if clamp_integer_bounds(vals, ((1, "min"), (2, "max")), vals[0].dtype):
        return vals
    if vals[0].dtype == torch.uint8 and any(
            isinstance(v, (int, float)) and v < 0 for v in vals[1:3]):
        # torch 2.13's hardtanh check, before the bounds' conversion
        raise RuntimeError("cannot do hardtanh on an unsigned type with negative limits")
    return _hardtanh_fits_213(vals)


@lower(aten.hardtanh.default, prepare=_hardtanh_fits)
def hardtanh(x, min_val=-1, max_val=1):
    ct = opmath(tdtype(x))
    xx = cast(x, ct)
    lo, hi = cast(min_val, ct), cast(max_val, ct)
    j = jnp()
    # clamp with NaN propagation
    return j.where(xx < lo, lo, j.where(xx > hi, hi, xx))


@lower(aten.hardtanh_backward.default)
def hardtanh_backward(g, x, min_val, max_val):
    ct = _ct(x)
    xx, gg = cast(x, ct), cast(g, ct)
    lo, hi = cast(min_val, ct), cast(max_val, ct)
    return jnp().where((xx <= lo) | (xx >= hi), jnp().zeros_like(gg), gg)


@lower(aten.leaky_relu.default, prepare=fits(1, opmath=True))
def leaky_relu(x, negative_slope=0.01):
    xx = _f(x)
    return jnp().where(xx > 0, xx, xx * cast(negative_slope, _ct(x)))


@lower(aten.leaky_relu_backward.default)
def leaky_relu_backward(g, x, negative_slope, self_is_result):
    ct = _ct(x)
    xx, gg = cast(x, ct), cast(g, ct)
    return jnp().where(xx > 0, gg, gg * cast(negative_slope, ct))


@lower(aten.elu.default)
def elu(x, alpha=1, scale=1, input_scale=1):
    ct = _ct(x)
    xx = cast(x, ct)
    a, s, i = cast(alpha, ct), cast(scale, ct), cast(input_scale, ct)
    return jnp().where(xx > 0, xx * s, jnp().expm1(xx * i) * a * s)


@lower(aten.elu_backward.default)
def elu_backward(g, alpha, scale, input_scale, is_result, self_or_result):
    ct = _ct(self_or_result)
    y, gg = cast(self_or_result, ct), cast(g, ct)
    neg, pos, ni = cast(alpha, ct) * cast(scale, ct), cast(scale, ct), cast(input_scale, ct)
    if is_result:
        return jnp().where(y <= 0, gg * ni * (y + neg), gg * pos)
    return jnp().where(y <= 0, gg * ni * neg * jnp().exp(y * ni), gg * pos)


@lower(aten.softplus.default)
def softplus(x, beta=1, threshold=20):
    ct = _ct(x)
    xx = cast(x, ct)
    b, t = cast(beta, ct), cast(threshold, ct)
    return jnp().where(xx * b > t, xx, jnp().log1p(jnp().exp(xx * b)) / b)


@lower(aten.softplus_backward.default)
def softplus_backward(g, x, beta, threshold):
    ct = _ct(x)
    xx, gg = cast(x, ct), cast(g, ct)
    b, t = cast(beta, ct), cast(threshold, ct)
    z = jnp().exp(xx * b)
    return jnp().where(xx * b > t, gg, gg * z / (z + 1))


def _exact(v, d):
    """``v / d`` (``d`` a number) correctly rounded, as CPU divides (``ieee_div``)."""
    return ieee_div(v, jnp().asarray(d, v.dtype))


@lower(aten.hardswish.default)
def hardswish(x):
    """CPU's ``x * min(max(x + 3, 0), 6) / 6``, the division exactly rounded."""
    xx = _f(x)
    return _exact(xx * jnp().clip(xx + 3, 0, 6), 6)


@lower(aten.hardswish_backward.default)
def hardswish_backward(g, x):
    """CPU's kernel: 0 where ``x <= -3``, ``g * (x / 3 + 0.5)`` where ``-3 < x < 3``, ``g``
    where ``x >= 3`` (at -3 and 3 the outer branches)."""
    j = jnp()
    ct = _ct(x)
    xx, gg = cast(x, ct), cast(g, ct)
    return j.where(xx <= -3, j.zeros_like(gg),
                   j.where(xx < 3, gg * (_exact(xx, 3) + 0.5), gg))


@lower(aten.tanh_backward.default)
def tanh_backward(g, y):
    """CPU's kernel: ``g * (1 - y * y)`` with ``1 - y * y`` one fused multiply-add (its
    vectorized loop uses ``fmadd``); written ``1 + (-y) * y`` so that XLA contracts it the
    same way (``1 - y * y`` rounded ``y * y`` first: up to ~1,400 ulp off near ``|y| = 1``,
    in a quarter of float32 elements).  bfloat16/float16 in float32, rounded once;
    complex: ``g * conj(1 - y * y)``."""
    ct = opmath(tdtype(g))
    gg, yy = cast(g, ct), cast(y, ct)
    if jnp().iscomplexobj(yy):
        return gg * jnp().conj(1 - yy * yy)
    return gg * (1 + (-yy) * yy)


@lower(aten.sigmoid_backward.default)
def sigmoid_backward(g, y):
    """CPU's kernel: ``g * (1 - y) * y`` in that order; bfloat16 in float32, rounded once;
    float16 in float16 arithmetic (each step rounded: CPU's Half kernel has no float32
    path; PyTorch's decomposition computes ``g * (y * (1 - y))`` in float32, 1 ulp off in
    ~1 of 3 float16 elements); complex: ``g * conj((1 - y) * y)``."""
    dt = tdtype(g)
    ct = opmath(dt)
    gg, yy = cast(g, ct), cast(y, ct)
    if jnp().iscomplexobj(yy):
        return gg * jnp().conj((1 - yy) * yy)
    if dt == torch.float16:
        return round_to(gg * round_to(1 - yy, dt), dt) * yy
    return gg * (1 - yy) * yy


@lower(aten.hardsigmoid.default)
def hardsigmoid(x):
    """CPU's ``min(max(x + 3, 0), 6) / 6``, the division exactly rounded."""
    xx = _f(x)
    return _exact(jnp().clip(xx + 3, 0, 6), 6)


@lower(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(g, x):
    """CPU's kernel: ``g * one_sixth`` where ``-3 < x < 3``, else 0; ``one_sixth`` is
    ``1.0f / 6.0f``, float32's sixth, for every dtype (float64 included)."""
    j = jnp()
    ct = _ct(x)
    xx, gg = cast(x, ct), cast(g, ct)
    sixth = j.asarray(np.float32(1.0) / np.float32(6.0), gg.dtype)
    return j.where((xx > -3) & (xx < 3), gg * sixth, j.zeros_like(gg))


@lower(aten.threshold.default, prepare=fits(1, 2, opmath=True))
def threshold(x, threshold, value):
    ct = opmath(tdtype(x))
    xx = cast(x, ct)
    return jnp().where(xx <= cast(threshold, ct), cast(value, ct), xx)


@lower(aten.threshold_backward.default)
def threshold_backward(g, x, threshold):
    ct = opmath(tdtype(g))
    gg = cast(g, ct)
    xt = opmath(tdtype(x))
    xx = cast(x, xt)
    return jnp().where(xx <= cast(threshold, xt), jnp().zeros_like(gg), gg)


# ============================================================ embedding


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(g, indices, num_weights, padding_idx, scale_grad_by_freq):
    j = jnp()
    ct = _ct(g)
    d = g.shape[-1]
    gg = cast(g, ct).reshape(indices.size, d)
    idx = indices.reshape(indices.size).astype(j.int64)
    if padding_idx >= 0:
        gg = j.where((idx == padding_idx)[:, None], j.zeros_like(gg), gg)
    if scale_grad_by_freq:
        counts = j.zeros((num_weights,), npdt(ct)).at[idx].add(1)
        gg = gg / counts[idx][:, None]
    return j.zeros((num_weights, d), npdt(ct)).at[idx].add(gg)


# ============================================================ losses


def _nll_core(x, target, weight, ignore_index, c_axis):
    """Per-element (-x[target] * w, w); NaN loss for an out-of-range target."""
    j = jnp()
    ct = _ct(x)
    xx = cast(x, ct)
    nc = x.shape[c_axis]
    t = target.astype(j.int64)
    ignore = t == ignore_index
    bad = (~ignore) & ((t < 0) | (t >= nc))
    safe = j.where(ignore | bad, 0, t)
    picked = j.take_along_axis(xx, j.expand_dims(safe, c_axis), axis=c_axis)
    picked = j.squeeze(picked, c_axis)
    w = cast(weight, ct)[safe] if weight is not None else j.ones(safe.shape, npdt(ct))
    w = j.where(ignore, j.zeros_like(w), w)
    w = j.where(bad, j.nan, w)
    return -picked * w, w


def _nll_forward(x, target, weight, reduction, ignore_index, c_axis):
    j = jnp()
    t = target.astype(j.int64)
    nc = x.shape[c_axis]
    # CPU raises IndexError "Target N is out of bounds."; CUDA a device-side assert
    _checks.check((t != ignore_index) & ((t < 0) | (t >= nc)), IndexError,
                  f"Target is out of bounds (a class index outside [0, {nc}) that is not "
                  f"ignore_index={ignore_index})")
    loss, w = _nll_core(x, target, weight, ignore_index, c_axis)
    if reduction == 0:
        return loss, j.zeros((), loss.dtype)
    tw = j.sum(w)
    s = j.sum(loss)
    if reduction == 1:
        return s / tw, tw
    return s, tw


@lower(aten.nll_loss_forward.default)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    return _nll_forward(x, target, weight, reduction, ignore_index, x.ndim - 1 if x.ndim == 1 else 1)


@lower(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(x, target, weight, reduction, ignore_index):
    return _nll_forward(x, target, weight, reduction, ignore_index, 1)


def _nll_backward(g, x, target, weight, reduction, ignore_index, total_weight, c_axis):
    j = jnp()
    ct = _ct(x)
    _, w = _nll_core(x, target, weight, ignore_index, c_axis)
    gg = cast(g, ct)
    if reduction == 1:
        gg = gg / cast(total_weight, ct)
    t = target.astype(j.int64)
    safe = j.where((t < 0) | (t >= x.shape[c_axis]), 0, t)
    onehot = j.expand_dims(safe, c_axis) == lax().broadcasted_iota(
        j.int64, x.shape, c_axis)
    # an ignored element's gradient is +0, as CPU's kernel (which skips it): not
    # -0 * g / total_weight, which is NaN when every element is ignored (total_weight 0)
    val = j.where(t == ignore_index, j.zeros((), npdt(ct)), -w * gg)
    return j.where(onehot, j.expand_dims(val, c_axis), j.zeros((), npdt(ct)))


@lower(aten.nll_loss_backward.default)
def nll_loss_backward(g, x, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(g, x, target, weight, reduction, ignore_index, total_weight,
                         x.ndim - 1 if x.ndim == 1 else 1)


@lower(aten.nll_loss2d_backward.default)
def nll_loss2d_backward(g, x, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(g, x, target, weight, reduction, ignore_index, total_weight, 1)


def _reduce(loss, reduction):
    if reduction == 0:
        return loss
    if reduction == 1:
        return jnp().mean(loss)
    return jnp().sum(loss)


def _margin_reduce(row_sums, C, n, reduction, ndim):
    """The margin losses' reduction, as CPU's kernels: each row's sum divided by the
    class count ``C``, then ``none`` (a 0-d result for a vector input), ``mean`` over the
    ``n`` rows or ``sum``.  Divisions exactly rounded (``ieee_div``)."""
    j = jnp()
    per_row = ieee_div(row_sums, j.asarray(C, row_sums.dtype))
    if reduction == 0:
        return per_row if ndim == 2 else per_row.reshape(())
    if reduction == 1:
        return ieee_div(j.sum(per_row), j.asarray(n, row_sums.dtype))
    return j.sum(per_row)


def _multilabel_margin_parts(x, target):
    """For ``multilabel_margin_loss`` on rows (N, C) (a vector is one row, a 0-d input one
    row of one class): ``(z, m, is_target, onehot, N, C)`` with ``z[n, j, c] = 1 -
    x[n, y_j] + x[n, c]`` for label slot ``j`` (the labels of a row are its target entries
    before the first -1), ``m`` where that term counts (``j`` a label slot, ``c`` not a
    label), ``onehot[n, j, c]`` = slot ``j`` is label ``c``."""
    j = jnp()
    ct = _ct(x)
    C = x.shape[-1] if x.ndim else 1
    xx = cast(x, ct).reshape(-1, C)
    t = target.astype(j.int64).reshape(-1, C)
    idx = lax().broadcasted_iota(j.int64, t.shape, 1)
    end = j.min(j.where(t == -1, idx, C), axis=1, keepdims=True)
    valid = idx < end
    _checks.check(valid & ((t < 0) | (t >= C)), RuntimeError,
                  "multilabel_margin_loss: target index is out of bounds")
    tsafe = j.where(valid, t, 0)
    onehot = (tsafe[:, :, None] == idx[:, None, :]) & valid[:, :, None]
    is_target = j.any(onehot, axis=1)
    xt = j.take_along_axis(xx, tsafe, axis=1)
    z = 1 - xt[:, :, None] + xx[:, None, :]
    m = valid[:, :, None] & ~is_target[:, None, :]
    return z, m, is_target, onehot, xx.shape[0], C


def _multilabel_margin_meta(x, target, reduction):
    # CPU's shapes: a vector (or 0-d) input with reduction 'none' gives a scalar (PyTorch's
    # meta kernel, from the torch._decomp version, says (1,))
    n = x.shape[0] if x.dim() == 2 else 1
    shape = (n,) if reduction == 0 and x.dim() == 2 else ()
    return x.new_empty(shape), x.new_empty(target.shape)


@lower(aten.multilabel_margin_loss_forward.default, meta=_multilabel_margin_meta)
def multilabel_margin_loss_forward(x, target, reduction):
    """(loss, is_target) as CPU's kernel: per row, the sum over its labels ``y_j`` (target
    entries before the first -1) and non-label classes ``c`` of ``max(0, 1 - x[y_j] +
    x[c])``, divided by C; ``none`` gives (N,), a scalar for a vector input.  PyTorch's
    ``torch._decomp`` version (used before this lowering) also summed the label slots
    after the first -1, and gave shape (1,) for a vector with ``none`` (so does PyTorch's
    meta kernel, hence :func:`_multilabel_margin_meta`; ``torch.compile`` graphs keep
    the meta kernel's shape)."""
    j = jnp()
    z, m, is_target, _, n, C = _multilabel_margin_parts(x, target)
    per_row = j.sum(j.where(m & (z > 0), z, j.zeros((), z.dtype)), axis=(1, 2))
    loss = _margin_reduce(per_row, C, n, reduction, x.ndim)
    return loss.astype(x.dtype), is_target.reshape(target.shape).astype(x.dtype)


@lower(aten.multilabel_margin_loss_backward.default,
       meta=lambda g, x, target, reduction, is_target: x.new_empty(x.shape))
def multilabel_margin_loss_backward(g, x, target, reduction, is_target):
    """Gradient of :func:`multilabel_margin_loss_forward` with respect to ``x``: each
    counted positive term adds ``g_n / C`` at its class ``c`` and subtracts it at its
    label ``y_j`` (``g_n / N`` for ``mean``)."""
    j = jnp()
    z, m, _, onehot, n, C = _multilabel_margin_parts(x, target)
    gz = j.where(m & (z > 0), j.ones((), z.dtype), j.zeros((), z.dtype)) / C
    gg = cast(g, _ct(x))
    if reduction == 0:
        gn = gg.reshape(-1)[:, None]
    else:
        gn = (gg / n if reduction == 1 else gg).reshape(1, 1)
    d = j.sum(gz, axis=1) - j.sum(j.sum(gz, axis=2)[:, :, None] * onehot, axis=1)
    return (d * gn).reshape(x.shape).astype(x.dtype)


def _multi_margin_parts(x, target, margin):
    """``multi_margin_loss`` on rows (N, C) (a vector is one row): ``(z, on, is_y, ts, n,
    C, ct)`` with ``z[n, c] = margin - x[n, y_n] + x[n, c]``, ``on`` where it counts
    (``z > 0``, ``c != y_n``), ``is_y`` the target column."""
    j = jnp()
    ct = _ct(x)
    C = x.shape[-1] if x.ndim else 1
    xx = cast(x, ct).reshape(-1, C)
    t = target.astype(j.int64).reshape(-1)
    _checks.check((t < 0) | (t >= C), RuntimeError, "target out of range")
    ts = j.clip(t, 0, C - 1)
    xy = j.take_along_axis(xx, ts[:, None], axis=1)
    z = margin - xy + xx
    is_y = lax().broadcasted_iota(j.int64, xx.shape, 1) == ts[:, None]
    return z, (z > 0) & ~is_y, is_y, ts, xx.shape[0], C, ct


def _multi_margin_meta(x, target, p, margin, weight=None, reduction=1):
    # CPU's shape: a vector input with reduction 'none' gives a scalar (PyTorch's meta
    # kernel says (1,))
    return x.new_empty((x.shape[0],) if reduction == 0 and x.dim() == 2 else ())


@lower(aten.multi_margin_loss.default, static_scalars=True, meta=_multi_margin_meta)
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    """CPU's ``multi_margin_loss``: per row, ``sum over c != y of max(0, margin - x[y] +
    x[c])^p * weight[y] / C``; ``none`` gives (N,), a scalar for a vector input (PyTorch's
    decomposition and meta kernel: (1,); ``torch.compile`` graphs keep that)."""
    j = jnp()
    if p not in (1, 2):
        raise RuntimeError("only p == 1 and p == 2 supported")
    z, on, _, ts, n, C, ct = _multi_margin_parts(x, target, margin)
    zero = j.zeros((), npdt(ct))
    term = j.where(on, z if p == 1 else z * z, zero)
    if weight is not None:
        term = term * cast(weight, ct)[ts][:, None]
    return _margin_reduce(j.sum(term, axis=1), C, n, reduction, x.ndim).astype(x.dtype)


@lower(aten.multi_margin_loss_backward.default, static_scalars=True,
       meta=lambda g, x, target, p, margin, weight=None, reduction=1: x.new_empty(x.shape))
def multi_margin_loss_backward(g, x, target, p, margin, weight=None, reduction=1):
    """Gradient of ``multi_margin_loss`` with respect to ``x`` (rows (N, C); a vector is
    one row), as CPU's kernel: for class ``c != y`` with ``z = margin - x[y] + x[c] > 0``,
    ``h = 1`` (``p == 1``) or ``2 z`` (``p == 2``), times ``weight[y]``, over C (and N for
    ``mean``); ``+h`` at ``c``, ``-h`` summed at ``y``; times the row's ``grad_output``."""
    j = jnp()
    z, on, is_y, ts, n, C, ct = _multi_margin_parts(x, target, margin)
    h = j.where(on, j.ones((), npdt(ct)) if p == 1 else 2 * z, j.zeros((), npdt(ct)))
    h = h / (n * C if reduction == 1 else C)
    if weight is not None:
        h = h * cast(weight, ct)[ts][:, None]
    gi = h - j.where(is_y, j.sum(h, axis=1, keepdims=True), j.zeros((), npdt(ct)))
    gg = cast(g, ct)
    gi = gi * (gg.reshape(-1)[:, None] if reduction == 0 else gg.reshape(1, 1))
    return gi.reshape(x.shape).astype(x.dtype)


@lower(aten.mse_loss.default)
def mse_loss(x, target, reduction=1):
    ct = _ct(x)
    d = cast(x, ct) - cast(target, ct)
    return _reduce(d * d, reduction)


@lower(aten.mse_loss_backward.default)
def mse_loss_backward(g, x, target, reduction):
    ct = _ct(x)
    d = cast(x, ct) - cast(target, ct)
    gg = cast(g, ct)
    if reduction == 1:
        gg = gg / x.size
    return 2 * d * gg


@lower(aten.binary_cross_entropy.default)
def binary_cross_entropy(x, target, weight=None, reduction=1):
    j = jnp()
    ct = _ct(x)
    xx, t = cast(x, ct), cast(target, ct)
    _checks.check(~((xx >= 0) & (xx <= 1)), RuntimeError,
                  "all elements of input should be between 0 and 1")
    lx = j.maximum(j.log(xx), -100)
    l1x = j.maximum(j.log1p(-xx), -100)
    loss = -((t * lx) + (1 - t) * l1x)
    if weight is not None:
        loss = loss * cast(weight, ct)
    return _reduce(loss, reduction)


@lower(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(g, x, target, weight=None, reduction=1):
    j = jnp()
    ct = _ct(x)
    xx, t, gg = cast(x, ct), cast(target, ct), cast(g, ct)
    gi = gg * (xx - t) / j.maximum((1 - xx) * xx, 1e-12)
    if weight is not None:
        gi = gi * cast(weight, ct)
    if reduction == 1:
        gi = gi / x.size
    return gi


# ============================================================ upsampling


def _np_ct(x):
    return np.float64 if x.dtype == np.float64 else np.float32


def _nearest_index(n_in, n_out, scale, ft):
    o = np.arange(n_out)
    if n_out == n_in:
        return o
    if n_out == 2 * n_in:
        return o >> 1
    sc = ft(1.0 / scale) if scale is not None and scale > 0 else ft(n_in) / ft(n_out)
    src = np.floor((o.astype(ft) * sc).astype(ft)).astype(np.int64)
    return np.minimum(src, n_in - 1)


def _upsample_nearest(x, output_size, scales):
    nd = len(output_size)
    ft = np.float32
    y = x
    for i in range(nd):
        ax = x.ndim - nd + i
        idx = _nearest_index(x.shape[ax], output_size[i], scales[i], ft)
        y = jnp().take(y, jnp().asarray(idx), axis=ax)
    return y


def _linear_weights(n_in, n_out, align_corners, scale, ft):
    o = np.arange(n_out).astype(ft)
    if align_corners:
        sc = ft((n_in - 1) / (n_out - 1)) if n_out > 1 else ft(0)
        src = (sc * o).astype(ft)
    else:
        sc = ft(1.0 / scale) if scale is not None and scale > 0 else ft(ft(n_in) / ft(n_out))
        src = np.maximum((sc * (o + ft(0.5)) - ft(0.5)).astype(ft), ft(0))
    i0 = np.floor(src).astype(np.int64)
    i0 = np.minimum(i0, n_in - 1)
    i1 = i0 + (i0 < n_in - 1).astype(np.int64)
    l1 = (src - i0.astype(ft)).astype(ft)
    l0 = (ft(1) - l1).astype(ft)
    return i0, i1, l0, l1


def _upsample_linear(x, output_size, align_corners, scales):
    nd = len(output_size)
    ft = _np_ct(x)
    y = x
    # last dim first: PyTorch computes h0l * (w0l * x00 + w1l * x01) + h1l * (...)
    for i in reversed(range(nd)):
        ax = x.ndim - nd + i
        i0, i1, l0, l1 = _linear_weights(x.shape[ax], output_size[i], align_corners, scales[i], ft)
        shape = [1] * x.ndim
        shape[ax] = -1
        a = jnp().take(y, jnp().asarray(i0), axis=ax)
        b = jnp().take(y, jnp().asarray(i1), axis=ax)
        y = jnp().asarray(l0).reshape(shape) * a + jnp().asarray(l1).reshape(shape) * b
    return y


@lower(aten.upsample_nearest2d.default)
def upsample_nearest2d(x, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(x, tuple(output_size), (scales_h, scales_w))


@lower(aten.upsample_nearest2d_backward.default)
def upsample_nearest2d_backward(g, output_size, input_size, scales_h=None, scales_w=None):
    return _resize_vjp(lambda a: _upsample_nearest(a, tuple(output_size), (scales_h, scales_w)),
                       g, input_size)


@lower(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_linear(_f(x), tuple(output_size), align_corners, (scales_h, scales_w))


@lower(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(g, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None):
    return _resize_vjp(
        lambda a: _upsample_linear(a, tuple(output_size), align_corners, (scales_h, scales_w)),
        g, input_size)



@lower(aten.softshrink.default)
def softshrink(x, lambd=0.5):
    xx = _f(x)
    lam = cast(lambd, _ct(x))
    j = jnp()
    # PyTorch: x > l ? x - l : (x < -l ? x + l : x * 0)   (NaN stays NaN)
    return j.where(xx > lam, xx - lam, j.where(xx < -lam, xx + lam, xx * 0))


def _lambd_as_x(lambd, x):
    """CPU's ``lambd.to<scalar_t>()``: ``lambd`` rounded to ``x``'s dtype (float16/bfloat16:
    ``hardshrink(0.3)`` zeroes a bfloat16 0.30078125), then widened to the op-math type."""
    return round_to(cast(lambd, _ct(x)), tdtype(x))


@lower(aten.hardshrink.default, prepare=fits(1))
def hardshrink(x, lambd=0.5):
    """CPU's kernel: 0 where ``-lambd <= x <= lambd``, ``lambd`` in ``x``'s dtype."""
    xx = _f(x)
    lam = _lambd_as_x(lambd, x)
    j = jnp()
    return j.where((xx >= -lam) & (xx <= lam), j.zeros_like(xx), xx)


@lower(aten.softshrink_backward.default, aten.hardshrink_backward.default)
def shrink_backward(grad_out, x, lambd=0.5):
    """Both shrinks' gradient, as CPU's kernels: 0 where ``-lambd <= x <= lambd``, else
    ``grad_out`` (NaN inputs pass the gradient through); ``lambd`` in ``x``'s dtype
    (``lambd.to<scalar_t>()``)."""
    xx = _f(x)
    lam = _lambd_as_x(lambd, x)
    j = jnp()
    return j.where((xx >= -lam) & (xx <= lam), j.zeros_like(grad_out), grad_out)


@lower(aten.huber_loss.default)
def huber_loss(x, target, reduction=1, delta=1.0):
    ct = _ct(x)
    j = jnp()
    z = j.abs(cast(x, ct) - cast(target, ct))
    d = j.asarray(delta, npdt(ct))
    loss = j.where(z < d, 0.5 * z * z, d * (z - 0.5 * d))
    if reduction == 1:
        return j.mean(loss)
    if reduction == 2:
        return j.sum(loss)
    return loss


@lower(aten.channel_shuffle.default, aten.native_channel_shuffle.default)
def channel_shuffle(x, groups):
    j = jnp()
    n, c = x.shape[0], x.shape[1]
    rest = x.shape[2:]
    y = x.reshape((n, groups, c // groups) + rest)
    return j.swapaxes(y, 1, 2).reshape(x.shape)


@lower(aten.renorm.default, static_scalars=True)
def renorm(x, p, dim, maxnorm):
    """Each slice along ``dim`` whose p-norm exceeds ``maxnorm`` is scaled to it
    (``maxnorm / (norm + 1e-7)``, PyTorch's factor)."""
    from torchtpu.ops.reduction import linalg_vector_norm

    j = jnp()
    ct = _ct(x)
    d = dim % max(x.ndim, 1)
    dims = [i for i in range(x.ndim) if i != d]
    nrm = linalg_vector_norm(cast(x, ct), p, dims, True, None)
    mx = j.asarray(maxnorm, npdt(ct))
    factor = j.where(nrm > mx, mx / (nrm + 1e-7), j.ones_like(nrm))
    return cast(x, ct) * factor


# ------------------------------------------------ padding / pooling backward (issue 8)


def _pad_source(n, left, right, mode):
    """Input index each output position of a reflect/replicate pad copies (one dim)."""
    i = np.arange(-left, n + right)
    if mode == "replicate":
        return np.clip(i, 0, n - 1)
    i = np.abs(i)
    return np.where(i > n - 1, 2 * (n - 1) - i, i)


def _pad_backward(g, x, padding, mode):
    """Gradient of a reflect/replicate pad: each input element sums the gradients of the
    output positions that copy it, in row-major output order with a rounding after each
    add in the tensor's dtype — CPU's ``cpu_padding_backward`` loop, so half types match
    it bit for bit."""
    j = jnp()
    nd = len(padding) // 2
    lead = x.shape[:x.ndim - nd]
    sp = x.shape[x.ndim - nd:]
    src = None
    for d in range(nd):
        left, right = padding[2 * (nd - 1 - d)], padding[2 * (nd - 1 - d) + 1]
        s_d = _pad_source(sp[d], left, right, mode)
        stride = int(np.prod(sp[d + 1:], dtype=np.int64))
        src = s_d * stride if src is None else np.add.outer(src, s_d * stride)
    src = np.asarray(src).reshape(-1)          # input flat index of each output position
    n_in = int(np.prod(sp, dtype=np.int64))
    order = np.argsort(src, kind="stable")     # outputs grouped by input, ascending
    counts = np.bincount(src, minlength=n_in)
    K = int(counts.max()) if counts.size else 0
    n_out = src.size
    table = np.full((n_in, max(K, 1)), n_out, np.int64)   # n_out: a zero gradient
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for k in range(K):
        has = counts > k
        table[has, k] = order[starts[has] + k]
    gg = g.reshape(lead + (n_out,))
    gg = j.concatenate([gg, j.zeros(lead + (1,), g.dtype)], axis=-1)
    ct = npdt(_ct(x))
    acc = j.zeros(lead + (n_in,), g.dtype)
    for k in range(K):
        acc = (acc.astype(ct) + j.take(gg, j.asarray(table[:, k]), axis=-1).astype(ct)
               ).astype(g.dtype)
    return acc.reshape(x.shape)


@lower(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
       aten.replication_pad3d_backward.default)
def replication_pad_backward(g, x, padding):
    """Gradient of ``F.pad(x, padding, mode="replicate")`` (negative padding crops)."""
    return _pad_backward(g, x, padding, "replicate")


@lower(aten.reflection_pad1d_backward.default, aten.reflection_pad2d_backward.default,
       aten.reflection_pad3d_backward.default)
def reflection_pad_backward(g, x, padding):
    """Gradient of ``F.pad(x, padding, mode="reflect")``."""
    return _pad_backward(g, x, padding, "reflect")


@lower(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(g, x, indices):
    """Gradient of ``adaptive_max_pool2d``: ``g`` added at the argmax ``indices``."""
    return _max_pool_backward(g, x, 2, indices)


@lower(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(g, x, indices):
    """Gradient of ``adaptive_max_pool3d``: ``g`` added at the argmax ``indices``."""
    return _max_pool_backward(g, x, 3, indices)


# ------------------------------------------------------------------ CTC loss (issue 8)


def _ctc_padded_targets(targets, target_lengths):
    """(N, Lmax) int targets of each batch element (from the padded 2-D or the
    concatenated 1-D layout) and the static lengths; padding positions hold index 0."""
    j = jnp()
    lens = [int(v) for v in target_lengths]
    lmax = max(lens) if lens else 0
    if targets.ndim == 2:
        idx = np.array([[min(k, max(targets.shape[1] - 1, 0)) for k in range(lmax)]
                        for _ in lens], np.int64).reshape(len(lens), lmax)
        rows = j.asarray(np.arange(len(lens))[:, None])
        padded = targets[rows, j.asarray(idx)] if lmax and targets.shape[1] else \
            j.zeros((len(lens), lmax), targets.dtype)
    else:
        offs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        idx = np.array([[min(o + k, max(targets.shape[0] - 1, 0)) for k in range(lmax)]
                        for o in offs], np.int64).reshape(len(lens), lmax)
        padded = j.take(targets, j.asarray(idx)) if lmax and targets.shape[0] else \
            j.zeros((len(lens), lmax), targets.dtype)
    return padded.astype(npdt(torch.int64)), lens, lmax


def _ctc_lse(*xs):
    """log(sum(exp(xs))) as CPU's CTC kernel: max-shifted, -inf when all are -inf, with
    zero (not NaN) gradients through the -inf case."""
    j = jnp()
    lax_ = lax()
    m = xs[0]
    for x in xs[1:]:
        m = j.maximum(m, x)
    m = lax_.stop_gradient(j.where(j.isneginf(m), 0, m))
    s = sum(j.exp(x - m) for x in xs)
    pos = s > 0
    return j.where(pos, j.log(j.where(pos, s, 1)) + m, -j.inf)


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank):
    """Negative log-likelihood (N,) and log_alpha (N, T, 2*Lmax+1) of CTC in log space
    (a ``lax.scan`` of the alpha recursion over time; steps past an element's input
    length keep its alpha)."""
    j = jnp()
    lax_ = lax()
    lp = log_probs if log_probs.ndim == 3 else log_probs[:, None, :]
    T, N, C = lp.shape
    tg, lens, lmax = _ctc_padded_targets(targets, target_lengths)
    S = 2 * lmax + 1
    s_idx = np.arange(S)
    # extended labels: blank at even positions, targets at odd ones
    ext = j.where(j.asarray(s_idx % 2 == 0)[None, :], blank,
                  j.take(tg, j.asarray(np.maximum(s_idx - 1, 0) // 2), axis=1)
                  if lmax else blank)
    ext = j.broadcast_to(ext, (N, S)).astype(npdt(torch.int64))
    ext_m2 = j.concatenate([j.full((N, 2), -1, ext.dtype), ext[:, :-2]], axis=1) if S > 2 \
        else j.full((N, S), -1, ext.dtype)
    skip_ok = (ext != blank) & (ext != ext_m2) & j.asarray(s_idx >= 2)[None, :]
    valid_s = j.asarray(s_idx[None, :] < 2 * np.asarray(lens)[:, None] + 1)
    neg = j.asarray(-j.inf, lp.dtype)
    emit = j.take_along_axis(lp, j.broadcast_to(ext[None], (T, N, S)), axis=2)  # (T, N, S)
    a0 = j.where(j.asarray(s_idx < 2)[None, :] & valid_s, emit[0], neg)
    tin = j.asarray(np.asarray([int(v) for v in input_lengths]))

    def step(alpha, inp):
        t, e = inp
        a1 = j.concatenate([j.full((N, 1), neg), alpha[:, :-1]], axis=1)
        a2 = j.concatenate([j.full((N, 2), neg), alpha[:, :-2]], axis=1)[:, :S]
        a2 = j.where(skip_ok, a2, neg)
        new = j.where(valid_s, _ctc_lse(alpha, a1, a2) + e, neg)
        new = j.where((t < tin)[:, None], new, alpha)
        return new, new

    alpha_T, alphas = lax_.scan(step, a0, (j.arange(1, T), emit[1:]))
    log_alpha = j.concatenate([a0[None], alphas], axis=0)  # (T, N, S)
    last = j.asarray(2 * np.asarray(lens))
    end1 = j.take_along_axis(alpha_T, last[:, None], axis=1)[:, 0]
    end2 = j.take_along_axis(alpha_T, j.maximum(last - 1, 0)[:, None], axis=1)[:, 0]
    end2 = j.where(last > 0, end2, neg)
    nll = -_ctc_lse(end1, end2)
    nll = j.where(tin > 0, nll, j.where(last > 0, j.inf, 0.0))
    return nll, j.transpose(log_alpha, (1, 0, 2))


def _ctc_ct(log_probs):
    dt = tdtype(log_probs)
    if dt not in (torch.float32, torch.float64):
        raise RuntimeError(f'"ctc_loss_cpu" not implemented for \'{dt}\''.replace(
            "torch.float16", "Half").replace("torch.bfloat16", "BFloat16"))
    return dt


@lower(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """CTC loss per batch element: (neg_log_likelihood (N,), log_alpha (N, T, 2*Lmax+1)),
    as CPU's ``_ctc_loss`` (targets padded (N, S) or concatenated (sum(target_lengths),);
    the ``zero_infinity`` zeroing and the reductions happen in ``ctc_loss`` above)."""
    _ctc_ct(log_probs)
    return _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank)


@lower(aten._ctc_loss_backward.default)
def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths,
                       neg_log_likelihood, log_alpha, blank, zero_infinity=False):
    """Gradient of :func:`_ctc_loss` w.r.t. ``log_probs`` as CPU computes it:
    ``(exp(lp) - exp(log(alpha*beta) + nll - lp)) * grad`` for ``t < input_length``
    (the gradient through a ``log_softmax`` input, PyTorch's convention), 0 after; 0 for an
    infinite loss under ``zero_infinity``, NaN for one without.  The alpha-beta term is
    the derivative of the forward recursion (``jax.vjp``)."""
    jax = _jax()
    j = jnp()
    _ctc_ct(log_probs)
    T, N = log_probs.shape[0], (log_probs.shape[1] if log_probs.ndim == 3 else 1)
    _, vjp = jax.vjp(lambda lp: _ctc_forward(lp, targets, input_lengths, target_lengths,
                                             blank)[0], log_probs)
    g = grad.reshape(N) if grad.ndim else j.broadcast_to(grad, (N,))
    dnll = vjp(j.ones((N,), log_probs.dtype))[0]  # = -exp(lcab + nll - lp)
    lp3 = log_probs if log_probs.ndim == 3 else log_probs[:, None, :]
    d3 = dnll if dnll.ndim == 3 else dnll[:, None, :]
    tin = j.asarray(np.asarray([int(v) for v in input_lengths]))
    active = (j.arange(T)[:, None] < tin[None, :])[:, :, None]
    res = j.where(active, (j.exp(lp3) + d3) * g[None, :, None], 0)
    inf = j.isinf(neg_log_likelihood.reshape(N))[None, :, None]
    res = j.where(inf & active, 0.0 if zero_infinity else j.nan, res)
    return res.reshape(log_probs.shape)


def _ctc_backward_meta(grad, log_probs, *args, **kwargs):
    return torch.empty_like(log_probs)


_ATEN_IMPL.impl("_ctc_loss_backward", _ctc_backward_meta, "Meta")


def _lengths_list(v):
    return [int(i) for i in v.tolist()] if isinstance(v, torch.Tensor) else list(v)


@decomp(aten._ctc_loss.Tensor)
def _ctc_loss_tensor(log_probs, targets, input_lengths, target_lengths, blank=0,
                     zero_infinity=False):
    """``_ctc_loss`` with length tensors: read them on the host (a sync point, as CPU's
    kernel reads them) and run the int-list overload."""
    return aten._ctc_loss.default(log_probs, targets, _lengths_list(input_lengths),
                                  _lengths_list(target_lengths), blank, zero_infinity)


@decomp(aten._ctc_loss_backward.Tensor)
def _ctc_loss_backward_tensor(grad, log_probs, targets, input_lengths, target_lengths,
                              neg_log_likelihood, log_alpha, blank, zero_infinity=False):
    """``_ctc_loss_backward`` with length tensors (read on the host, as CPU does)."""
    return aten._ctc_loss_backward.default(
        grad, log_probs, targets, _lengths_list(input_lengths), _lengths_list(target_lengths),
        neg_log_likelihood, log_alpha, blank, zero_infinity)


# ------------------------------------------------- antialiased bilinear resize (issue 8)


def _aa_scale(n_in, n_out, align_corners, scale):
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n_in / n_out


def _aa_weights(n_in, n_out, align_corners, scale, ft):
    """(n_out, n_in) weights of PyTorch's antialiased linear resampling along one dim
    (``_compute_indices_min_size_weights_aa``: a triangle filter widened by the
    downscale factor, each row normalized to sum 1), computed in ``ft`` as CPU does."""
    sc = ft(_aa_scale(n_in, n_out, align_corners, scale))
    support = sc if sc >= 1.0 else ft(1.0)
    invscale = ft(1.0) / sc if sc >= 1.0 else ft(1.0)
    max_size = int(math.ceil(support)) * 2 + 1
    W = np.zeros((n_out, n_in), ft)
    for i in range(n_out):
        center = ft(sc * ft(i + 0.5))
        xmin = max(int(center - support + ft(0.5)), 0)
        xsize = min(int(center + support + ft(0.5)), n_in) - xmin
        xsize = min(max(xsize, 0), max_size)
        w = np.array([max(ft(1.0) - abs(ft((ft(j + xmin) - center + ft(0.5)) * invscale)), ft(0))
                      for j in range(xsize)], ft)
        total = ft(w.sum(dtype=ft)) if xsize else ft(0)
        if total != 0:
            w = (w / total).astype(ft)
        W[i, xmin:xmin + xsize] = w
    return W


def _upsample_aa(x, output_size, align_corners, scales):
    """Separable antialiased bilinear resize of the last two dims (width first, then
    height; a dim whose size does not change is left as is, as CPU's kernel)."""
    j = jnp()
    ft = _np_ct(x)
    y = x
    for i in reversed(range(2)):
        ax = x.ndim - 2 + i
        n_in, n_out = x.shape[ax], output_size[i]
        if n_in == n_out and scales[i] in (None, 1.0) and not (align_corners and n_out == 1):
            continue
        W = j.asarray(_aa_weights(n_in, n_out, align_corners, scales[i], ft))
        y = j.moveaxis(j.tensordot(y, W, axes=([ax], [1]), precision=highest()), -1, ax)
    return y


@lower(aten._upsample_bilinear2d_aa.default)
def _upsample_bilinear2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    """``F.interpolate(x, mode="bilinear", antialias=True)`` on (N, C, H, W); half types
    compute in float32."""
    return _upsample_aa(_f(x), tuple(output_size), align_corners, (scales_h, scales_w))


@lower(aten._upsample_bilinear2d_aa_backward.default)
def _upsample_bilinear2d_aa_backward(g, output_size, input_size, align_corners, scales_h=None,
                                     scales_w=None):
    """Gradient of :func:`_upsample_bilinear2d_aa` (the transposed resampling)."""
    return _resize_vjp(
        lambda a: _upsample_aa(a, tuple(output_size), align_corners, (scales_h, scales_w)),
        g, input_size)


# ------------------------------------------------ upsampling backward, 1-D/3-D (issue 8)


def _nearest_exact_index(n_in, n_out, scale, ft):
    """Source index of ``nearest-exact``: ``min(floor((o + 0.5) * scale), n_in - 1)``."""
    o = np.arange(n_out)
    sc = ft(1.0 / scale) if scale is not None and scale > 0 else ft(n_in) / ft(n_out)
    src = np.floor(((o.astype(ft) + ft(0.5)) * sc).astype(ft)).astype(np.int64)
    return np.minimum(src, n_in - 1)


def _upsample_nearest_exact(x, output_size, scales):
    y = x
    for i in range(len(output_size)):
        ax = x.ndim - len(output_size) + i
        idx = _nearest_exact_index(x.shape[ax], output_size[i], scales[i], np.float32)
        y = jnp().take(y, jnp().asarray(idx), axis=ax)
    return y


def _cubic_weights(t, A=-0.75):
    """PyTorch's cubic convolution coefficients of the 4 taps around a source point."""
    def c1(x):
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def c2(x):
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A

    return [c2(t + 1), c1(t), c1(1 - t), c2(2 - t)]


def _upsample_bicubic(x, output_size, align_corners, scales):
    """Bicubic resize of the last two dims as PyTorch's kernel (A = -0.75, taps clamped
    to the border); width then height."""
    j = jnp()
    ft = _np_ct(x)
    y = x
    for i in reversed(range(2)):
        ax = x.ndim - 2 + i
        n_in, n_out = x.shape[ax], output_size[i]
        o = np.arange(n_out).astype(ft)
        if align_corners:
            sc = ft((n_in - 1) / (n_out - 1)) if n_out > 1 else ft(0)
            src = (sc * o).astype(ft)
        else:
            sc = ft(1.0 / scales[i]) if scales[i] is not None and scales[i] > 0 else \
                ft(ft(n_in) / ft(n_out))
            src = (sc * (o + ft(0.5)) - ft(0.5)).astype(ft)
        i0 = np.floor(src).astype(np.int64)
        t = (src - i0.astype(ft)).astype(ft)
        ws = _cubic_weights(t)
        shape = [1] * x.ndim
        shape[ax] = -1
        acc = None
        for k in range(4):
            idx = np.clip(i0 - 1 + k, 0, n_in - 1)
            term = j.asarray(ws[k].astype(ft)).reshape(shape) * j.take(y, j.asarray(idx), axis=ax)
            acc = term if acc is None else acc + term
        y = acc
    return y


def _resize_vjp(f, g, input_size):
    """Gradient of the resampling ``f`` (linear in its input) for the output gradient
    ``g``, as the vjp at zeros of shape ``input_size``, in ``g``'s compute dtype."""
    ct = _ct(g)
    x0 = jnp().zeros(tuple(input_size), npdt(ct))
    _, vjp = _jax().vjp(f, x0)
    return vjp(cast(g, ct))[0]


@lower(aten.upsample_nearest1d_backward.default)
def upsample_nearest1d_backward(g, output_size, input_size, scales=None):
    """Gradient of ``upsample_nearest1d``: sums over the outputs copying each input."""
    return _resize_vjp(lambda a: _upsample_nearest(a, tuple(output_size), (scales,)), g,
                       input_size)


@lower(aten.upsample_nearest3d_backward.default)
def upsample_nearest3d_backward(g, output_size, input_size, scales_d=None, scales_h=None,
                                scales_w=None):
    """Gradient of ``upsample_nearest3d``."""
    return _resize_vjp(lambda a: _upsample_nearest(a, tuple(output_size),
                                                   (scales_d, scales_h, scales_w)), g, input_size)


@lower(aten._upsample_nearest_exact1d_backward.default)
def _upsample_nearest_exact1d_backward(g, output_size, input_size, scales=None):
    """Gradient of ``nearest-exact`` 1-D resizing."""
    return _resize_vjp(lambda a: _upsample_nearest_exact(a, tuple(output_size), (scales,)), g,
                       input_size)


@lower(aten._upsample_nearest_exact2d_backward.default)
def _upsample_nearest_exact2d_backward(g, output_size, input_size, scales_h=None, scales_w=None):
    """Gradient of ``nearest-exact`` 2-D resizing."""
    return _resize_vjp(lambda a: _upsample_nearest_exact(a, tuple(output_size),
                                                         (scales_h, scales_w)), g, input_size)


@lower(aten._upsample_nearest_exact3d_backward.default)
def _upsample_nearest_exact3d_backward(g, output_size, input_size, scales_d=None, scales_h=None,
                                       scales_w=None):
    """Gradient of ``nearest-exact`` 3-D resizing."""
    return _resize_vjp(lambda a: _upsample_nearest_exact(
        a, tuple(output_size), (scales_d, scales_h, scales_w)), g, input_size)


@lower(aten.upsample_linear1d_backward.default)
def upsample_linear1d_backward(g, output_size, input_size, align_corners, scales=None):
    """Gradient of ``upsample_linear1d``."""
    return _resize_vjp(lambda a: _upsample_linear(a, tuple(output_size), align_corners,
                                                  (scales,)), g, input_size)


@lower(aten.upsample_trilinear3d_backward.default)
def upsample_trilinear3d_backward(g, output_size, input_size, align_corners, scales_d=None,
                                  scales_h=None, scales_w=None):
    """Gradient of ``upsample_trilinear3d``."""
    return _resize_vjp(lambda a: _upsample_linear(a, tuple(output_size), align_corners,
                                                  (scales_d, scales_h, scales_w)), g, input_size)


@lower(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(g, output_size, input_size, align_corners, scales_h=None,
                                scales_w=None):
    """Gradient of ``upsample_bicubic2d``."""
    return _resize_vjp(lambda a: _upsample_bicubic(a, tuple(output_size), align_corners,
                                                   (scales_h, scales_w)), g, input_size)


# ------------------------------------------------------------ grid sampling (issue 8)


def _gs_unnormalize(c, size, align_corners):
    return (c + 1) / 2 * (size - 1) if align_corners else ((c + 1) * size - 1) / 2


def _gs_clip(c, size):
    """clip to [0, size-1] with CPU's gradient (0 at and beyond the limits)."""
    j = jnp()
    lim = size - 1
    return j.where(c <= 0, j.zeros_like(c), j.where(c >= lim, j.full_like(c, lim), c))


def _gs_reflect(c, twice_low, twice_high):
    j = jnp()
    if twice_low == twice_high:
        return j.zeros_like(c)
    mn = twice_low / 2
    span = (twice_high - twice_low) / 2
    c = c - mn
    c = j.where(c < 0, -c, c)
    extra = j.fmod(c, span)
    flips = j.floor(c / span)
    even = j.fmod(flips, 2) == 0
    return j.where(even, extra + mn, span - extra + mn)


def _gs_coords(c, size, padding_mode, align_corners):
    """PyTorch's ``compute_coordinates``: padding 0 zeros, 1 border, 2 reflection."""
    if padding_mode == 1:
        return _gs_clip(c, size)
    if padding_mode == 2:
        if align_corners:
            c = _gs_reflect(c, 0, 2 * (size - 1))
        else:
            c = _gs_reflect(c, -1, 2 * size - 1)
        return _gs_clip(c, size)
    return c


def _gs_gather(inp, idx, nd):
    """Values of ``inp`` (N, C, *S) at integer coords ``idx`` (list of nd arrays (N, *O)),
    zero outside: (N, C, *O)."""
    j = jnp()
    N, C = inp.shape[:2]
    sp = inp.shape[2:]
    ok = None
    flat = None
    for d in range(nd):
        i = idx[d]
        good = (i >= 0) & (i < sp[d])
        ok = good if ok is None else ok & good
        ic = j.clip(i, 0, sp[d] - 1).astype(npdt(torch.int64))
        flat = ic if flat is None else flat * sp[d] + ic
    osh = flat.shape[1:]
    vals = j.take_along_axis(inp.reshape(N, C, -1), flat.reshape(N, 1, -1), axis=2)
    vals = vals.reshape((N, C) + osh)
    return j.where(ok[:, None], vals, 0)


def _grid_sample(inp, grid, mode, padding_mode, align_corners):
    """``grid_sampler_2d/3d`` forward in JAX (bilinear 0, nearest 1, bicubic 2), computed
    as PyTorch's CPU kernels; differentiable w.r.t. input and grid with their gradients."""
    j = jnp()
    nd = inp.ndim - 2
    sp = inp.shape[2:]
    # grid's last dim is (x, y[, z]) for dims (W, H[, D])
    raw = [grid[..., nd - 1 - d] for d in range(nd)]
    if mode == 2:
        c = [_gs_unnormalize(raw[d], sp[d], align_corners) for d in range(nd)]
        f = [j.floor(v) for v in c]
        t = [v - fl for v, fl in zip(c, f)]
        wy, wx = _cubic_weights(t[0]), _cubic_weights(t[1])
        out = 0
        for a in range(4):
            for b in range(4):
                ty = _gs_coords(f[0] - 1 + a, sp[0], padding_mode, align_corners)
                tx = _gs_coords(f[1] - 1 + b, sp[1], padding_mode, align_corners)
                v = _gs_gather(inp, [ty.astype(npdt(torch.int64)), tx.astype(npdt(torch.int64))], 2)
                out = out + v * (wy[a] * wx[b])[:, None]
        return out
    c = [_gs_coords(_gs_unnormalize(raw[d], sp[d], align_corners), sp[d], padding_mode,
                    align_corners) for d in range(nd)]
    if mode == 1:
        return _gs_gather(inp, [j.round(v).astype(npdt(torch.int64)) for v in c], nd)
    lo = [j.floor(v) for v in c]
    out = 0
    for corner in itertools.product((0, 1), repeat=nd):
        w = 1
        idx = []
        for d in range(nd):
            hi = lo[d] + 1
            w = w * ((c[d] - lo[d]) if corner[d] else (hi - c[d]))
            idx.append((lo[d] + corner[d]).astype(npdt(torch.int64)))
        out = out + _gs_gather(inp, idx, nd) * w[:, None]
    return out


def _gs_float_only(op, inp):
    """CPU runs half-type grid sampling in the half type, one rounding per operation (and
    accumulates gradients in it); computing in float32 differs by more than bfloat16's
    tolerance (coordinates round to other pixels), so those cases are not supported."""
    dt = tdtype(inp)
    if dt in (torch.float16, torch.bfloat16):
        raise NotImplementedError(
            f"torchtpu: aten.{op} of a {dt} tensor is not supported on tpu (CPU computes it "
            f"with {dt} rounding at every step; float32/float64 are supported, or set "
            f"torch.tpu.enable_cpu_fallback = True)")


@lower(aten.grid_sampler_3d.default)
def grid_sampler_3d(inp, grid, interpolation_mode, padding_mode, align_corners):
    """``F.grid_sample`` on (N, C, D, H, W) with a (N, Do, Ho, Wo, 3) grid (bilinear or
    nearest), float32/float64."""
    if interpolation_mode == 2:
        raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")
    _gs_float_only("grid_sampler_3d", inp)
    ct = _ct(inp)
    return _grid_sample(cast(inp, ct), cast(grid, ct), interpolation_mode, padding_mode,
                        align_corners)


def _grid_sampler_backward(g, inp, grid, interpolation_mode, padding_mode, align_corners,
                           output_mask):
    _gs_float_only(f"grid_sampler_{inp.ndim - 2}d_backward", inp)
    ct = _ct(inp)
    _, vjp = _jax().vjp(lambda a, b: _grid_sample(a, b, interpolation_mode, padding_mode,
                                                  align_corners), cast(inp, ct), cast(grid, ct))
    gi, gg = vjp(cast(g, ct))
    return tuple(o if m else _empty() for o, m in zip((gi, gg), output_mask))


def grid_sampler_2d_backward(g, inp, grid, interpolation_mode, padding_mode, align_corners,
                             output_mask):
    """Gradients of ``grid_sampler_2d`` w.r.t. input and grid (``jax.vjp`` of the JAX
    forward; nearest gives a zero grid gradient, clipped coordinates a zero one, as CPU)."""
    return _grid_sampler_backward(g, inp, grid, interpolation_mode, padding_mode,
                                  align_corners, output_mask)


def grid_sampler_3d_backward(g, inp, grid, interpolation_mode, padding_mode, align_corners,
                             output_mask):
    """Gradients of ``grid_sampler_3d`` w.r.t. input and grid."""
    return _grid_sampler_backward(g, inp, grid, interpolation_mode, padding_mode,
                                  align_corners, output_mask)


_masked_op(aten.grid_sampler_2d_backward.default, grid_sampler_2d_backward)
_masked_op(aten.grid_sampler_3d_backward.default, grid_sampler_3d_backward)
