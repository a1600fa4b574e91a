"""Indexing lowerings: advanced indexing, index_put, gather/scatter, index_* ops, masks,
take/embedding, searchsorted/bucketize, and the data-dependent ops (nonzero,
masked_select, unique) that run outside ``jit``.

Index semantics follow PyTorch (which are NumPy's): ``None`` entries of an index list are
full slices; index tensors broadcast together; when the advanced indices are separated by
a slice their result dimensions go first, else they replace the indexed dimensions in
place.  Negative indices wrap.

Out-of-range indices: PyTorch raises ("index X is out of bounds"); here each index
lowering records a device-side check (``ops._checks``) that raises ``IndexError`` at the
next sync point (at the op itself in DEBUG mode), as CUDA reports a device-side assert.  Boolean index tensors in ``index.Tensor`` /
``index_put`` are turned into integer indices on the host (``nonzero``: a sync point)
except in ``index_put`` with a broadcastable value, which is a ``where``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from torchtpu.ops import _checks, aten, lower
from torchtpu.ops._scalar import Scalar, check_converts, fits, scalar_check, value_of_device_scalar
from torchtpu.ops._util import cast, jnp, npdt, opmath, promote, scalar_type_name, tdtype


def _dropped_if(bad, idx, size):
    """``idx``, or, where any entry of ``bad`` is set, every index ``size`` (out of range):
    a scatter then drops every update (JAX's scatters drop out-of-range updates), so a
    failed device-side check writes nothing, as CPU raises before writing.  (Selecting the
    old storage after the write instead would copy it: 18x slower for a 4-row
    ``index_copy_`` into 16 MiB, the scatter no longer in place.)"""
    j = jnp()
    return j.where(j.any(bad), j.asarray(size, idx.dtype), idx)


def _wrap(idx, size, dim=0):
    """Negative indices wrap around (``idx + size`` where ``idx < 0``), as int64; an index
    outside ``[-size, size)`` fails the device-side bounds check, and then every index is
    ``size`` (:func:`_dropped_if`)."""
    j = jnp()
    idx = idx.astype(npdt(torch.int64))
    bad = _checks.index_in_range(idx, size, dim)
    return _dropped_if(bad, j.where(idx < 0, idx + size, idx), size)


def _check_nonneg(index, size, dim, op):
    """gather/scatter-style indices must be in ``[0, size)`` (no wrapping).  Returns
    ``index``, every entry ``size`` where the check fails (:func:`_dropped_if`)."""
    bad = (index < 0) | (index >= size)
    _checks.check(bad, RuntimeError,
                  f"{op}(): index out of bounds for dimension {dim} with size {size}")
    return _dropped_if(bad, index, size)


def _check_index_shapes(x, indices):
    """Trace time (static shapes), PyTorch's errors for an index list: index tensors
    that do not broadcast together, a non-empty index into a dimension of size 0.
    Returns the shape of ``x[indices]`` (the indexing result), None if ``x`` is empty."""
    shapes = [tuple(a.shape) for a in indices if a is not None]
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together "
                         "with shapes " + ", ".join(str(list(s)) for s in shapes)) from None
    for d, a in enumerate(indices):
        if a is not None and x.shape[d] == 0 and a.size > 0:
            raise IndexError("index is out of bounds for dimension with size 0")
    if not all(x.shape):
        return None  # (the result shape is not needed for a tensor with no elements)
    probe = tuple(slice(None) if a is None else np.zeros(a.shape, np.int64) for a in indices)
    return np.broadcast_to(np.zeros((), np.bool_), x.shape)[probe].shape


def _index_tuple(x, indices):
    """The jnp index tuple of an ATen index list (None -> full slice, wrapped negatives)."""
    key = []
    for d, a in enumerate(indices):
        if a is None:
            key.append(slice(None))
        else:
            key.append(_wrap(a, x.shape[d]))
    return tuple(key)


def _has_bool(indices):
    return any(a is not None and tdtype(a) in (torch.bool, torch.uint8) for a in indices)


def _check_count(x, indices, op):
    if len(indices) > x.ndim:
        raise IndexError(f"too many indices for tensor of dimension {x.ndim} (got {len(indices)})")


def _indices_to_device(vals):
    """PyTorch accepts CPU index tensors for a device tensor: move them over (host side)."""
    dev = vals[0].device
    idx = vals[1]
    if any(isinstance(t, torch.Tensor) and t.device != dev and t.dim() > 0 for t in idx):
        vals = list(vals)
        vals[1] = [t.to(dev) if isinstance(t, torch.Tensor) and t.dim() > 0 else t for t in idx]
    return vals


def _check_host_known(x, indices):
    """Host side: index tensors whose values the host knows without a sync (CPU tensors,
    a Python list moved over: ``storage.host_values``) are bounds-checked before the op
    runs, with CPU's message ("index 3 is out of bounds for dimension 0 with size 2"), as
    CPU raises before it writes anything; other indices get the device-side check."""
    from torchtpu._tensor import storage as _st

    dim = 0
    for t in indices:
        if not isinstance(t, torch.Tensor):
            dim += 1
            continue
        if t.dtype in (torch.bool, torch.uint8):
            dim += t.dim()  # a mask indexes as many dims as it has
            continue
        host = t.numpy() if t.device.type == "cpu" else _st.host_values(t)
        # (a dimension of size 0 has its own message: _check_index_shapes)
        if host is not None and host.size and dim < x.dim() and x.shape[dim]:
            size = x.shape[dim]
            bad = (host < -size) | (host >= size)
            if bad.any():
                raise IndexError(f"index {int(host[bad].flat[0])} is out of bounds for "
                                 f"dimension {dim} with size {size}")
        dim += 1


_UINT8_MASK_WARNING = ("indexing with dtype torch.uint8 is now deprecated, please use a dtype "
                       "torch.bool instead.")


def _is_mask(t):
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _check_masks(x, indices):
    """Host side, as PyTorch's ``expandTensors``: a uint8 mask warns (deprecated), and
    each mask's shape must equal the dimensions of ``x`` it indexes.

    Raises ``IndexError`` with CPU's message ("The shape of the mask [1] at index 0 does
    not match the shape of the indexed tensor [5, 4, 3] at index 0")."""
    pos = 0  # the dimension of x the next index entry starts at
    for t in indices:
        if not _is_mask(t):
            pos += 1
            continue
        if t.dtype is torch.uint8:
            warnings.warn(_UINT8_MASK_WARNING, UserWarning, stacklevel=2)
        for j, n in enumerate(t.shape):
            if n != x.size(pos + j):  # x.size raises IndexError past the last dim, as CPU
                raise IndexError(
                    f"The shape of the mask {list(t.shape)} at index {j} does not match the "
                    f"shape of the indexed tensor {list(x.shape)} at index {pos + j}")
        pos += t.dim()


def _expand_masks(vals):
    """Host side, before ``index.Tensor`` runs: each bool/uint8 mask becomes the integer
    index tensors of its ``nonzero()`` (PyTorch's ``expandTensors``).  The result's size
    depends on the mask's values, so this is a sync point."""
    _check_host_known(vals[0], vals[1])
    vals = _indices_to_device(vals)
    indices = vals[1]
    if not any(_is_mask(t) for t in indices):
        return vals
    _check_masks(vals[0], indices)
    new = []
    for t in indices:
        if isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8):
            new.extend(t.nonzero().unbind(1))
        else:
            new.append(t)
    return [vals[0], new] + list(vals[2:])


@lower(aten.index.Tensor, aten._unsafe_index.Tensor, prepare=_expand_masks)
def index(x, indices):
    _check_count(x, indices, "index")
    if _has_bool(indices):
        raise NotImplementedError("torchtpu: index with an unexpanded boolean mask")
    _check_index_shapes(x, indices)
    return x[_index_tuple(x, indices)]


def _index_put_mask(x, indices, v, accumulate):
    """index_put with one boolean mask (after leading full slices): static shapes.

    The k-th selected element takes row k of ``v`` (``cumsum(mask) - 1``), as PyTorch's
    ``nonzero`` expansion orders them.  A ``v`` whose count dimension disagrees with the
    number of True elements was rejected on the host (:func:`_prepare_index_put`)."""
    j = jnp()
    p = 0
    while indices[p] is None:
        p += 1
    m = indices[p].astype(bool)
    if any(a is not None for a in indices[p + 1:]):
        return None
    q = m.ndim
    pre, trail = x.shape[:p], x.shape[p + q:]
    nsel = 1 + len(pre) + len(trail)
    if v.ndim > nsel:
        return None
    vb = v.reshape((1,) * (nsel - v.ndim) + v.shape)
    # selected layout: (*pre, count, *trail) -> (count, *pre, *trail)
    vb = j.moveaxis(vb, p, 0)
    vb = j.broadcast_to(vb, (vb.shape[0],) + pre + trail)
    xm = j.moveaxis(x, tuple(range(p, p + q)), tuple(range(q)))  # (*mask, *pre, *trail)
    flat_m = m.reshape(-1)
    if vb.shape[0] == 0:
        # no values: valid only when the mask selects nothing (checked on the host by
        # _prepare_index_put), so nothing is written
        return x
    if vb.shape[0] == 1:
        rows = j.broadcast_to(vb, (flat_m.shape[0],) + vb.shape[1:])
    else:
        pos = j.clip(j.cumsum(flat_m.astype(npdt(torch.int64))) - 1, 0, vb.shape[0] - 1)
        rows = vb[pos]
    rows = rows.reshape(m.shape + rows.shape[1:])
    mf = m.reshape(m.shape + (1,) * (xm.ndim - q))
    if accumulate:
        add = j.where(mf, rows, j.zeros((), rows.dtype))
        new = (xm | add) if x.dtype == np.bool_ else xm + add
    else:
        new = j.where(mf, rows, xm)
    return j.moveaxis(new, tuple(range(q)), tuple(range(p, p + q)))


def _index_put(x, indices, values, accumulate):
    dt = tdtype(x)
    v = cast(values, dt)
    _check_count(x, indices, "index_put")
    if _has_bool(indices):
        # the masks' shapes, as eager's host check (_check_masks: a compiled graph's node
        # gets here without it): CPU's IndexError, not a broadcasting error
        pos = 0
        for t in indices:
            if t is None or t.dtype not in (np.bool_, np.uint8):
                pos += 1
                continue
            for k, n in enumerate(t.shape):
                if pos + k >= x.ndim or n != x.shape[pos + k]:
                    at = x.shape[pos + k] if pos + k < x.ndim else None
                    if at is None:
                        raise IndexError(f"Dimension out of range (expected to be in range "
                                         f"of [{-max(x.ndim, 1)}, {max(x.ndim, 1) - 1}], "
                                         f"but got {pos + k})")
                    raise IndexError(
                        f"The shape of the mask {list(t.shape)} at index {k} does not match "
                        f"the shape of the indexed tensor {list(x.shape)} at index {pos + k}")
            pos += t.ndim
        r = None
        if sum(a is not None for a in indices) == 1:
            r = _index_put_mask(x, indices, v, accumulate)
        if r is None:
            raise NotImplementedError(
                "torchtpu: index_put with a boolean mask combined with other index tensors "
                "has data-dependent shapes and is not supported inside a compiled op")
        return r
    result = _check_index_shapes(x, indices)
    if result is not None and not _expandable(tuple(v.shape), tuple(result)):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(v.shape)} cannot be "
                           f"broadcast to indexing result of shape {list(result)}")
    key = _index_tuple(x, indices)
    if accumulate:
        if dt is torch.bool:
            return x.at[key].max(v)
        return x.at[key].add(v)
    return x.at[key].set(v)


def _expandable(shape, to):
    """PyTorch's ``is_expandable_to``: ``shape`` broadcasts to ``to`` without new dims
    in front of ``to`` (trailing-aligned, each size equal or 1)."""
    if len(shape) > len(to):
        return False
    return all(a == b or a == 1 for a, b in zip(reversed(shape), reversed(to)))


def _prepare_index_put(vals):
    """Host side, before ``index_put`` runs: CPU index tensors moved to the device, masks
    checked as PyTorch's ``expandTensors`` does (:func:`_check_masks`), and for one mask
    (the static ``where`` path of :func:`_index_put_mask`) the value checked against the
    indexing result ``(*pre, count, *trail)``, as CPU's "shape mismatch" check.

    The mask's count of True elements is read (a sync point) only when it decides the
    answer: the value's count dimension is not 1 (``x[m] = y[m]``), or the value cannot
    be expanded whatever the count (then only to word the error).  ``x[m] = 0`` stays
    sync-free.

    Raises ``IndexError`` for a mask of the wrong shape, ``RuntimeError("shape mismatch:
    value tensor of shape [3] cannot be broadcast to indexing result of shape [4]")``."""
    _check_host_known(vals[0], vals[1])
    vals = _indices_to_device(vals)
    indices = vals[1]
    x, values = vals[0], vals[2]
    if any(_is_mask(t) for t in indices):
        _check_masks(x, indices)
        _check_mask_value(x, indices, values)  # CPU: shape mismatch before dtypes
    if isinstance(values, torch.Tensor) and values.dtype != x.dtype:
        raise RuntimeError(
            f"Index put requires the source and destination dtypes match, got "
            f"{scalar_type_name(x.dtype)} for the destination and "
            f"{scalar_type_name(values.dtype)} for the source.")
    return vals


def mask_count_decides(x, indices, values) -> bool:
    """Whether ``index_put(x, indices, values)`` with one boolean mask among ``indices``
    is right or wrong depending on the mask's count of True elements: the value's
    dimension facing the count is not 1, or the value cannot be expanded whatever the
    count.  Reads only shapes (fake tensors do).  Compiled graphs run such a node in
    eager mode (``compile.staged``), as eager reads the count."""
    used = [i for i, t in enumerate(indices) if t is not None]
    if len(used) != 1 or not isinstance(values, torch.Tensor):
        return False
    p = used[0]
    m = indices[p]
    if not _is_mask(m) or m.dim() == 0:
        return False
    pre, trail = tuple(x.shape[:p]), tuple(x.shape[p + m.dim():])
    vshape = tuple(values.shape)
    cd = len(vshape) - len(trail) - 1  # the value's dimension facing the count
    k = vshape[cd] if cd >= 0 else 1
    return not (k == 1 and _expandable(vshape, pre + (1,) + trail))


def _check_mask_value(x, indices, values) -> None:
    """For one mask index: ``values`` must broadcast to the indexing result (see
    :func:`_prepare_index_put`)."""
    if not mask_count_decides(x, indices, values):
        return  # right for any count: no sync
    used = [i for i, t in enumerate(indices) if t is not None]
    p = used[0]
    m = indices[p]
    pre, trail = tuple(x.shape[:p]), tuple(x.shape[p + m.dim():])
    vshape = tuple(values.shape)
    count = int(m.count_nonzero().item())  # sync: the answer depends on the mask's values
    result = pre + (count,) + trail
    if not _expandable(vshape, result):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(vshape)} cannot be "
                           f"broadcast to indexing result of shape {list(result)}")


@lower(aten.index_put.default, aten._unsafe_index_put.default, prepare=_prepare_index_put)
def index_put(x, indices, values, accumulate=False):
    return _index_put(x, indices, values, accumulate)


@lower(aten._index_put_impl.default, prepare=_prepare_index_put)
def _index_put_impl(x, indices, values, accumulate=False, unsafe=False):
    return _index_put(x, indices, values, accumulate)


# ------------------------------------------------------------------- gather / scatter


def _dim(d, ndim):
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {d})")
    return d % n


def _scatter_key(index, dim):
    """Full index tuple addressing self at (i_0, .., index[i], .., i_n) for each i."""
    j = jnp()
    key = []
    for d in range(index.ndim):
        if d == dim:
            key.append(index.astype(npdt(torch.int64)))
        else:
            shape = [1] * index.ndim
            shape[d] = index.shape[d]
            key.append(j.arange(index.shape[d]).reshape(shape))
    return tuple(key)


@lower(aten.gather.default)
def gather(x, dim, index, sparse_grad=False):
    j = jnp()
    if x.ndim == 0:
        _check_nonneg(index, 1, 0, "gather")
        return j.broadcast_to(x, index.shape)
    dim = _dim(dim, x.ndim)
    _check_nonneg(index, x.shape[dim], dim, "gather")
    if index.ndim == 0:
        index = index.reshape((1,) * x.ndim)
        return x[_scatter_key(index, dim)].reshape(())
    if index.size == 0:
        return j.zeros(index.shape, x.dtype)
    return x[_scatter_key(index, dim)]


def _src_like(src, index, dt):
    """``src`` (array or Scalar) cut to the shape of ``index``, as dtype ``dt``."""
    if isinstance(src, Scalar) or not hasattr(src, "shape"):
        return jnp().broadcast_to(cast(src, dt), index.shape)
    if src.ndim == 0:
        return jnp().broadcast_to(cast(src, dt), index.shape)
    return cast(src[tuple(slice(0, n) for n in index.shape)], dt)


def _scatter(x, dim, index, src, how, wide=True):
    """``x`` with ``src`` scattered along ``dim`` at ``index`` by ``how``.  ``wide``: a
    bfloat16/float16 sum or product accumulates in float32 and rounds once, as CPU's
    scatter kernels do (``index_add``/``index_reduce`` add in the dtype: ``wide=False``)."""
    dt = tdtype(x)
    if wide and dt in (torch.bfloat16, torch.float16) and how in (
            "add", "sum", "multiply", "prod"):
        f32 = npdt(torch.float32)
        return _scatter(x.astype(f32), dim, index, src.astype(f32), how).astype(npdt(dt))
    if index.size == 0:
        return x
    zero_d = x.ndim == 0
    if zero_d:
        x = x.reshape(1)
        index = index.reshape(1)
    dim = _dim(dim, x.ndim)
    if index.ndim == 0:
        index = index.reshape((1,) * x.ndim)
    v = _src_like(src, index, dt)
    if zero_d:
        v = v.reshape(1)
    index = _check_nonneg(index, x.shape[dim], dim, "scatter")
    key = _scatter_key(index, dim)
    at = x.at[key]
    if how == "set":
        r = at.set(v)
    elif how in ("add", "sum"):
        r = at.max(v) if dt is torch.bool else at.add(v)
    elif how in ("multiply", "prod"):
        r = at.min(v) if dt is torch.bool else at.multiply(v)
    elif how == "amax":
        r = at.max(v)
    elif how == "amin":
        r = at.min(v)
    else:
        raise RuntimeError(f"reduce argument must be either add or multiply, got {how}")
    return r.reshape(()) if zero_d else r


@lower(aten.scatter.src, aten.scatter.value, prepare=fits(3))
def scatter(x, dim, index, src):
    return _scatter(x, dim, index, src, "set")


@lower(aten.scatter.reduce, aten.scatter.value_reduce, prepare=fits(3))
def scatter_reduce_legacy(x, dim, index, src, reduce):
    if reduce not in ("add", "multiply"):
        raise RuntimeError(f"reduce argument must be either add or multiply, got {reduce}")
    return _scatter(x, dim, index, src, reduce)


@lower(aten.scatter_add.default)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "add")


def _identity(reduce, dt):
    j = jnp()
    if reduce in ("sum", "mean"):
        return j.zeros((), npdt(dt))
    if reduce == "prod":
        return j.ones((), npdt(dt))
    if dt is torch.bool:
        return j.asarray(reduce == "amin")
    if dt.is_floating_point:
        return j.asarray(-np.inf if reduce == "amax" else np.inf, npdt(dt))
    info = torch.iinfo(dt)
    return j.asarray(info.min if reduce == "amax" else info.max, npdt(dt))


@lower(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, include_self=True, sum_in_dtype=False):
    """``reduce="mean"`` rounds as CPU does: the sum in opmath rounded to ``x``'s dtype,
    then divided (``sum_in_dtype``: each element added in the dtype, as CPU's
    ``index_reduce``)."""
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got "
                           f"{reduce}")
    j = jnp()
    dt = tdtype(x)
    if index.size == 0:
        return x
    zero_d = x.ndim == 0
    if zero_d:
        x, index, src = x.reshape(1), index.reshape(1), src.reshape(1)
    dim = _dim(dim, x.ndim)
    index = _check_nonneg(index, x.shape[dim], dim, "scatter_reduce")
    key = _scatter_key(index, dim)
    hit = j.zeros(x.shape, bool).at[key].set(True)
    base = x if include_self else j.where(hit, _identity(reduce, dt), x)
    if reduce == "mean":
        ct = opmath(dt)
        if sum_in_dtype:  # index_reduce: CPU adds each source element in the dtype
            acc = _scatter(base, dim, index, src, "sum", wide=False)
        else:  # scatter_reduce: CPU sums in opmath, then rounds the sum to the dtype
            acc = _scatter(base.astype(npdt(ct)), dim, index, src, "sum").astype(npdt(dt))
        acc = acc.astype(npdt(ct))
        cnt = j.zeros(x.shape, npdt(torch.int64)).at[key].add(1)
        if include_self:
            cnt = cnt + 1
        cnt = j.where(cnt == 0, 1, cnt)
        if dt.is_floating_point or dt.is_complex:
            r = acc / cnt.astype(acc.dtype)
        else:
            r = j.floor_divide(acc, cnt.astype(acc.dtype))
        r = r.astype(npdt(dt))
    else:
        r = _scatter(base, dim, index, src, reduce, wide=not sum_in_dtype)
        if reduce in ("amax", "amin") and dt.is_floating_point:
            # NaN propagates (XLA's max/min may drop it)
            nan_hit = j.zeros(x.shape, bool).at[key].max(j.isnan(_src_like(src, index, dt)))
            if include_self:
                nan_hit = nan_hit | j.isnan(x)
            r = j.where(nan_hit, j.nan, r)
            r = _first_zero_sign(r, x, key, _src_like(src, index, dt), dim, include_self)
    return r.reshape(()) if zero_d else r


def _first_zero_sign(r, x, key, v, dim, include_self):
    """Signed zeros of a scatter amax/amin: CPU folds each target's contributors in order
    (``self`` first when included, then ``src`` along ``dim``) with ``std::max``, a tie
    keeping the earlier one, so a zero result has the sign of the first zero contributor;
    XLA's scatter-max gives +0.0 whatever the order (``index_reduce`` comes through here
    with ``src`` along ``dim`` in ``index`` order, CPU's order too).  Each zero
    contributor's key is 2 * position + sign bit; the smallest key per target wins."""
    j = jnp()
    i32 = npdt(torch.int32)
    big = j.iinfo(i32).max
    along = [1] * v.ndim
    along[dim] = v.shape[dim]
    pos = j.arange(1, v.shape[dim] + 1, dtype=i32).reshape(along)
    keys = j.where(v == 0, 2 * pos + j.signbit(v).astype(i32), big)
    first = j.full(r.shape, big, i32).at[key].min(keys)
    if include_self:
        first = j.where(x == 0, j.signbit(x).astype(i32), first)
    neg = j.where(first % 2 == 1, j.asarray(-0.0, r.dtype), j.asarray(0.0, r.dtype))
    return j.where((r == 0) & (first != big), neg, r)


_INDEX_REDUCE_WARNED = []


@scalar_check
def _check_source_shape(vals, name="index_add_"):
    """Host side, CPU's ``index_func_meta_impl`` check that PyTorch's meta kernels skip:
    ``source`` has ``self``'s number of dims and its sizes apart from ``dim`` (a (1, 2)
    source broadcast into a (6, 8) ``self`` was accepted).  ``dim`` is wrapped against
    ``self``; a bad ``dim`` or number of indices is left to the meta kernel, whose errors
    CPU raises first."""
    x, dim, index, source = vals[0], vals[1], vals[2], vals[3]
    if not (isinstance(x, torch.Tensor) and isinstance(source, torch.Tensor)
            and isinstance(index, torch.Tensor) and isinstance(dim, int)):
        return
    xs, ss = tuple(x.shape), tuple(source.shape)
    nd = max(len(xs), 1)
    if xs == ss or not -nd <= dim < nd or index.dim() > 1:
        return
    d = dim % nd
    if d >= max(len(ss), 1):  # the meta kernel does not check it
        raise RuntimeError(f"{name}(): Indexing dim {d} is out of bounds of the source "
                           f"tensor with dim {len(ss)}")
    if index.numel() != (ss[d] if ss else 1):
        return
    if len(xs) == len(ss) and xs[:d] + xs[d + 1:] == ss[:d] + ss[d + 1:]:
        return
    raise RuntimeError(
        "source tensor shape must match self tensor shape, excluding the specified "
        f"dimension. Got self.shape = {list(xs)} source.shape = {list(ss)}")


def _check_index_reduce_args(vals):
    """Host side: ``index_reduce``'s meta kernel checks less than CPU (a 0-d ``self`` took
    ``dim=1``); CPU's checks are ``index_add``'s (``index_func_meta_impl``).  Where
    ``index_add``'s meta kernel rejects the arguments, CPU's ``index_reduce`` runs on
    zero-filled stand-ins of the same shapes and dtypes to raise CPU's own error."""
    x, dim, index, source = vals[0], vals[1], vals[2], vals[3]
    if not (isinstance(x, torch.Tensor) and isinstance(source, torch.Tensor)
            and isinstance(index, torch.Tensor)):
        return
    meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
            for t in (x, index, source)]
    try:
        torch.ops.aten.index_add.default(meta[0], dim, meta[1], meta[2])
    except (RuntimeError, IndexError) as meta_err:
        cpu = [torch.zeros(t.shape, dtype=t.dtype) for t in (x, index, source)]
        torch.index_reduce(cpu[0], dim, cpu[1], cpu[2], vals[4], include_self=vals[5]
                           if len(vals) > 5 else True)
        raise meta_err
    _check_source_shape(vals, "index_reduce_")


def _index_reduce_beta(vals):
    """CPU's ``TORCH_WARN_ONCE``: the first ``index_reduce`` of the process warns; the
    arguments are checked as CPU does (:func:`_check_index_reduce_args`)."""
    _check_index_reduce_args(vals)
    if not _INDEX_REDUCE_WARNED:
        _INDEX_REDUCE_WARNED.append(True)
        warnings.warn("index_reduce() is in beta and the API may change at any time.",
                      UserWarning, stacklevel=2)
    return vals


@lower(aten.index_reduce.default, prepare=_index_reduce_beta)
def index_reduce(x, dim, index, source, reduce, include_self=True):
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or "
                           f"amin but got {reduce}.")
    j = jnp()
    if x.ndim == 0:
        return scatter_reduce(x, 0, index.reshape(()), source.reshape(()), reduce, include_self,
                              sum_in_dtype=True)
    dim = _dim(dim, x.ndim)
    src = source if source.ndim else source.reshape((1,) * x.ndim)
    shape = [1] * src.ndim
    shape[dim] = -1
    # CPU checks 0 <= index < size (no wrapping: -1 raises), with index_select's error
    idx = _index1d_nonneg(index, x.shape[dim], "index out of range in self").reshape(shape)
    idx = j.broadcast_to(idx, src.shape)
    return scatter_reduce(x, dim, idx, src, reduce, include_self, sum_in_dtype=True)


# --------------------------------------------------------------------- index_* ops


def _dim_key(ndim, dim, idx):
    return (slice(None),) * dim + (idx,)


def _index1d(index, size):
    """A 1-D index that wraps negative entries (``index_fill``), as int64."""
    return _wrap(index.reshape(-1), size)


def _index1d_nonneg(index, size, message, exc=IndexError):
    """A 1-D index whose entries must lie in ``[0, size)``, as CPU's ``index_select``,
    ``index_add`` and ``index_copy`` check (no wrapping: ``index_select(0, [-1])`` raises
    on CPU); a device-side check raising ``exc(message)``."""
    idx = index.reshape(-1).astype(npdt(torch.int64))
    bad = (idx < 0) | (idx >= size)
    _checks.check(bad, exc, message)
    return _dropped_if(bad, idx, size)


@lower(aten.index_select.default)
def index_select(x, dim, index):
    # CPU's argument checks, in its order
    if index.ndim > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    if tdtype(index) not in (torch.int32, torch.int64):
        raise RuntimeError("index_select(): Expected dtype int32 or int64 for index")
    if x.ndim == 0:  # the index must hold one element, 0; the result is 0-d
        if index.size != 1:
            raise RuntimeError(f"index_select(): Index to scalar can have only 1 value, got "
                               f"{index.size} value(s)")
        _index1d_nonneg(index, 1, "index out of range in self")
        return x
    dim = _dim(dim, x.ndim)
    if dim == 1:  # CPU's dim-1 kernel raises RuntimeError (it names the index: not here)
        idx = _index1d_nonneg(index, x.shape[dim],
                              f"INDICES element is out of DATA bounds, axis_dim={x.shape[dim]}",
                              RuntimeError)
    else:
        idx = _index1d_nonneg(index, x.shape[dim], "index out of range in self")
    return jnp().take(x, idx, axis=dim)


def _source_for(x, dim, source, dt):
    """source reshaped so that its ``dim`` lines up with the flattened index."""
    s = cast(source, dt)
    if x.ndim == 0:
        return s.reshape(-1)
    if s.ndim == 0:
        s = s.reshape((1,) * x.ndim)
    return s


@scalar_check
def _index_add_alpha(vals):
    """Host side, as CPU's checked ``alpha.to<scalar_t>()``: ``alpha`` must fit the
    tensor's dtype (float16 takes no 1e6); a float ``alpha`` for an integer tensor is
    truncated toward zero (``alpha=2.5`` adds twice the source), bool tensors take any.
    The source shape is checked as CPU does (:func:`_check_source_shape`)."""
    _check_source_shape(vals)
    x, alpha = vals[0], vals[4]
    if alpha is None or isinstance(alpha, (bool, torch.Tensor)) or x.dtype is torch.bool:
        return vals
    alpha = check_converts(alpha, x.dtype)
    if isinstance(alpha, float) and not (x.dtype.is_floating_point or x.dtype.is_complex):
        alpha = int(alpha)  # C++ static_cast truncates toward zero
    vals[4] = alpha
    return vals


def _cpu_scatter_add_path(x, dim, index, s, alpha):
    """Whether CPU's ``index_add_cpu_`` takes its ``scatter_add_`` fast path (``self`` of 2
    or more dims, ``dim`` first or last, ``alpha=1``, an int64 index, ``source`` the shape
    of ``self`` apart from ``dim``): as JAX booleans where ``alpha`` is traced.  There a
    bfloat16/float16 sum accumulates in float32 and rounds once; elsewhere CPU adds
    ``round(round(alpha) * source)`` slice by slice in the dtype, in index order."""
    if not (x.ndim > 1 and dim in (0, x.ndim - 1) and index.dtype == jnp().int64
            and s.ndim == x.ndim
            and all(a == b for k, (a, b) in enumerate(zip(x.shape, s.shape)) if k != dim)):
        return False
    if isinstance(alpha, Scalar):
        return alpha.value == 1
    return alpha is None or alpha == 1


@lower(aten.index_add.default, prepare=_index_add_alpha)
def index_add(x, dim, index, source, alpha=1):
    dt = tdtype(x)
    zero_d = x.ndim == 0
    xx = x.reshape(1) if zero_d else x
    dim = _dim(dim, xx.ndim)
    s = _source_for(x, dim, source, dt)
    # CPU: a 1-D self raises IndexError "index out of range in self", a larger one
    # RuntimeError "index 5 is out of bounds for dimension 0 with size 3" (the
    # device-side check cannot name the failing index)
    if xx.ndim == 1:
        idx = _index1d_nonneg(index, xx.shape[dim], "index out of range in self")
    else:
        idx = _index1d_nonneg(
            index, xx.shape[dim],
            f"index out of bounds for dimension {dim} with size {xx.shape[dim]}", RuntimeError)
    key = _dim_key(xx.ndim, dim, idx)
    if dt in (torch.bfloat16, torch.float16):
        wide = _cpu_scatter_add_path(xx, dim, index, s, alpha)
        if wide is not False:
            f32 = npdt(torch.float32)
            summed = xx.astype(f32).at[key].add(s.astype(f32)).astype(xx.dtype)
            if wide is True:
                return summed
            stepped = xx.at[key].add(s * cast(alpha, dt))
            return jnp().where(wide, summed, stepped)
    if alpha is not None:
        s = s * cast(alpha, dt)
    at = xx.at[key]
    r = at.max(s) if dt is torch.bool else at.add(s)
    return r.reshape(()) if zero_d else r


@lower(aten.index_copy.default)
def index_copy(x, dim, index, source):
    dt = tdtype(x)
    zero_d = x.ndim == 0
    xx = x.reshape(1) if zero_d else x
    dim = _dim(dim, xx.ndim)
    s = _source_for(x, dim, source, dt)
    idx = _index1d_nonneg(
        index, xx.shape[dim],
        f"index_copy_(): index out of bounds for dimension {dim} with size {xx.shape[dim]}")
    r = xx.at[_dim_key(xx.ndim, dim, idx)].set(s)
    return r.reshape(()) if zero_d else r


@scalar_check
def _prepare_index_fill(vals):
    """Host side: a complex fill value for a real tensor raises as on CPU (a cast would
    silently drop the imaginary part)."""
    x, value = vals[0], vals[3]
    cplx = value.dtype.is_complex if isinstance(value, torch.Tensor) else \
        isinstance(value, complex)
    if cplx and not x.dtype.is_complex:
        raise RuntimeError(
            "index_fill_(): Converting complex Scalar to non-complex type is not supported")
    vals[3] = check_converts(value, x.dtype)  # fill value 300 on int8 raises as on CPU
    value_of_device_scalar(value, x.dtype)  # a tpu tensor value: read where it may not fit
    return vals


@scalar_check
def _masked_fill_fits(vals):
    """Host side, as CPU's ``value.item()`` then checked ``to<T>()``: a value that does not
    fit raises; a complex value with zero imaginary part fills a real tensor with its real
    part."""
    value = vals[2]
    if isinstance(value, complex) and value.imag == 0 and not vals[0].dtype.is_complex:
        value = value.real
    vals[2] = check_converts(value, vals[0].dtype)
    value_of_device_scalar(value, vals[0].dtype)
    return vals


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, prepare=_prepare_index_fill)
def index_fill(x, dim, index, value):
    dt = tdtype(x)
    zero_d = x.ndim == 0
    xx = x.reshape(1) if zero_d else x
    dim = _dim(dim, xx.ndim)
    idx = _index1d(index, xx.shape[dim])
    r = xx.at[_dim_key(xx.ndim, dim, idx)].set(cast(value, dt))
    return r.reshape(()) if zero_d else r


# --------------------------------------------------------------------------- masks


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor, prepare=_masked_fill_fits)
def masked_fill(x, mask, value):
    j = jnp()
    dt = tdtype(x)
    shape = j.broadcast_shapes(x.shape, mask.shape)
    return j.where(mask.astype(bool), cast(value, dt), j.broadcast_to(x, shape))


@lower(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    j = jnp()
    shape = j.broadcast_shapes(x.shape, mask.shape)
    m = j.broadcast_to(mask.astype(bool), shape).reshape(-1)
    xb = j.broadcast_to(x, shape).reshape(-1)
    src = source.reshape(-1).astype(x.dtype)
    count = j.cumsum(m.astype(npdt(torch.int64)))
    # PyTorch's check (CPU and CUDA): a mask with more ones than source elements raises;
    # on failure nothing is written (the executor keeps the old values)
    bad = count[-1:] > src.size if m.size else j.zeros((1,), bool)
    _checks.check(bad, RuntimeError,
                  "Number of elements of source < number of ones in mask")
    if src.size == 0:
        return xb.reshape(shape)
    pos = j.clip(count - 1, 0, src.size - 1)
    return j.where(m & ~bad, src[pos], xb).reshape(shape)


# ----------------------------------------------------------------- take / embedding


@lower(aten.take.default)
def take(x, index):
    flat = x.reshape(-1)
    return flat[_wrap(index, flat.shape[0])]


@lower(aten.embedding_renorm.default)
def embedding_renorm(weight, indices, max_norm, norm_type):
    """Rows of ``weight`` referenced by ``indices`` with norm > max_norm are scaled to
    max_norm (PyTorch: ``scale = max_norm / (norm + 1e-7)``)."""
    j = jnp()
    ct = opmath(tdtype(weight))
    w = weight.astype(npdt(ct))
    ref = j.zeros((weight.shape[0],), bool).at[indices.reshape(-1)].set(True)
    if norm_type == float("inf"):
        norm = j.max(j.abs(w), axis=1)
    elif norm_type == 1:
        norm = j.sum(j.abs(w), axis=1)
    elif norm_type == 2:
        norm = j.sqrt(j.sum(w * w, axis=1))
    else:
        norm = j.sum(j.abs(w) ** norm_type, axis=1) ** (1.0 / norm_type)
    scale = j.where(ref & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return (w * scale[:, None].astype(w.dtype)).astype(weight.dtype)


@lower(aten.nonzero_static.default)
def nonzero_static(x, size, fill_value=-1):
    """Indices of the non-zero elements of ``x`` as an int64 ``(size, x.ndim)`` tensor:
    the first ``size`` in row-major order, rows past the count filled with
    ``fill_value`` (PyTorch ``nonzero_static``; an empty ``x`` gives all fill rows)."""
    j = jnp()
    if x.ndim == 0:
        return j.full((size, 0), fill_value, npdt(torch.int64))
    if x.size == 0:  # jnp.nonzero ignores fill_value for an empty input (returns zeros)
        return j.full((size, x.ndim), fill_value, npdt(torch.int64))
    idx = j.nonzero(x, size=size, fill_value=fill_value)
    return j.stack([i.astype(npdt(torch.int64)) for i in idx], axis=1)


@lower(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    _checks.check((indices < 0) | (indices >= weight.shape[0]), IndexError,
                  "index out of range in self")
    return jnp().take(weight, indices.astype(npdt(torch.int64)), axis=0)


# --------------------------------------------------------- searchsorted / bucketize


def _searchsorted(seq, values, right, side, sorter, out_int32):
    j = jnp()
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but "
                               f"got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, "
                               "got side of left while right was True")
        right = side == "right"
    if sorter is not None:
        if tdtype(sorter) != torch.int64:
            raise RuntimeError("torch.searchsorted(): sorter must be a tensor of long dtype but "
                               f"got dtype {scalar_type_name(tdtype(sorter))}")
        # a device-side check, reported at the next sync point (CPU raises at once)
        _checks.check((sorter < 0) | (sorter >= seq.shape[-1]), RuntimeError,
                      "torch.searchsorted(): sorter index out of range")
        seq = j.take_along_axis(seq, sorter, axis=-1)
    if seq.ndim == 0:
        if isinstance(values, Scalar):
            raise RuntimeError(
                "torch.searchsorted(): input value can be a scalar only when boundaries "
                "tensor dimension is 1, but we got boundaries tensor dim(0) and input "
                "value's dim(0) numel(1)")
        raise RuntimeError("torch.searchsorted(): boundaries tensor should have positive "
                           "dimension, but got 0 dimension")
    dt = promote(seq, values)
    if dt.is_complex or dt is torch.bool:  # as CPU's kernel, which has no such dtypes
        raise NotImplementedError(
            f'"searchsorted_out_tpu" not implemented for \'{scalar_type_name(dt)}\'')
    if isinstance(values, Scalar):
        v = cast(values, dt)
    else:
        v = values.astype(npdt(dt))
    s = seq.astype(npdt(dt))
    out_dt = npdt(torch.int32 if out_int32 else torch.int64)
    if s.ndim == 1:
        return _cpu_binary_search(s, v, right).astype(out_dt)
    lead = s.shape[:-1]
    nlead = int(np.prod(lead, dtype=np.int64))
    s2 = s.reshape(nlead, s.shape[-1])
    v2 = v.reshape(nlead, v.shape[-1])
    return _cpu_binary_search(s2, v2, right).reshape(v.shape).astype(out_dt)


def _cpu_binary_search(s, v, right):
    """The insertion points of ``v`` in ``s`` found by PyTorch CPU's binary search
    (``cus_lower_bound`` / ``cus_upper_bound`` in ATen's Bucketization.cpp), step for step:
    ``start`` moves past ``mid`` while ``!(s[mid] >= v)`` (left) or ``!(s[mid] > v)``
    (right).  The same steps give the same answer where the boundaries are not what a
    sorted search assumes: a NaN inside them (CPU's search for 2.5 in [1, 2, 2, 3, nan]
    ends at 5, past the NaN; a search that orders NaN last says 3), or unsorted ones.

    ``s``: (n,) with ``v`` of any shape, or (B, n) with ``v`` (B, m), one row each.
    Returns int64 (or int32 when n fits) indices shaped like ``v``.
    """
    j = jnp()
    n = s.shape[-1]
    idt = j.int32 if n < 2**31 - 1 else j.int64
    start = j.zeros(v.shape, idt)
    if n == 0:
        return start
    end = j.full(v.shape, n, idt)
    for _ in range(n.bit_length()):  # each step at least halves end - start
        mid = start + ((end - start) >> 1)
        at = j.minimum(mid, n - 1)  # mid == n only where start == end (inactive)
        mv = j.take(s, at) if s.ndim == 1 else j.take_along_axis(s, at, axis=-1)
        go_right = ~(mv > v) if right else ~(mv >= v)
        active = start < end
        start = j.where(active & go_right, mid + 1, start)
        end = j.where(active & ~go_right, mid, end)
    return start


_SEARCHSORTED_WARNED: set = set()


def _noncontiguous_warnings(vals):
    """``prepare`` of searchsorted: PyTorch's once-per-program performance warnings for a
    non-contiguous boundary or value tensor (its kernels copy them; the warnings are part
    of what users see, so tpu gives them too)."""
    if len(_SEARCHSORTED_WARNED) == 2:
        return vals
    for t, what in ((vals[1], "input value"), (vals[0], "boundary")):
        if what not in _SEARCHSORTED_WARNED and isinstance(t, torch.Tensor) \
                and not t.is_contiguous():
            _SEARCHSORTED_WARNED.add(what)
            warnings.warn(
                f"torch.searchsorted(): {what} tensor is non-contiguous, this will lower the "
                f"performance due to extra data copy when converting non-contiguous tensor "
                f"to contiguous, please use contiguous {what} tensor if possible. This "
                f"message will only appear once per program.", UserWarning, stacklevel=2)
    return vals


def _searchsorted_out_dtype(vals, dts):
    """``out_dtypes`` hook (build time): ``out=`` must be int32 with ``out_int32``, else
    int64, as CPU checks (PyTorch's meta kernel casts)."""
    out = vals[6] if len(vals) > 6 else None
    if isinstance(out, torch.Tensor):
        want = torch.int32 if vals[2] else torch.int64
        if out.dtype != want:
            raise RuntimeError(
                "torch.searchsorted(): output tensor's dtype is wrong, it can only be "
                "Int(int32) or Long(int64) depending on whether out_int32 flag is True, but "
                f"we got output tensor's dtype {scalar_type_name(out.dtype)} and out_int32 "
                f"flag is {bool(vals[2])}")
    return dts


@lower(aten.searchsorted.Tensor, prepare=_noncontiguous_warnings,
       out_dtypes=_searchsorted_out_dtype)
def searchsorted(seq, x, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(seq, x, right, side, sorter, out_int32)


@lower(aten.searchsorted.Scalar)
def searchsorted_scalar(seq, x, out_int32=False, right=False, side=None, sorter=None):
    if seq.ndim != 1:
        raise RuntimeError("torch.searchsorted(): input value can be a scalar only when "
                           "boundaries tensor dimension is 1, but we got boundaries tensor "
                           f"dim({seq.ndim}) and input value's dim(0) numel(1)")
    return _searchsorted(seq, x, right, side, sorter, out_int32)


@lower(aten.bucketize.Tensor)
def bucketize(x, boundaries, out_int32=False, right=False):
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim("
                           f"{boundaries.ndim})")
    return _searchsorted(boundaries, x, right, None, None, out_int32)


@lower(aten.bucketize.Scalar)
def bucketize_scalar(x, boundaries, out_int32=False, right=False):
    return bucketize(x, boundaries, out_int32, right)


# ------------------------------------------------------- data-dependent output shapes
# These run outside jit on concrete arrays (dynamic_shape=True): a device->host sync.


def _i64(a):
    return jnp().asarray(np.asarray(a, dtype=np.int64))


def _prepare_nonzero(vals):
    """Host side: ``nonzero(out=)`` needs an int64 ``out``, as on CPU (no cast)."""
    if len(vals) > 1 and isinstance(vals[1], torch.Tensor) and vals[1].dtype != torch.int64:
        raise RuntimeError("nonzero: Expected out tensor to have scalar type Long but got "
                           f"scalar type{scalar_type_name(vals[1].dtype)}")
    return vals


def _prepare_masked_select(vals):
    """Host side: ``masked_select(out=)`` needs ``out`` of ``self``'s dtype, as on CPU."""
    if len(vals) > 2 and isinstance(vals[2], torch.Tensor) and vals[2].dtype != vals[0].dtype:
        raise RuntimeError("masked_select(): self and result must have the same scalar type")
    return vals


def _column_major(vals, i, shape):
    """``Lowering.layout`` of ``nonzero`` / ``argwhere``: CPU's (n, d) result is
    column-major (strides (1, n))."""
    return (1, 0)


def _unique_dim_layout(vals, i, shape):
    """``Lowering.layout`` of ``unique(dim=)``: CPU computes the unique slices with ``dim``
    first and moves it back, so ``dim`` is outermost in memory (the values only)."""
    if i != 0 or len(shape) < 2:
        return None
    d = vals[1] % len(shape)
    return (d,) + tuple(k for k in range(len(shape)) if k != d)


@lower(aten.nonzero.default, dynamic_shape=True, prepare=_prepare_nonzero,
       layout=_column_major)
def nonzero(x):
    a = np.asarray(x)
    if a.ndim == 0:
        return _i64(np.zeros((1 if a.item() else 0, 0)))
    return _i64(np.stack(np.nonzero(a), axis=1) if a.size else np.zeros((0, a.ndim)))


@lower(aten.argwhere.default, dynamic_shape=True, layout=_column_major)
def argwhere(x):
    return nonzero(x)


@lower(aten.masked_select.default, dynamic_shape=True, prepare=_prepare_masked_select)
def masked_select(x, mask):
    a, m = np.broadcast_arrays(np.asarray(x), np.asarray(mask).astype(bool))
    return jnp().asarray(a[m])


def _unique_np(a, return_inverse, return_counts):
    flat = a.reshape(-1)
    if flat.size == 0:
        return (flat, np.zeros(a.shape, np.int64), np.zeros((0,), np.int64))
    # equal_nan=False: every NaN is its own unique value (sorted last, in input order),
    # as PyTorch's sort-based CPU kernel, which compares with ``==``
    u, inv, cnt = np.unique(flat, return_inverse=True, return_counts=True, equal_nan=False)
    inv = inv.reshape(a.shape).astype(np.int64)
    return u, inv, cnt.astype(np.int64)


@lower(aten._unique2.default, dynamic_shape=True)
def _unique2(x, sorted=True, return_inverse=False, return_counts=False):
    a = np.asarray(x)
    u, inv, cnt = _unique_np(a, return_inverse, return_counts)
    j = jnp()
    inv = inv if return_inverse else np.zeros((0,), np.int64)
    cnt = cnt if return_counts else np.zeros((0,), np.int64)
    return j.asarray(u), j.asarray(inv), j.asarray(cnt)


@lower(aten._unique.default, dynamic_shape=True)
def _unique(x, sorted=True, return_inverse=False):
    a = np.asarray(x)
    u, inv, _ = _unique_np(a, return_inverse, False)
    inv = inv if return_inverse else np.zeros((0,), np.int64)
    return jnp().asarray(u), jnp().asarray(inv)


def _unique_consecutive_layout(vals, i, shape):
    """``Lowering.layout`` of ``unique_consecutive``: with a ``dim``, as ``unique(dim=)``."""
    if vals[3] is None:
        return None
    return _unique_dim_layout([vals[0], vals[3]], i, shape)


@lower(aten.unique_consecutive.default, dynamic_shape=True,
       layout=_unique_consecutive_layout)
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    a = np.asarray(x)
    if dim is not None:
        return unique_dim_consecutive(x, dim, return_inverse, return_counts)
    flat = a.reshape(-1)
    if flat.size == 0:
        u, inv, cnt = flat, np.zeros(a.shape, np.int64), np.zeros((0,), np.int64)
    else:
        new = np.concatenate([[True], flat[1:] != flat[:-1]])
        u = flat[new]
        grp = np.cumsum(new) - 1
        inv = grp.reshape(a.shape).astype(np.int64)
        cnt = np.diff(np.append(np.nonzero(new)[0], flat.size)).astype(np.int64)
    j = jnp()
    inv = inv if return_inverse else np.zeros((0,), np.int64)
    cnt = cnt if return_counts else np.zeros((0,), np.int64)
    return j.asarray(u), j.asarray(inv), j.asarray(cnt)


def _std_sort_order_with_nan(rows):
    """The row order PyTorch's CPU ``unique(dim=)`` gets for rows holding NaN.

    The CPU kernel (``_unique_dim_cpu_template``) sorts row indices with ``std::sort`` and
    a lexicographic ``<`` that skips a column where neither row is less (NaN): not a
    strict weak order, so the order is whatever libstdc++'s algorithm makes of it (the
    upstream test ``test_unique_dim`` pins ``[nan, 0, 0, nan, nan, 1]`` ->
    ``[nan, 0, nan, nan, 1]``).  For up to 16 rows ``std::sort`` is libstdc++'s
    ``__insertion_sort``, reproduced here step for step.  Longer inputs go through its
    introsort, whose partitioning is not reproduced: NotImplementedError rather than
    another order.
    """
    n = rows.shape[0]
    if n > 16:
        raise NotImplementedError(
            "torchtpu: torch.unique(dim=) of a floating tensor with NaN and more than 16 "
            f"slices ({n}) along dim is not supported on tpu: CPU's result order comes from "
            "std::sort with a comparator NaN makes inconsistent; move the tensor to the CPU")

    def less(i, j):
        a, b = rows[i], rows[j]
        for x, y in zip(a, b):
            if x < y:
                return True
            if x > y:
                return False
        return False

    idx = list(range(n))
    for i in range(1, n):
        val = idx[i]
        if less(val, idx[0]):  # libstdc++: straight to the front
            idx[1:i + 1] = idx[0:i]
            idx[0] = val
        else:  # __unguarded_linear_insert
            k = i
            while less(val, idx[k - 1]):
                idx[k] = idx[k - 1]
                k -= 1
            idx[k] = val
    return np.asarray(idx, np.int64)


def _unique_dim_np(a, dim, consecutive):
    dim = _dim(dim, a.ndim)
    if a.size == 0:  # PyTorch's checks for empty inputs (aten/src/ATen/native/Unique.cpp)
        if sum(d == 0 for d in a.shape) > 1:
            raise RuntimeError("Number of zero sized dimensions is more than one, so unique "
                               "cannot be applied ")
        if a.shape[dim] != 0:
            raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so "
                               "unique cannot be applied")
    moved = np.moveaxis(a, dim, 0)
    n = moved.shape[0]
    rows = moved.reshape(n, int(np.prod(moved.shape[1:], dtype=np.int64)))
    if n == 0:
        return a, np.zeros((0,), np.int64), np.zeros((0,), np.int64)
    if consecutive:
        new = np.ones(n, bool)
        new[1:] = np.any(rows[1:] != rows[:-1], axis=1)
        first = np.nonzero(new)[0]
        inv = np.cumsum(new) - 1
        cnt = np.diff(np.append(first, n))
        uniq = rows[first]
    else:
        if rows.dtype.kind in "fc" and np.isnan(rows).any():
            order = _std_sort_order_with_nan(rows)
        else:
            order = np.lexsort(rows.T[::-1]) if rows.shape[1] else np.arange(n)
        srt = rows[order]
        new = np.ones(n, bool)
        new[1:] = np.any(srt[1:] != srt[:-1], axis=1)
        grp = np.cumsum(new) - 1
        inv = np.empty(n, np.int64)
        inv[order] = grp
        cnt = np.bincount(grp)
        uniq = srt[new]
    u = np.moveaxis(uniq.reshape((uniq.shape[0],) + moved.shape[1:]), 0, dim)
    return u, inv.astype(np.int64), cnt.astype(np.int64)


@lower(aten.unique_dim.default, dynamic_shape=True, layout=_unique_dim_layout)
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    u, inv, cnt = _unique_dim_np(np.asarray(x), dim, False)
    j = jnp()
    return (j.asarray(u), j.asarray(inv if return_inverse else np.zeros((0,), np.int64)),
            j.asarray(cnt if return_counts else np.zeros((0,), np.int64)))


@lower(aten.unique_dim_consecutive.default, dynamic_shape=True, layout=_unique_dim_layout)
def unique_dim_consecutive(x, dim, return_inverse=False, return_counts=False):
    u, inv, cnt = _unique_dim_np(np.asarray(x), dim, True)
    j = jnp()
    return (j.asarray(u), j.asarray(inv if return_inverse else np.zeros((0,), np.int64)),
            j.asarray(cnt if return_counts else np.zeros((0,), np.int64)))


@lower(aten.put.default)
def put(x, index, source, accumulate=False):
    """``x.flatten()[index] = source`` (or ``+=``); with repeated indices and
    ``accumulate=False`` the last write wins, like PyTorch's CPU loop."""
    j = jnp()
    flat = x.reshape(-1)
    n = flat.shape[0]
    idx = _wrap(index, n).reshape(-1)
    src = cast(source, tdtype(x)).reshape(-1)
    if idx.shape[0] == 0:
        return x
    if accumulate:
        if flat.dtype == j.bool_:  # bool accumulation is logical or
            return flat.at[idx].max(src).reshape(x.shape)
        return flat.at[idx].add(src).reshape(x.shape)
    k = idx.shape[0]
    later = (idx[:, None] == idx[None, :]) & (j.arange(k)[None, :] > j.arange(k)[:, None])
    keep = ~j.any(later, axis=1)
    idx = j.where(keep, idx, n)  # out of bounds: dropped
    return flat.at[idx].set(src, mode="drop").reshape(x.shape)


@lower(aten.repeat_interleave.Tensor, dynamic_shape=True)
def repeat_interleave_tensor(repeats, output_size=None):
    """``repeat_interleave(repeats)``: index ``i`` repeated ``repeats[i]`` times (int64).
    The length is ``repeats.sum()``: a data-dependent shape (runs on concrete values)."""
    r = np.asarray(repeats).reshape(-1)
    if (r < 0).any():
        raise RuntimeError("repeats can not be negative")
    out = np.repeat(np.arange(r.shape[0], dtype=np.int64), r)
    if output_size is not None and out.shape[0] != output_size:
        raise RuntimeError("allocated size does not match required size")
    return jnp().asarray(out)


@lower(aten.bincount.default, dynamic_shape=True)
def bincount(x, weights=None, minlength=0):
    """``torch.bincount``: the output length is ``max(x) + 1`` (data-dependent: runs on
    concrete values).  int64 counts, or the weights' float dtype (float32 stays float32,
    other weights give float64, as on CPU; an empty input gives int64 zeros, weights or
    not, as on CPU)."""
    # CPU's checks, in its order: integral dtype, minlength, 1-d and >= 0, weights
    if not np.issubdtype(x.dtype, np.integer):
        raise NotImplementedError(
            f'"bincount" not implemented for {scalar_type_name(tdtype(x))!r}')
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    v = np.asarray(x).reshape(-1)
    if x.ndim != 1 or (v.size and v.min() < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.ndim != 1 or weights.shape[0] != x.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    # numpy's bincount overflows max(x) + 1 and writes out of bounds: CPU's checks first
    top = int(v.max()) if v.size else -1
    if top == np.iinfo(np.int64).max:
        raise RuntimeError(f"maximum value of input overflowed, it should be < {top} but got "
                           f"{top}")
    n = max(top + 1, minlength)
    if n > np.iinfo(np.int64).max // 8:
        raise RuntimeError(f"Storage size calculation overflowed with sizes=[{n}]")
    try:
        if weights is None or v.size == 0:
            # (an empty input gives int64 zeros even with weights: CPU's kernel does so)
            return jnp().asarray(np.bincount(v, minlength=minlength).astype(np.int64))
        w = np.asarray(weights).reshape(-1)
        out = np.bincount(v, weights=w.astype(np.float64), minlength=minlength)
    except MemoryError:  # CPU's allocator raises RuntimeError
        raise RuntimeError(f"DefaultCPUAllocator: can't allocate memory: you tried to "
                           f"allocate {8 * n} bytes.") from None
    return jnp().asarray(out.astype(np.float32 if w.dtype == np.float32 else np.float64))
