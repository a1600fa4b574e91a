"""Lowerings of torchvision's detection ops (``torch.ops.torchvision.*``): ``nms``,
``roi_align``, ``roi_pool``, ``ps_roi_align``, ``ps_roi_pool`` and ``deform_conv2d``,
each with its backward.

torchvision registers these ops with kernels for CPU and CUDA only; without lowerings a
``tpu`` tensor reaches them through the CPU fallback (a host round trip per call) or
raises ``NotImplementedError``.  This family is loaded when torchvision is imported
(:func:`torchtpu.ops.table` looks for it), so ``torchvision.ops.nms``,
``batched_nms`` (built on ``nms``), ``roi_align`` / ``MultiScaleRoIAlign`` (autograd
included: torchvision's own autograd function calls ``_roi_align_backward``),
``roi_pool`` and ``deform_conv2d`` / ``DeformConv2d`` (autograd through
``_deform_conv2d_backward``) run on the device.

Values follow torchvision's CPU kernels operation by operation (float32 and float64;
float16 computes in float32): the sampling points, the bilinear weights and the order of
the sums of ``roi_align`` are CPU's.  They are not CPU's bit for bit: XLA:CPU fuses
``a * b + c`` into a fused multiply-add (one rounding; even across an optimization
barrier or a float64 round trip), so a sample coordinate may move by an ulp (measured:
within 1.2e-7 of CPU for values of order 1, gradients within 7e-7); the backward's
scatter-adds may also add in another order.  ``roi_pool`` (a maximum and its index) is
CPU's bit for bit, ties and NaN pixels included.  ``nms`` keeps
the same boxes in the same order as CPU, except for boxes whose scores tie: CPU orders
ties by an unstable sort, here by index.  ``deform_conv2d`` and its backward sample as
CPU does (its boundary rules, including the offset gradient's own per-corner rules);
their products of columns and weights are matrix products (CPU's ``addmm``, in another
summation order) and the offset and mask gradients sum the channels in another order
(measured: float64 within 3e-14 of CPU, float32 within 5e-7 of each result's largest
magnitude; float16, which CPU rounds after every step, within a few float16 ulps).

``roi_align`` and ``ps_roi_align`` with ``sampling_ratio <= 0`` (CPU's adaptive grid,
``ceil(roi_h / PH)`` x ``ceil(roi_w / PW)`` samples per bin, different per box: Mask
R-CNN's mask targets) read the boxes to the host first (a sync point) for a bound G on
the grids; one executable per power of two G loops over G x G grid points, each box
using its own.

Not lowered (``NotImplementedError`` naming the case, or the CPU fallback where it is on):
the adaptive grid under ``torch.compile`` (the bound needs the boxes' values).
``roi_pool`` and ``ps_roi_pool`` build a mask per bin over the
image: memory grows with boxes x bins x height x width.
"""

from __future__ import annotations

import numpy as np
import torch

from torchtpu.ops import lower
from torchtpu.ops._util import (ieee_div, jnp, lax, matmul_precision, npdt,
                                scalar_type_name, tdtype)

_tv = torch.ops.torchvision

# nms: boxes are padded to a power of two (at least this many) so that one executable
# serves every count of boxes up to it; a detection model's box counts vary per image
_NMS_MIN_BUCKET = 64
_NMS_CORE: dict = {}  # (padded count, dtype) -> jitted keep mask


def _nms_checks(dets, scores):
    if dets.ndim != 2:
        raise RuntimeError(f"boxes should be a 2d tensor, got {dets.ndim}D")
    if dets.shape[1] != 4:
        raise RuntimeError(f"boxes should have 4 elements in dimension 1, got {dets.shape[1]}")
    if scores.ndim != 1:
        raise RuntimeError(f"scores should be a 1d tensor, got {scores.ndim}D")
    if dets.shape[0] != scores.shape[0]:
        raise RuntimeError(
            "boxes and scores should have same number of elements in dimension 0, got "
            f"{dets.shape[0]} and {scores.shape[0]}")
    dt = tdtype(dets)
    if dt not in (torch.float32, torch.float64):
        raise RuntimeError(f'"nms_kernel" not implemented for '
                           f"'{str(dt).split('.')[-1].capitalize()}'")
    if tdtype(scores) != dt:
        raise RuntimeError("dets should have the same type as scores")


def _nms_core(p: int, dtype):
    """The jitted keep mask of ``p`` (padded) boxes: ``(boxes (p, 4), scores (p,), n,
    threshold) -> (order (p,) int64, keep (p,) bool in that order)``."""
    key = (p, str(dtype))
    f = _NMS_CORE.get(key)
    if f is not None:
        return f
    from torchtpu._device import runtime

    jax = runtime.jax()
    j = jax.numpy
    lx = lax()

    def core(boxes, scores, n, thr):
        iota = lx.iota(npdt(torch.int64), p)
        valid = iota < n
        # CPU: scores.sort(descending=True): NaN first, then by score; here stable (ties
        # by index), the padding last
        key = j.where((scores == 0) | j.isnan(scores), j.zeros_like(scores), scores)
        _, _, _, order = lx.sort((~valid, ~j.isnan(scores), -key, iota), num_keys=3,
                                 is_stable=True)
        b = boxes[order]
        x1, y1, x2, y2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
        areas = (x2 - x1) * (y2 - y1)
        xx1 = j.maximum(x1[:, None], x1[None, :])
        yy1 = j.maximum(y1[:, None], y1[None, :])
        xx2 = j.minimum(x2[:, None], x2[None, :])
        yy2 = j.minimum(y2[:, None], y2[None, :])
        zero = j.zeros((), boxes.dtype)
        w = j.maximum(zero, xx2 - xx1)
        h = j.maximum(zero, yy2 - yy1)
        inter = w * h
        # CPU: inter / (iarea + areas[j] - inter), compared with the double threshold
        ovr = ieee_div(inter, (areas[:, None] + areas[None, :]) - inter)
        over = ovr.astype(np.float64) > thr
        later = iota[None, :] > iota[:, None]

        def body(i, st):
            suppressed, keep = st
            k = (~suppressed[i]) & (i < n)
            keep = keep.at[i].set(k)
            suppressed = suppressed | (k & over[i] & later[i])
            return suppressed, keep

        none = j.zeros((p,), bool)
        _, keep = lx.fori_loop(0, p, body, (none, none))
        return order, keep

    f = _NMS_CORE[key] = jax.jit(core)
    return f


@lower(_tv.nms.default, dynamic_shape=True)
def nms(dets, scores, iou_threshold):
    """``torchvision::nms``: the indices (int64, by decreasing score) of the boxes kept by
    greedy non-maximum suppression, as torchvision's CPU kernel selects them.  ``dets``
    (N, 4) float32/float64 boxes (x1, y1, x2, y2), ``scores`` (N,) of the same dtype; a
    box is dropped when its IoU with a kept box of higher score is ``> iou_threshold``.
    The output's length depends on the values: the keep mask is computed on the device,
    and its indices on the host (a sync point, as CUDA's kernel also copies its mask to
    the host).  Raises CPU's ``RuntimeError`` for bad shapes or dtypes."""
    _nms_checks(dets, scores)
    n = dets.shape[0]
    if n == 0:
        return jnp().zeros((0,), npdt(torch.int64))
    p = max(_NMS_MIN_BUCKET, 1 << (n - 1).bit_length())
    j = jnp()
    if p != n:
        dets = j.pad(dets, ((0, p - n), (0, 0)))
        scores = j.pad(scores, (0, p - n))
    order, keep = _nms_core(p, dets.dtype)(dets, scores, np.int64(n),
                                           np.float64(iou_threshold))
    order, keep = np.asarray(order), np.asarray(keep)
    return j.asarray(order[keep].astype(np.int64))


# ------------------------------------------------------------------------ roi_align



def _roi_starts(rois, T, spatial_scale, ph_n, pw_n, aligned):
    """Per box (N,): ``start_h``, ``start_w``, ``bin_h``, ``bin_w``, ``roi_h``, ``roi_w``
    as torchvision's CPU RoIAlign kernels compute them in numpy dtype ``T``."""
    j = jnp()
    ss = j.asarray(spatial_scale, T)
    off = j.asarray(0.5 if aligned else 0.0, T)
    r = rois.astype(T)
    start_w = r[:, 1] * ss - off
    start_h = r[:, 2] * ss - off
    end_w = r[:, 3] * ss - off
    end_h = r[:, 4] * ss - off
    rw = end_w - start_w
    rh = end_h - start_h
    if not aligned:  # malformed boxes become 1x1
        one = j.asarray(1.0, T)
        rw = j.maximum(rw, one)
        rh = j.maximum(rh, one)
    bin_h = ieee_div(rh, j.asarray(ph_n, T))
    bin_w = ieee_div(rw, j.asarray(pw_n, T))
    return start_h, start_w, bin_h, bin_w, rh, rw


def _bilinear_points(yy, xx, T, height, width):
    """CPU's ``pre_calc`` of sample points ``yy``/``xx`` (equal shapes): the four pixel
    indices (flattened ``y * width + x``, int32), their bilinear weights and whether the
    point lies on the map (``-1 <= y <= height``, the same for x)."""
    j = jnp()
    inside = (yy >= -1.0) & (yy <= height) & (xx >= -1.0) & (xx <= width)
    zero = j.zeros((), T)
    y = j.where(yy <= 0, zero, yy)
    x = j.where(xx <= 0, zero, xx)
    y_low = y.astype(np.int32)
    x_low = x.astype(np.int32)
    y_edge = y_low >= height - 1
    x_edge = x_low >= width - 1
    y_low = j.where(y_edge, height - 1, y_low)
    x_low = j.where(x_edge, width - 1, x_low)
    y_high = j.where(y_edge, height - 1, y_low + 1)
    x_high = j.where(x_edge, width - 1, x_low + 1)
    y = j.where(y_edge, y_low.astype(T), y)
    x = j.where(x_edge, x_low.astype(T), x)
    ly = y - y_low.astype(T)
    lx_ = x - x_low.astype(T)
    hy = j.asarray(1.0, T) - ly
    hx = j.asarray(1.0, T) - lx_
    w = [hy * hx, hy * lx_, ly * hx, ly * lx_]
    pos = [y_low * width + x_low, y_low * width + x_high,
           y_high * width + x_low, y_high * width + x_high]
    return pos, w, inside


def _roi_geometry(rois, dt, spatial_scale, ph_n, pw_n, sampling_ratio, aligned, height,
                  width):
    """The sampling points of every box as torchvision's CPU kernel computes them, in
    dtype ``dt``: per box, bin and grid point the four pixel indices (flattened ``y *
    width + x``, int32), their bilinear weights and whether the point lies on the map.
    Shapes (N, PH, PW, GH, GW)."""
    j = jnp()
    T = npdt(dt)
    gh = gw = sampling_ratio
    start_h, start_w, bin_h, bin_w, _, _ = _roi_starts(rois, T, spatial_scale, ph_n, pw_n,
                                                       aligned)

    def axis(start, bin_size, n_bins, g):
        # start + p * bin + T(i + .5) * bin / T(g), evaluated left to right as CPU does
        p = j.arange(n_bins, dtype=T)
        i = j.asarray(np.arange(g, dtype=np.float32) + np.float32(0.5), T)
        a = start[:, None] + p[None, :] * bin_size[:, None]  # (N, P)
        b = ieee_div(i[None, :] * bin_size[:, None], j.asarray(g, T))  # (N, G)
        return a[:, :, None] + b[:, None, :]  # (N, P, G)

    yy = axis(start_h, bin_h, ph_n, gh)[:, :, None, :, None]  # (N, PH, 1, GH, 1)
    xx = axis(start_w, bin_w, pw_n, gw)[:, None, :, None, :]  # (N, 1, PW, 1, GW)
    shape = (rois.shape[0], ph_n, pw_n, gh, gw)
    return _bilinear_points(j.broadcast_to(yy, shape), j.broadcast_to(xx, shape), T,
                            height, width)


# sampling_ratio <= 0 asks for CPU's adaptive grid: ceil(roi_h / PH) x ceil(roi_w / PW)
# samples per bin, different per box.  The eager ``prepare`` step reads the largest grid
# of the call's boxes (a sync point) and passes ``_ADAPTIVE + G``: the lowering loops
# over G x G grid points (G a power of two above that largest grid: one executable per G)
# and each box uses its own first grid points.
_ADAPTIVE = -(1 << 30)


def _prepared(sampling_ratio) -> bool:
    """Whether ``sampling_ratio`` is a prepared adaptive grid, ``_ADAPTIVE + G``."""
    return sampling_ratio < _ADAPTIVE // 2


def _grid_bound(rois, spatial_scale, ph_n, pw_n, aligned) -> int:
    """A power of two above every box's adaptive grid (rows and columns) of ``rois``
    (K, 5; a tpu tensor): the boxes are read to the host (a sync point) and the grids
    computed there (on the device, each new box count would compile its executables)."""
    if rois.shape[0] == 0:
        return 1
    r = rois.detach().cpu()
    r = r.to(torch.float64) if r.dtype == torch.float64 else r.to(torch.float32)
    off = 0.5 if aligned else 0.0
    rh = (r[:, 4] * spatial_scale - off) - (r[:, 2] * spatial_scale - off)
    rw = (r[:, 3] * spatial_scale - off) - (r[:, 1] * spatial_scale - off)
    g = torch.stack([torch.ceil(rh / ph_n), torch.ceil(rw / pw_n)])
    top = float(torch.nan_to_num(g, 0.0, 0.0, 0.0).amax().cpu())
    n = max(1, int(top) + 1)  # +1: the lowering's rounding may differ by one at an integer
    return 1 << (n - 1).bit_length()


def _adaptive_prepare(sr_pos, aligned_pos, ss_pos, ph_pos, pw_pos):
    """A ``Lowering.prepare`` for the RoIAlign ops: ``sampling_ratio <= 0`` becomes
    ``_ADAPTIVE + G`` (:func:`_grid_bound`)."""

    def prepare(vals):
        sr = vals[sr_pos]
        rois = vals[1]
        if sr > 0 or _prepared(sr) or not isinstance(rois, torch.Tensor) \
                or rois.ndim != 2 or rois.shape[1] != 5 or not rois.is_floating_point():
            return vals  # (bad rois: the lowering's checks raise CPU's error)
        vals = list(vals)
        aligned = True if aligned_pos is None else bool(vals[aligned_pos])
        vals[sr_pos] = _ADAPTIVE + _grid_bound(rois, vals[ss_pos], vals[ph_pos],
                                               vals[pw_pos], aligned)
        return vals

    return prepare


def _adaptive_point(st, iy, ix, T, ph_n, pw_n, height, width):
    """The bilinear points (as :func:`_bilinear_points`, shapes (N, PH, PW)) of grid point
    ``(iy, ix)`` (traced int32) of every box's adaptive grid; ``st``: :func:`_roi_starts`
    and the grids ``gh``, ``gw`` (N,).  ``inside`` is also False where the point lies
    beyond the box's own grid."""
    j = jnp()
    start_h, start_w, bin_h, bin_w, gh, gw = st

    def axis(start, bin_size, n_bins, i, g):
        p = j.arange(n_bins, dtype=T)
        a = start[:, None] + p[None, :] * bin_size[:, None]  # (N, P)
        fi = (i.astype(np.float32) + np.float32(0.5)).astype(T)  # CPU: T(i + .5f)
        b = ieee_div(fi * bin_size, g.astype(T))  # (N,)
        return a + b[:, None]

    n = start_h.shape[0]
    shape = (n, ph_n, pw_n)
    yy = j.broadcast_to(axis(start_h, bin_h, ph_n, iy, gh)[:, :, None], shape)
    xx = j.broadcast_to(axis(start_w, bin_w, pw_n, ix, gw)[:, None, :], shape)
    pos, w, inside = _bilinear_points(yy, xx, T, height, width)
    mine = ((iy < gh) & (ix < gw))[:, None, None]
    return pos, w, inside, j.broadcast_to(mine, shape)


def _adaptive_starts(rois, T, spatial_scale, ph_n, pw_n, aligned, at_least_one=True):
    """:func:`_roi_starts` with the adaptive grids instead of the box sizes: ``gh =
    ceil(roi_h / PH)`` and ``gw`` (int32, CPU's ``roi_bin_grid_h``), and the count
    ``max(gh * gw, 1)`` (N,) in ``T`` (``ps_roi_align``: ``gh * gw``, ``at_least_one``
    False: an empty box's 0 / 0 is CPU's NaN)."""
    j = jnp()
    start_h, start_w, bin_h, bin_w, rh, rw = _roi_starts(rois, T, spatial_scale, ph_n,
                                                         pw_n, aligned)

    def grid(size, n):
        g = j.ceil(ieee_div(size, j.asarray(n, T)))
        g = j.where(j.isfinite(g), g, 0)  # (CPU: undefined; here no samples)
        return j.clip(g, -(1 << 30), 1 << 30).astype(np.int32)

    gh, gw = grid(rh, ph_n), grid(rw, pw_n)
    count = (j.maximum(gh * gw, 1) if at_least_one else gh * gw).astype(T)
    return (start_h, start_w, bin_h, bin_w, gh, gw), count


def _adaptive_refused(op):
    """A ``Lowering.meta`` for ``op`` (roi_align and ps_roi_align and their backward):
    torchvision's own meta kernel, after refusing ``sampling_ratio <= 0`` with
    ``NotImplementedError``, which the eager executor turns into the CPU fallback where
    it is enabled (a refusal while tracing would skip it)."""
    sr_pos = {"roi_align": 5, "_roi_align_backward": 9, "ps_roi_align": 5,
              "_ps_roi_align_backward": 6}[op._schema.name.split("::")[1]]

    def meta(*args):
        sr = args[sr_pos]
        if _prepared(sr):  # prepared (see _ADAPTIVE): torchvision's meta reads no grid
            args = args[:sr_pos] + (-1,) + args[sr_pos + 1:]
        elif sr <= 0:
            _roi_align_args(str(op), args[1], sr)
        return op(*args)

    return meta


def _align_args(op, t, rois, sampling_ratio, what, adaptive=False):
    """The checks of the RoIAlign kernels (``t``: the input or the gradient, named
    ``what`` in CPU's message) and the dtype they compute in (float16/bfloat16 in
    float32): ``(torch dtype, numpy dtype)``.  ``adaptive``: the op lowers a prepared
    adaptive grid (``_ADAPTIVE + G``)."""
    _roi_align_args(op, rois, sampling_ratio, adaptive)
    if tdtype(t) != tdtype(rois):
        raise RuntimeError(f"{what} should have the same type as rois")
    dt = tdtype(t)
    cdt = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
    return cdt, npdt(cdt)


def _roi_align_args(op, rois, sampling_ratio, adaptive=False):
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise RuntimeError("rois must have shape as Tensor[K, 5]")
    if adaptive and _prepared(sampling_ratio):
        return
    if sampling_ratio <= 0:
        raise NotImplementedError(
            f"torchtpu: {op} with sampling_ratio={sampling_ratio} (the adaptive grid: "
            f"the number of samples per box depends on the box); use sampling_ratio > 0 "
            f"(torchvision's detection models use 2) or enable the CPU fallback")


@lower(_tv.roi_align.default, prepare=_adaptive_prepare(5, 6, 2, 3, 4),
       meta=_adaptive_refused(_tv.roi_align.default))
def roi_align(x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    """``torchvision::roi_align``: (K, C, PH, PW) averages of bilinear samples of ``x``
    (B, C, H, W) over each box of ``rois`` (K, 5: batch index, x1, y1, x2, y2, in input
    coordinates times ``spatial_scale``), as torchvision's CPU kernel computes them.
    ``sampling_ratio <= 0`` (CPU's adaptive grid, ``ceil(roi_h / PH)`` x ``ceil(roi_w /
    PW)`` samples per bin) reads the largest grid of the boxes first: a sync point in
    eager; under ``torch.compile`` it raises ``NotImplementedError``."""
    cdt, _ = _align_args("torchvision::roi_align", x, rois, sampling_ratio, "input", True)
    j = jnp()
    k = rois.shape[0]
    b, c, h, w = x.shape
    out_dt = x.dtype
    if k == 0 or c == 0:
        return j.zeros((k, c, pooled_height, pooled_width), out_dt)
    if _prepared(sampling_ratio):
        return _roi_align_adaptive(x, rois, spatial_scale, pooled_height, pooled_width,
                                   sampling_ratio - _ADAPTIVE, aligned, cdt)
    pos, wts, inside = _roi_geometry(rois, cdt, spatial_scale, pooled_height, pooled_width,
                                     sampling_ratio, aligned, h, w)
    # CPU: a sample off the map has weights 0 at pixel 0 (0 * a NaN pixel is NaN there too)
    zero = j.zeros((), npdt(cdt))
    wts = [j.where(inside, q, zero) for q in wts]
    pos = [j.where(inside, q, 0) for q in pos]
    batch = rois[:, 0].astype(npdt(cdt)).astype(np.int32)  # CPU: int roi_batch_ind = T
    # (B, H*W, C): one gather per corner gives every channel of a sample point
    flat = j.transpose(x.astype(npdt(cdt)).reshape(b, c, h * w), (0, 2, 1))
    bi = batch[:, None, None, None, None]
    acc = None
    g = sampling_ratio
    for iy in range(g):  # CPU's order: the grid points one after the other
        for ix in range(g):
            v = None
            for q in range(4):
                term = wts[q][..., iy, ix, None] * flat[bi[..., 0, 0], pos[q][..., iy, ix]]
                v = term if v is None else v + term
            acc = v if acc is None else acc + v
    count = j.asarray(max(g * g, 1), npdt(cdt))
    out = ieee_div(acc, count)  # (K, PH, PW, C)
    return j.transpose(out, (0, 3, 1, 2)).astype(out_dt)


def _roi_align_adaptive(x, rois, spatial_scale, ph_n, pw_n, G, aligned, cdt):
    """:func:`roi_align` with CPU's adaptive grid, each box's grid points among G x G
    (a loop over them: CPU's order of the sums)."""
    j = jnp()
    T = npdt(cdt)
    b, c, h, w = x.shape
    st, count = _adaptive_starts(rois, T, spatial_scale, ph_n, pw_n, aligned)
    batch = rois[:, 0].astype(T).astype(np.int32)
    flat = j.transpose(x.astype(T).reshape(b, c, h * w), (0, 2, 1))  # (B, H*W, C)
    bi = batch[:, None, None]
    zero = j.zeros((), T)

    def body(t, acc):
        pos, wts, inside, mine = _adaptive_point(st, t // G, t % G, T, ph_n, pw_n, h, w)
        v = None
        for q in range(4):  # CPU: a sample off the map has weights 0 at pixel 0
            term = j.where(inside, wts[q], zero)[..., None] * flat[bi, j.where(inside, pos[q], 0)]
            v = term if v is None else v + term
        return acc + j.where(mine[..., None], v, zero)  # beyond the box's grid: nothing

    acc = lax().fori_loop(0, G * G, body, j.zeros((rois.shape[0], ph_n, pw_n, c), T))
    out = ieee_div(acc, count[:, None, None, None])  # (K, PH, PW, C)
    return j.transpose(out, (0, 3, 1, 2)).astype(x.dtype)


def _roi_align_backward_adaptive(grad, rois, spatial_scale, ph_n, pw_n, batch_size,
                                 channels, height, width, G, aligned, cdt):
    """:func:`roi_align_backward` with CPU's adaptive grid (see
    :func:`_roi_align_adaptive`)."""
    j = jnp()
    T = npdt(cdt)
    st, count = _adaptive_starts(rois, T, spatial_scale, ph_n, pw_n, aligned)
    batch = rois[:, 0].astype(T).astype(np.int32)
    g = j.transpose(grad.astype(T), (0, 2, 3, 1))  # (K, PH, PW, C)
    cnt = count[:, None, None, None]
    bi = j.broadcast_to(batch[:, None, None], (rois.shape[0], ph_n, pw_n))
    zero = j.zeros((), T)

    def body(t, out):
        pos, wts, inside, mine = _adaptive_point(st, t // G, t % G, T, ph_n, pw_n, height,
                                                 width)
        keep = (inside & mine)[..., None]
        for q in range(4):  # CPU: grad * w / count, where the sample lies on the map
            contrib = j.where(keep, ieee_div(g * wts[q][..., None], cnt), zero)
            out = out.at[bi, pos[q]].add(contrib)
        return out

    out = lax().fori_loop(0, G * G, body, j.zeros((batch_size, height * width, channels), T))
    out = out.reshape(batch_size, height, width, channels)
    return j.transpose(out, (0, 3, 1, 2)).astype(grad.dtype)


@lower(_tv._roi_align_backward.default, prepare=_adaptive_prepare(9, 10, 2, 3, 4),
       meta=_adaptive_refused(_tv._roi_align_backward.default))
def roi_align_backward(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size,
                       channels, height, width, sampling_ratio, aligned):
    """``torchvision::_roi_align_backward``: the gradient (B, C, H, W) of
    :func:`roi_align` for the output gradient ``grad`` (K, C, PH, PW), as torchvision's
    CPU kernel accumulates it (the adds may come in another order: last-bit
    differences)."""
    cdt, T = _align_args("torchvision::_roi_align_backward", grad, rois, sampling_ratio,
                         "grad", True)
    j = jnp()
    out = j.zeros((batch_size, height * width, channels), T)
    k = rois.shape[0]
    if k == 0 or grad.size == 0:
        return j.transpose(out.reshape(batch_size, height, width, channels),
                           (0, 3, 1, 2)).astype(grad.dtype)
    if _prepared(sampling_ratio):
        return _roi_align_backward_adaptive(grad, rois, spatial_scale, pooled_height,
                                            pooled_width, batch_size, channels, height,
                                            width, sampling_ratio - _ADAPTIVE, aligned, cdt)
    pos, wts, inside = _roi_geometry(rois, cdt, spatial_scale, pooled_height, pooled_width,
                                     sampling_ratio, aligned, height, width)
    batch = rois[:, 0].astype(T).astype(np.int32)
    g = j.transpose(grad.astype(T), (0, 2, 3, 1))  # (K, PH, PW, C)
    count = j.asarray(sampling_ratio * sampling_ratio, T)
    bi = j.broadcast_to(batch[:, None, None, None, None], inside.shape)
    for q in range(4):
        # CPU: grad * w / count, added where the sample lies on the map
        contrib = ieee_div(g[:, :, :, None, None, :] * wts[q][..., None], count)
        contrib = j.where(inside[..., None], contrib, j.zeros((), T))
        out = out.at[bi, pos[q]].add(contrib)
    out = out.reshape(batch_size, height, width, channels)
    return j.transpose(out, (0, 3, 1, 2)).astype(grad.dtype)


# ------------------------------------------------------------------------- roi_pool


@lower(_tv.roi_pool.default)
def roi_pool(x, rois, spatial_scale, pooled_height, pooled_width):
    """``torchvision::roi_pool``: per box of ``rois`` (K, 5) and bin, the maximum of ``x``
    (B, C, H, W) over the bin's pixels, and its flat index ``h * W + w`` (int32; the first
    in row-major order, as CPU's loop finds it), as torchvision's CPU kernel computes
    them: (K, C, PH, PW) values and indices; an empty bin gives 0 and -1, NaN pixels are
    never the maximum (CPU's ``>`` skips them), nor values at or below ``-FLT_MAX``."""
    dt = tdtype(x)
    if dt not in (torch.float32, torch.float64):
        raise RuntimeError("roi_pool only supports float and double types")
    if tdtype(rois) != dt:
        raise RuntimeError("input and rois must have the same dtype")
    j = jnp()
    k = rois.shape[0]
    b, c, h, w = x.shape
    shape = (k, c, pooled_height, pooled_width)
    if k == 0 or c == 0:
        return j.zeros(shape, x.dtype), j.zeros(shape, np.int32)
    hs, he, ws, we, batch = _pool_bins(rois, dt, spatial_scale, pooled_height,
                                       pooled_width, h, w, 1, False)
    T = x.dtype
    floor_v = j.asarray(-np.finfo(np.float32).max, T)  # CPU's starting maximum, -FLT_MAX
    neg = j.asarray(-np.inf, T)
    img = x[batch]  # (K, C, H, W)
    # candidates: a pixel CPU's strict ``>`` could pick (not NaN, above -FLT_MAX)
    cand = j.where(j.isnan(img) | (img <= floor_v), neg, img)
    # rows first: per box, bin column and image row, the maximum over the bin's columns
    # and its first column; then per bin row, the first row holding the maximum of those
    wi = j.arange(w, dtype=np.int32)
    in_w = (wi[None, None, :] >= ws[:, :, None]) & (wi[None, None, :] < we[:, :, None])
    v1 = j.where(in_w[:, None, None, :, :], cand[:, :, :, None, :], neg)  # (K,C,H,PW,W)
    m1 = j.max(v1, axis=-1)  # (K, C, H, PW)
    a1 = j.argmax(v1 == m1[..., None], axis=-1).astype(np.int32)
    hi_ = j.arange(h, dtype=np.int32)
    in_h = (hi_[None, None, :] >= hs[:, :, None]) & (hi_[None, None, :] < he[:, :, None])
    v2 = j.where(in_h[:, None, :, None, :], j.swapaxes(m1, 2, 3)[:, :, None, :, :], neg)
    m2 = j.max(v2, axis=-1)  # (K, C, PH, PW)
    row = j.argmax(v2 == m2[..., None], axis=-1).astype(np.int32)
    col = j.take_along_axis(j.swapaxes(a1, 2, 3)[:, :, None, :, :], row[..., None],
                            axis=-1)[..., 0]
    empty = ((he <= hs)[:, None, :, None]) | ((we <= ws)[:, None, None, :])
    found = m2 > neg
    val = j.where(empty, j.zeros((), T), j.where(found, m2, floor_v))
    idx = j.where(found & ~empty, row * w + col, -1).astype(np.int32)
    return val, idx


@lower(_tv._roi_pool_backward.default)
def roi_pool_backward(grad, rois, argmax, spatial_scale, pooled_height, pooled_width,
                      batch_size, channels, height, width):
    """``torchvision::_roi_pool_backward``: each output gradient (K, C, PH, PW) added to
    the pixel its bin took the maximum from (``argmax``; -1: none), as CPU's kernel; the
    adds may come in another order (last-bit differences where bins share a pixel)."""
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise RuntimeError("Tensor rois should have shape as Tensor[K, 5]")
    if tdtype(grad) != tdtype(rois):
        raise RuntimeError("grad and rois must have the same dtype")
    j = jnp()
    out = j.zeros((batch_size, channels, height * width), grad.dtype)
    if grad.size == 0:
        return out.reshape(batch_size, channels, height, width)
    batch = rois[:, 0].astype(np.int32)
    k, c = grad.shape[0], grad.shape[1]
    a = argmax.reshape(k, c, -1)
    g = grad.reshape(k, c, -1)
    bi = j.broadcast_to(batch[:, None, None], a.shape)
    ci = j.broadcast_to(j.arange(c, dtype=np.int32)[None, :, None], a.shape)
    keep = a >= 0
    # (a skipped entry goes to index height*width: dropped by the scatter)
    pos = j.where(keep, a, height * width)
    out = out.at[bi, ci, pos].add(j.where(keep, g, j.zeros((), grad.dtype)), mode="drop")
    return out.reshape(batch_size, channels, height, width)


# --------------------------------------------------------------------- ps_roi_align


def _ps_layout(k, c, ph_n, pw_n):
    """Position-sensitive pooling's output channels ``c / (PH * PW)``, output shape and
    channel mapping (int32 (K, C_out, PH, PW): output channel ``co`` of bin ``(ph, pw)``
    reads input channel ``(co * PH + ph) * PW + pw``), as CPU's kernels number them."""
    if c % (ph_n * pw_n) != 0:
        raise RuntimeError("input channels must be a multiple of pooling height * pooling width")
    j = jnp()
    c_out = c // (ph_n * pw_n)
    shape = (k, c_out, ph_n, pw_n)
    mapping = ((j.arange(c_out, dtype=np.int32)[:, None, None] * ph_n
                + j.arange(ph_n, dtype=np.int32)[None, :, None]) * pw_n
               + j.arange(pw_n, dtype=np.int32)[None, None, :])
    return c_out, shape, j.broadcast_to(mapping[None], shape)


def _ps_roi_align_adaptive(x, rois, spatial_scale, ph_n, pw_n, G, cdt, mapping):
    """:func:`ps_roi_align` with CPU's adaptive grid (see :func:`_roi_align_adaptive`;
    the count is ``gh * gw``, without CPU RoIAlign's ``max(.., 1)``)."""
    j = jnp()
    T = npdt(cdt)
    b, c, h, w = x.shape
    c_out = c // (ph_n * pw_n)
    st, count = _adaptive_starts(rois, T, spatial_scale, ph_n, pw_n, True, False)
    batch = rois[:, 0].astype(T).astype(np.int32)
    xr = x.astype(T).reshape(b, c_out, ph_n, pw_n, h * w)
    bi = batch[:, None, None]
    phi = j.arange(ph_n)[None, :, None]
    pwi = j.arange(pw_n)[None, None, :]
    zero = j.zeros((), T)

    def body(t, acc):
        pos, wts, inside, mine = _adaptive_point(st, t // G, t % G, T, ph_n, pw_n, h, w)
        v = None
        for q in range(4):  # (K, PH, PW, C_out): the bin's own input channel
            term = wts[q][..., None] * xr[bi, :, phi, pwi, pos[q]]
            v = term if v is None else v + term
        return acc + j.where((inside & mine)[..., None], v, zero)  # CPU: 0 off the map

    acc = lax().fori_loop(0, G * G, body, j.zeros((rois.shape[0], ph_n, pw_n, c_out), T))
    out = ieee_div(acc, count[:, None, None, None])
    return j.transpose(out, (0, 3, 1, 2)).astype(x.dtype), mapping


def _ps_roi_align_backward_adaptive(grad, rois, channel_mapping, spatial_scale, ph_n,
                                    pw_n, G, batch_size, channels, height, width, cdt):
    """:func:`ps_roi_align_backward` with CPU's adaptive grid."""
    j = jnp()
    T = npdt(cdt)
    st, count = _adaptive_starts(rois, T, spatial_scale, ph_n, pw_n, True, False)
    batch = rois[:, 0].astype(T).astype(np.int32)
    g = j.transpose(grad.astype(T), (0, 2, 3, 1))  # (K, PH, PW, C_out)
    cm = j.transpose(channel_mapping.astype(np.int32), (0, 2, 3, 1))
    bi = j.broadcast_to(batch[:, None, None, None], cm.shape)
    cnt = count[:, None, None, None]
    zero = j.zeros((), T)

    def body(t, out):
        pos, wts, inside, mine = _adaptive_point(st, t // G, t % G, T, ph_n, pw_n, height,
                                                 width)
        keep = (inside & mine)[..., None]
        for q in range(4):
            contrib = j.where(keep, ieee_div(g * wts[q][..., None], cnt), zero)
            out = out.at[bi, cm, j.broadcast_to(pos[q][..., None], cm.shape)].add(contrib)
        return out

    out = lax().fori_loop(0, G * G, body,
                          j.zeros((batch_size, channels, height * width), T))
    return out.reshape(batch_size, channels, height, width).astype(grad.dtype)


@lower(_tv.ps_roi_align.default, prepare=_adaptive_prepare(5, None, 2, 3, 4),
       meta=_adaptive_refused(_tv.ps_roi_align.default))
def ps_roi_align(x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio):
    """``torchvision::ps_roi_align``: position-sensitive RoIAlign: output channel ``c`` of
    bin ``(ph, pw)`` averages the bilinear samples of input channel ``(c * PH + ph) * PW +
    pw``; (K, C / (PH * PW), PH, PW) values and that channel mapping (int32), as
    torchvision's CPU kernel computes them (the sample points are ``roi_align``'s with
    ``aligned=True``; a sample off the map counts 0).  ``sampling_ratio <= 0``: CPU's
    adaptive grid, as :func:`roi_align` (a sync point in eager)."""
    cdt, T = _align_args("torchvision::ps_roi_align", x, rois, sampling_ratio, "input",
                         True)
    j = jnp()
    k = rois.shape[0]
    b, c, h, w = x.shape
    c_out, shape, mapping = _ps_layout(k, c, pooled_height, pooled_width)
    if k == 0 or c_out == 0:
        return j.zeros(shape, x.dtype), j.zeros(shape, np.int32)
    if _prepared(sampling_ratio):
        return _ps_roi_align_adaptive(x, rois, spatial_scale, pooled_height, pooled_width,
                                      sampling_ratio - _ADAPTIVE, cdt, mapping)
    pos, wts, inside = _roi_geometry(rois, cdt, spatial_scale, pooled_height, pooled_width,
                                     sampling_ratio, True, h, w)
    batch = rois[:, 0].astype(T).astype(np.int32)
    xr = x.astype(T).reshape(b, c_out, pooled_height, pooled_width, h * w)
    bi = batch[:, None, None]
    phi = j.arange(pooled_height)[None, :, None]
    pwi = j.arange(pooled_width)[None, None, :]
    acc = None
    g = sampling_ratio
    zero = j.zeros((), T)
    for iy in range(g):
        for ix in range(g):
            v = None
            for q in range(4):
                # (K, PH, PW, C_out): the bin's own input channel of every output channel
                px = xr[bi, :, phi, pwi, pos[q][..., iy, ix]]
                term = wts[q][..., iy, ix, None] * px
                v = term if v is None else v + term
            v = j.where(inside[..., iy, ix, None], v, zero)  # CPU: 0 off the map
            acc = v if acc is None else acc + v
    out = ieee_div(acc, j.asarray(g * g, T))  # (K, PH, PW, C_out)
    return j.transpose(out, (0, 3, 1, 2)).astype(x.dtype), mapping


@lower(_tv._ps_roi_align_backward.default, prepare=_adaptive_prepare(6, None, 3, 4, 5),
       meta=_adaptive_refused(_tv._ps_roi_align_backward.default))
def ps_roi_align_backward(grad, rois, channel_mapping, spatial_scale, pooled_height,
                          pooled_width, sampling_ratio, batch_size, channels, height, width):
    """``torchvision::_ps_roi_align_backward``: the gradient (B, C, H, W) of
    :func:`ps_roi_align` for ``grad`` (K, C_out, PH, PW), added to each bin's input
    channel (``channel_mapping``) as CPU's kernel does (in another order)."""
    cdt, T = _align_args("torchvision::_ps_roi_align_backward", grad, rois, sampling_ratio,
                         "grad", True)
    j = jnp()
    out = j.zeros((batch_size, channels, height * width), T)
    if rois.shape[0] == 0 or grad.size == 0:
        return out.reshape(batch_size, channels, height, width).astype(grad.dtype)
    if _prepared(sampling_ratio):
        return _ps_roi_align_backward_adaptive(grad, rois, channel_mapping, spatial_scale,
                                               pooled_height, pooled_width,
                                               sampling_ratio - _ADAPTIVE, batch_size,
                                               channels, height, width, cdt)
    pos, wts, inside = _roi_geometry(rois, cdt, spatial_scale, pooled_height, pooled_width,
                                     sampling_ratio, True, height, width)
    batch = rois[:, 0].astype(T).astype(np.int32)
    g = j.transpose(grad.astype(T), (0, 2, 3, 1))  # (K, PH, PW, C_out)
    cm = j.transpose(channel_mapping.astype(np.int32), (0, 2, 3, 1))  # (K, PH, PW, C_out)
    count = j.asarray(sampling_ratio * sampling_ratio, T)
    zero = j.zeros((), T)
    bi = j.broadcast_to(batch[:, None, None, None], cm.shape)
    for iy in range(sampling_ratio):
        for ix in range(sampling_ratio):
            for q in range(4):
                contrib = ieee_div(g * wts[q][..., iy, ix, None], count)
                contrib = j.where(inside[..., iy, ix, None], contrib, zero)
                p = j.broadcast_to(pos[q][..., iy, ix, None], cm.shape)
                out = out.at[bi, cm, p].add(contrib)
    return out.reshape(batch_size, channels, height, width).astype(grad.dtype)


# ---------------------------------------------------------------------- ps_roi_pool


def _pool_bins(rois, dt, spatial_scale, ph_n, pw_n, limit_h, limit_w, extra, round_f32):
    """The bins of ``roi_pool`` and ``ps_roi_pool`` as CPU's kernels compute them:
    ``[hstart, hend)`` x ``[wstart, wend)`` per box and bin (int32, (K, PH) and (K, PW))
    clipped to ``[0, limit]``, and the boxes' batch indices.  The kernels differ: a box
    spans ``end - start + extra`` pixels (``roi_pool``: 1, ``ps_roi_pool``: 0), the
    limits are the height and width, except ``ps_roi_pool``'s forward, which clips to
    ``height - 1``; ``ps_roi_pool``'s backward rounds the box with ``roundf``
    (``round_f32``), the others with ``std::round`` in the box's dtype."""
    j = jnp()
    T = npdt(dt)
    ss = j.asarray(spatial_scale, T)

    def cround(v):  # std::round / roundf: half away from zero
        v = v.astype(np.float32 if round_f32 else np.float64)
        return (j.sign(v) * j.floor(j.abs(v) + 0.5)).astype(np.int32)

    r = rois.astype(T)
    sw, sh = cround(r[:, 1] * ss), cround(r[:, 2] * ss)
    ew, eh = cround(r[:, 3] * ss), cround(r[:, 4] * ss)
    rw = j.maximum(ew - sw + extra, 1)
    rh = j.maximum(eh - sh + extra, 1)
    bin_h = ieee_div(rh.astype(T), j.asarray(ph_n, T))
    bin_w = ieee_div(rw.astype(T), j.asarray(pw_n, T))

    def ranges(start, bin_size, n, limit):
        p = j.arange(n, dtype=T)
        lo = j.floor(p[None, :] * bin_size[:, None]).astype(np.int32)
        hi = j.ceil((p[None, :] + 1) * bin_size[:, None]).astype(np.int32)
        return (j.clip(lo + start[:, None], 0, limit), j.clip(hi + start[:, None], 0, limit))

    hs, he = ranges(sh, bin_h, ph_n, limit_h)
    ws, we = ranges(sw, bin_w, pw_n, limit_w)
    return hs, he, ws, we, r[:, 0].astype(np.int32)


def _bin_masks(hs, he, ws, we, h, w):
    j = jnp()
    hi = j.arange(h, dtype=np.int32)
    wi = j.arange(w, dtype=np.int32)
    in_h = (hi[None, None, :] >= hs[:, :, None]) & (hi[None, None, :] < he[:, :, None])
    in_w = (wi[None, None, :] >= ws[:, :, None]) & (wi[None, None, :] < we[:, :, None])
    return in_h, in_w  # (K, PH, H), (K, PW, W)


@lower(_tv.ps_roi_pool.default)
def ps_roi_pool(x, rois, spatial_scale, pooled_height, pooled_width):
    """``torchvision::ps_roi_pool``: position-sensitive RoI average pooling: output channel
    ``c`` of bin ``(ph, pw)`` averages input channel ``(c * PH + ph) * PW + pw`` over the
    bin's pixels (an empty bin gives 0); (K, C / (PH * PW), PH, PW) values and the channel
    mapping (int32), with CPU's bins (its sums add in another order: last-bit
    differences)."""
    dt = tdtype(x)
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise RuntimeError("Tensor rois should have shape as Tensor[K, 5]")
    if tdtype(rois) != dt:
        raise RuntimeError("input and rois must have the same dtype")
    if dt not in (torch.float32, torch.float64):
        raise RuntimeError("ps_roi_pool only supports float and double types")
    j = jnp()
    k = rois.shape[0]
    b, c, h, w = x.shape
    c_out, shape, mapping = _ps_layout(k, c, pooled_height, pooled_width)
    if k == 0 or c_out == 0:
        return j.zeros(shape, x.dtype), j.zeros(shape, np.int32)
    hs, he, ws, we, batch = _pool_bins(rois, dt, spatial_scale, pooled_height,
                                       pooled_width, h - 1, w - 1, 0, False)
    in_h, in_w = _bin_masks(hs, he, ws, we, h, w)
    xr = x.reshape(b, c_out, pooled_height, pooled_width, h, w)[batch]  # (K,Co,PH,PW,H,W)
    zero = j.zeros((), x.dtype)
    rows = j.sum(j.where(in_w[:, None, None, :, None, :], xr, zero), axis=-1)  # (K,Co,PH,PW,H)
    total = j.sum(j.where(in_h[:, None, :, None, :], rows, zero), axis=-1)  # (K,Co,PH,PW)
    area = ((he - hs)[:, :, None] * (we - ws)[:, None, :]).astype(x.dtype)  # (K, PH, PW)
    empty = ((he <= hs)[:, :, None]) | ((we <= ws)[:, None, :])
    val = j.where(empty[:, None], zero, ieee_div(total, j.where(empty, 1, area)[:, None]))
    return val, mapping


@lower(_tv._ps_roi_pool_backward.default)
def ps_roi_pool_backward(grad, rois, channel_mapping, spatial_scale, pooled_height,
                         pooled_width, batch_size, channels, height, width):
    """``torchvision::_ps_roi_pool_backward``: each bin's gradient divided by its area
    and added to every pixel of the bin in its input channel, with the backward kernel's
    bins (CPU clips them to ``height``/``width`` and rounds the box in float32, unlike the
    forward kernel)."""
    if tdtype(grad) != tdtype(rois):
        raise RuntimeError("grad and rois must have the same dtype")
    j = jnp()
    dt = tdtype(grad)
    out = j.zeros((batch_size, channels, height, width), grad.dtype)
    k = rois.shape[0]
    if k == 0 or grad.size == 0:
        return out
    hs, he, ws, we, batch = _pool_bins(rois, dt, spatial_scale, pooled_height,
                                       pooled_width, height, width, 0, True)
    in_h, in_w = _bin_masks(hs, he, ws, we, height, width)
    area = ((he - hs)[:, :, None] * (we - ws)[:, None, :]).astype(grad.dtype)
    empty = ((he <= hs)[:, :, None]) | ((we <= ws)[:, None, :])
    zero = j.zeros((), grad.dtype)
    diff = j.where(empty[:, None], zero,
                   ieee_div(grad, j.where(empty, 1, area)[:, None]))  # (K, Co, PH, PW)
    m = (in_h[:, :, None, :, None] & in_w[:, None, :, None, :])  # (K, PH, PW, H, W)
    per = j.where(m[:, None], diff[..., None, None], zero)  # (K, Co, PH, PW, H, W)
    # output channel c of bin (ph, pw) came from input channel channel_mapping[k, c, ph, pw]
    cm = channel_mapping.astype(np.int32)
    bi = j.broadcast_to(batch[:, None, None, None], cm.shape)
    return out.at[bi, cm].add(per)


# -------------------------------------------------------------------- deform_conv2d


def _tdt(t):
    """The torch dtype of a JAX array or a (meta) tensor."""
    return t.dtype if isinstance(t, torch.Tensor) else tdtype(t)


def _deform_checks(x, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                   dilation_h, dilation_w, groups, offset_groups, use_mask, kernel):
    """The argument checks of torchvision's CPU ``deform_conv2d`` kernels, in CPU's order
    and with its messages where it has one (all ``RuntimeError``), then its dtype rule
    (``kernel``: the name CPU's dtype dispatch refuses under).  Returns the output's
    height and width.  (CPU divides by zero for ``groups``, ``offset_groups`` or a stride
    of 0: here a ``RuntimeError``.)"""
    for name, t in (("input", x), ("offset", offset), ("weight", weight)):
        if t.ndim != 4:
            raise RuntimeError(f"deform_conv2d: {name} must be a 4-d tensor, got {t.ndim}-d")
    if use_mask and mask.ndim != 4:
        raise RuntimeError(f"deform_conv2d: mask must be a 4-d tensor, got {mask.ndim}-d")
    b, c, in_h, in_w = x.shape
    kh, kw = weight.shape[2], weight.shape[3]
    if not (kh > 0 and kw > 0):
        raise RuntimeError(f"weight_h: {kh} weight_w: {kw}")
    if not (stride_h > 0 and stride_w > 0):
        raise RuntimeError(f"stride_h: {stride_h} stride_w: {stride_w}")
    if not (pad_h >= 0 and pad_w >= 0):
        raise RuntimeError(f"pad_h: {pad_h} pad_w: {pad_w}")
    if not (dilation_h > 0 and dilation_w > 0):
        raise RuntimeError(f"dilation_h: {dilation_h} dilation_w: {dilation_w}")
    if groups <= 0 or offset_groups <= 0:
        raise RuntimeError(f"deform_conv2d: groups ({groups}) and offset_groups "
                           f"({offset_groups}) must be positive")
    if weight.shape[1] * groups != c:
        raise RuntimeError(f"deform_conv2d: weight.shape[1] * groups ({weight.shape[1]} * "
                           f"{groups}) must equal the input's channels ({c})")
    if weight.shape[0] % groups != 0:
        raise RuntimeError(f"deform_conv2d: weight.shape[0] ({weight.shape[0]}) must be a "
                           f"multiple of groups ({groups})")
    if offset.shape[1] != offset_groups * 2 * kh * kw:
        raise RuntimeError(f"offset.shape[1] is not valid: got: {offset.shape[1]} expected: "
                           f"{offset_groups * 2 * kh * kw}")
    if use_mask and mask.shape[1] != offset_groups * kh * kw:
        raise RuntimeError(f"mask.shape[1] is not valid: got: {mask.shape[1]} expected: "
                           f"{offset_groups * kh * kw}")
    if c % offset_groups != 0:
        raise RuntimeError(f"deform_conv2d: the input's channels ({c}) must be a multiple of "
                           f"offset_groups ({offset_groups})")
    out_h = (in_h + 2 * pad_h - (dilation_h * (kh - 1) + 1)) // stride_h + 1
    out_w = (in_w + 2 * pad_w - (dilation_w * (kw - 1) + 1)) // stride_w + 1
    if offset.shape[0] != b:
        raise RuntimeError("invalid batch size of offset")
    if offset.shape[2] != out_h or offset.shape[3] != out_w:
        raise RuntimeError(f"offset output dims: ({offset.shape[2]}, {offset.shape[3]}) - "
                           f"computed output dims: ({out_h}, {out_w})")
    if mask.ndim == 0 or mask.shape[0] != b:
        raise RuntimeError("invalid batch size of mask")
    if use_mask and (mask.shape[2] != out_h or mask.shape[3] != out_w):
        raise RuntimeError(f"mask output dims: ({mask.shape[2]}, {mask.shape[3]}) - "
                           f"computed output dims: ({out_h}, {out_w})")
    if not (out_h > 0 and out_w > 0):
        raise RuntimeError(f"Calculated output size too small - out_h: {out_h} out_w: {out_w}")
    n_bias = int(np.prod(bias.shape))
    if n_bias != weight.shape[0]:
        raise RuntimeError(f"shape '[1, {weight.shape[0]}, 1, 1]' is invalid for input of "
                           f"size {n_bias}")
    dt = _tdt(x)
    if dt not in (torch.float32, torch.float64, torch.float16):
        raise RuntimeError(f'"{kernel}" not implemented for \'{scalar_type_name(dt)}\'')
    for t in (offset, mask, weight):
        if _tdt(t) != dt:
            raise RuntimeError(f"expected scalar type {scalar_type_name(dt)} but found "
                               f"{scalar_type_name(_tdt(t))}")
    return out_h, out_w


def _deform_meta(op, kernel, grad_first):
    """A ``Lowering.meta`` for ``op``: CPU's argument checks (:func:`_deform_checks`,
    whose ``RuntimeError`` the eager executor raises as CPU would), then torchvision's own
    meta kernel (which checks nothing)."""

    def meta(*args):
        a = args[1:] if grad_first else args
        oh, ow = _deform_checks(*a[:14], kernel)
        if grad_first:
            g = args[0]
            want = (a[0].shape[0], a[1].shape[0], oh, ow)
            if tuple(g.shape) != want or g.dtype != a[0].dtype:
                raise RuntimeError(f"_deform_conv2d_backward: grad must be a "
                                   f"{scalar_type_name(a[0].dtype)} tensor of shape "
                                   f"{list(want)}, got {g.dtype} {list(g.shape)}")
        return op(*args)

    return meta


def _deform_sampling(x, offset, T, offset_groups, kh, kw, out_h, out_w, stride_h, stride_w,
                     pad_h, pad_w, dilation_h, dilation_w):
    """The sampling points of ``deform_conv2d`` and their bilinear corners, as
    torchvision's CPU kernels compute them, in numpy dtype ``T``: a dict of arrays of
    shape (B, G_off, K, OH, OW) (``K = kh * kw``, kernel point ``i * kw + j``):
    ``y``/``x`` (``(oy * stride - pad) + i * dilation + offset``, the integer part in
    int then one add in ``T``, as CPU), ``ly``/``lx`` (``y - floor(y)``), ``hy``/``hx``
    (``1 - l``), ``inside`` (CPU's ``bilinear_interpolate`` gives 0 where ``y <= -1``,
    ``y >= H``, ``x <= -1`` or ``x >= W``), ``pos`` (B, G_off, K, OH, OW, 4) the flat
    pixel index ``y * W + x`` of the corners (floor(y), floor(x)), (floor(y),
    floor(x) + 1), (floor(y) + 1, floor(x)), (floor(y) + 1, floor(x) + 1), ``H * W``
    (a zero pixel appended to the image) where the corner lies off the image, and ``v``
    (B, G_off, K, OH, OW, 4, C / G_off): the corners' pixels of every channel of the
    offset group (0 off the image: CPU's per-corner checks)."""
    j = jnp()
    b, c, h, w = x.shape
    k = kh * kw
    off = offset.astype(T).reshape(b, offset_groups, k, 2, out_h, out_w)
    ki = np.repeat(np.arange(kh), kw)
    kj = np.tile(np.arange(kw), kh)
    base_y = (np.arange(out_h)[None, :, None] * stride_h - pad_h) + (ki * dilation_h)[:, None, None]
    base_x = (np.arange(out_w)[None, None, :] * stride_w - pad_w) + (kj * dilation_w)[:, None, None]
    y = j.asarray(base_y.astype(T)) + off[:, :, :, 0]  # (B, G_off, K, OH, OW)
    xx = j.asarray(base_x.astype(T)) + off[:, :, :, 1]
    yf, xf = j.floor(y), j.floor(xx)

    def ifloor(f, n):  # int32 floor, clipped where the corners are off the image anyway
        return j.where(j.isnan(f), -2, j.clip(f, -2, n)).astype(np.int32)

    yl, xl = ifloor(yf, h), ifloor(xf, w)
    yh, xh = yl + 1, xl + 1
    ok_yl, ok_yh = (yl >= 0) & (yl < h), (yh >= 0) & (yh < h)
    ok_xl, ok_xh = (xl >= 0) & (xl < w), (xh >= 0) & (xh < w)
    corners = [(ok_yl & ok_xl, yl, xl), (ok_yl & ok_xh, yl, xh),
               (ok_yh & ok_xl, yh, xl), (ok_yh & ok_xh, yh, xh)]
    pos = j.stack([j.where(ok, cy * w + cx, h * w) for ok, cy, cx in corners], axis=-1)
    # the image as (B, G_off, H * W + 1, C / G_off): one gather gives every channel of a
    # corner; the appended pixel is the 0 of a corner off the image
    cpg = c // offset_groups
    flat = j.transpose(x.astype(T).reshape(b, offset_groups, cpg, h * w), (0, 1, 3, 2))
    flat = j.pad(flat, ((0, 0), (0, 0), (0, 1), (0, 0)))
    bi = j.arange(b)[:, None, None, None, None, None]
    gi = j.arange(offset_groups)[None, :, None, None, None, None]
    v = flat[bi, gi, pos]  # (B, G_off, K, OH, OW, 4, C / G_off)
    one = j.asarray(1.0, T)
    ly, lx = y - yf, xx - xf
    inside = ~((y <= -1) | (y >= h) | (xx <= -1) | (xx >= w))
    return dict(y=y, x=xx, yf=yf, xf=xf, ly=ly, lx=lx, hy=one - ly, hx=one - lx,
                inside=inside, pos=pos, v=v)


def _deform_bilinear(s):
    """CPU's ``bilinear_interpolate`` of every sample and channel (B, G_off, K, OH, OW,
    C / G_off): ``w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4`` (``w1 = hh * hw`` ...), 0
    outside (-1, H) x (-1, W)."""
    j = jnp()
    hy, hx, ly, lx = s["hy"], s["hx"], s["ly"], s["lx"]
    v = s["v"]
    wts = [hy * hx, hy * lx, ly * hx, ly * lx]
    val = None
    for q in range(4):
        term = wts[q][..., None] * v[..., q, :]
        val = term if val is None else val + term
    return j.where(s["inside"][..., None], val, j.zeros((), val.dtype))


def _deform_columns(s, mask, use_mask, T, groups, k, out_h, out_w):
    """CPU's ``deformable_im2col`` columns: the (masked) samples, as (B, groups,
    C / groups, K, OH, OW); also the unmasked samples (B, G_off, K, OH, OW, C / G_off)."""
    j = jnp()
    bil = _deform_bilinear(s)
    b, go = bil.shape[0], bil.shape[1]
    col = bil
    if use_mask:
        m = mask.astype(T).reshape(b, go, k, out_h, out_w)
        col = m[..., None] * bil
    c = go * bil.shape[-1]
    col = j.transpose(col, (0, 1, 5, 2, 3, 4)).reshape(b, groups, c // groups, k, out_h, out_w)
    return col, bil


def _deform_dtype(x):
    dt = tdtype(x)
    cdt = torch.float32 if dt == torch.float16 else dt
    return cdt, npdt(cdt)


@lower(_tv.deform_conv2d.default, precision=True,
       meta=_deform_meta(_tv.deform_conv2d.default, "deformable_im2col", False))
def deform_conv2d(x, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                  dilation_h, dilation_w, groups, offset_groups, use_mask):
    """``torchvision::deform_conv2d`` (deformable convolution, v2 with ``use_mask``): ``x``
    (B, C, H, W), ``weight`` (O, C / groups, kh, kw), ``offset`` (B, offset_groups * 2 *
    kh * kw, OH, OW: per offset group and kernel point ``i * kw + j`` a (dy, dx) pair),
    ``mask`` (B, offset_groups * kh * kw, OH, OW; ignored without ``use_mask``, where it
    must have B rows), ``bias`` (O,) -> (B, O, OH, OW), as torchvision's CPU kernel
    (``deform_conv2d_forward_kernel``, csrc/ops/cpu/deform_conv2d_kernel.cpp) computes it:
    every channel of offset group ``g`` is sampled bilinearly at ``(oy * stride_h - pad_h
    + i * dilation_h + dy, ox * stride_w - pad_w + j * dilation_w + dx)`` (0 outside (-1,
    H) x (-1, W), each of the four corners 0 off the image), times the mask, and the
    columns are multiplied by the weights of each group (a matrix product, float32 at the
    matmul precision setting), plus the bias.  CPU's ``n_parallel_imgs`` (blocks of up to
    32 images) only splits that product: here one product over the batch.  float32 and
    float64 (float16 computes in float32); raises CPU's ``RuntimeError`` for bad shapes,
    other dtypes and mismatched dtypes of input, offset, mask and weight."""
    out_h, out_w = _deform_checks(x, weight, offset, mask, bias, stride_h, stride_w, pad_h,
                                  pad_w, dilation_h, dilation_w, groups, offset_groups,
                                  use_mask, "deformable_im2col")
    cdt, T = _deform_dtype(x)
    j = jnp()
    b = x.shape[0]
    o, cg, kh, kw = weight.shape
    bias_t = bias.astype(T).reshape(1, o, 1, 1)
    if b == 0:
        return j.zeros((0, o, out_h, out_w), x.dtype)
    k = kh * kw
    s = _deform_sampling(x, offset, T, offset_groups, kh, kw, out_h, out_w, stride_h,
                         stride_w, pad_h, pad_w, dilation_h, dilation_w)
    col, _ = _deform_columns(s, mask, use_mask, T, groups, k, out_h, out_w)
    wr = weight.astype(T).reshape(groups, o // groups, cg, k)
    out = j.einsum("gock,bgckyx->bgoyx", wr, col, precision=matmul_precision(cdt),
                   preferred_element_type=T)
    return (out.reshape(b, o, out_h, out_w) + bias_t).astype(x.dtype)


@lower(_tv._deform_conv2d_backward.default, precision=True,
       meta=_deform_meta(_tv._deform_conv2d_backward.default, "compute_grad_offset_and_mask",
                         True))
def deform_conv2d_backward(grad, x, weight, offset, mask, bias, stride_h, stride_w, pad_h,
                           pad_w, dilation_h, dilation_w, groups, offset_groups, use_mask):
    """``torchvision::_deform_conv2d_backward``: the gradients ``(grad_input, grad_weight,
    grad_offset, grad_mask, grad_bias)`` of :func:`deform_conv2d` for ``grad`` (B, O, OH,
    OW), shaped and typed as ``x``, ``weight``, ``offset``, ``mask`` and ``bias``, with
    the formulas of torchvision's CPU kernel (``deform_conv2d_backward_kernel``):

    * the column gradients ``weight^T @ grad`` per group (CPU's ``columns``);
    * ``grad_input`` (``deformable_col2im``): each column gradient times the mask times
      ``(1 - |y - yp|) * (1 - |x - xp|)`` added to the pixels ``(yp, xp)`` on the image
      within distance 1 of the sample, CPU's 3 x 3 neighbourhood test (adds in another
      order: last-bit differences where samples share a pixel);
    * ``grad_offset`` (``deformable_col2im_coord``): per sample, the sum over the offset
      group's channels of mask * CPU's ``get_coordinate_weight`` * column gradient, where
      the coordinate weight reads the four corners with per-corner checks only (no
      (-1, H) x (-1, W) test: a sample exactly at ``y == -1`` or ``x == -1`` has a
      gradient though its value is 0, unlike the derivative of the forward);
    * ``grad_mask``: the sum over the channels of column gradient * the unmasked sample;
      zeros shaped as ``mask`` without ``use_mask``;
    * ``grad_weight``: ``grad @ columns^T`` per group; ``grad_bias``: ``grad`` summed over
      batch, height and width.

    Raises CPU's ``RuntimeError`` for bad shapes and dtypes (the forward's checks)."""
    out_h, out_w = _deform_checks(x, weight, offset, mask, bias, stride_h, stride_w, pad_h,
                                  pad_w, dilation_h, dilation_w, groups, offset_groups,
                                  use_mask, "compute_grad_offset_and_mask")
    cdt, T = _deform_dtype(x)
    j = jnp()
    b, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    k = kh * kw
    go = offset_groups
    cpg = c // go
    g = grad.astype(T)
    # CPU: ones_like(bias) * grad_out.sum({0, 2, 3})
    grad_bias = (j.ones(bias.shape, T) * j.sum(g, axis=(0, 2, 3)).reshape(bias.shape))
    if b == 0:
        return (j.zeros(x.shape, x.dtype), j.zeros(weight.shape, weight.dtype),
                j.zeros(offset.shape, offset.dtype), j.zeros(mask.shape, mask.dtype),
                grad_bias.astype(bias.dtype))
    prec = matmul_precision(cdt)
    s = _deform_sampling(x, offset, T, go, kh, kw, out_h, out_w, stride_h, stride_w, pad_h,
                         pad_w, dilation_h, dilation_w)
    col, bil = _deform_columns(s, mask, use_mask, T, groups, k, out_h, out_w)
    wr = weight.astype(T).reshape(groups, o // groups, cg, k)
    gr = g.reshape(b, groups, o // groups, out_h, out_w)
    # CPU's columns: weight[g]^T @ grad_out[g], (C / groups * K, B * OH * OW) per group
    gcol = j.einsum("gock,bgoyx->bgckyx", wr, gr, precision=prec, preferred_element_type=T)
    gcol = j.transpose(gcol.reshape(b, go, cpg, k, out_h, out_w), (0, 1, 3, 4, 5, 2))
    m = mask.astype(T).reshape(b, go, k, out_h, out_w) if use_mask else None
    v = s["v"]

    # grad_offset: CPU's get_coordinate_weight (v1 = (yl, xl), v2 = (yl, xh),
    # v3 = (yh, xl), v4 = (yh, xh)), times the mask, times the column gradient
    cw_y = s["lx"][..., None] * (v[..., 3, :] - v[..., 1, :]) \
        + s["hx"][..., None] * (v[..., 2, :] - v[..., 0, :])
    cw_x = s["ly"][..., None] * (v[..., 3, :] - v[..., 2, :]) \
        + s["hy"][..., None] * (v[..., 1, :] - v[..., 0, :])
    if use_mask:
        cw_y = m[..., None] * cw_y
        cw_x = m[..., None] * cw_x
    goff = j.stack([j.sum(cw_y * gcol, axis=-1), j.sum(cw_x * gcol, axis=-1)], axis=3)
    grad_offset = goff.reshape(offset.shape)  # (B, G_off, K, 2, OH, OW)
    if use_mask:
        grad_mask = j.sum(gcol * bil, axis=-1).reshape(mask.shape)
    else:
        grad_mask = j.zeros(mask.shape, T)

    # grad_input: CPU's deformable_col2im: of the pixels yp in int(y) - 1 .. int(y) + 1
    # only floor(y) and floor(y) + 1 can lie within |y - yp| < 1; the weights are
    # 1 - |y - yp|: 1 - (y - floor(y)) and 1 - |y - (floor(y) + 1)|
    one = j.asarray(1.0, T)
    dyh = j.abs(s["y"] - (s["yf"] + one))
    dxh = j.abs(s["x"] - (s["xf"] + one))
    wy = [(s["hy"], None), (one - dyh, dyh < one)]
    wx = [(s["hx"], None), (one - dxh, dxh < one)]
    pos = s["pos"]
    upd, idx = [], []
    for q, (a, bb) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
        wgt = wy[a][0] * wx[bb][0]
        if use_mask:
            wgt = m * wgt  # CPU: mask_value * weight * col
        upd.append(wgt[..., None] * gcol)
        near = [cond for cond in (wy[a][1], wx[bb][1]) if cond is not None]
        p = pos[..., q]
        for cond in near:
            p = j.where(cond, p, h * w)
        idx.append(p)
    # one scatter, the corners innermost: per pixel the adds come in CPU's order of
    # kernel points, output rows and columns, corners (its dy, dx loop)
    upd = j.stack(upd, axis=-2)  # (B, G_off, K, OH, OW, 4, C / G_off)
    idx = j.stack(idx, axis=-1)  # (B, G_off, K, OH, OW, 4)
    bi = j.arange(b)[:, None, None, None, None, None]
    gi = j.arange(go)[None, :, None, None, None, None]
    gin = j.zeros((b, go, h * w + 1, cpg), T).at[bi, gi, idx].add(upd)
    grad_input = j.transpose(gin[:, :, : h * w], (0, 1, 3, 2)).reshape(b, c, h, w)

    # grad_weight: grad_out[g] @ columns[g]^T, over the batch
    gw = j.einsum("bgoyx,bgckyx->gock", gr, col, precision=prec, preferred_element_type=T)
    grad_weight = gw.reshape(weight.shape)
    return (grad_input.astype(x.dtype), grad_weight.astype(weight.dtype),
            grad_offset.astype(offset.dtype), grad_mask.astype(mask.dtype),
            grad_bias.astype(bias.dtype))
