"""Padded sequences: a tensor whose length along one dim keeps changing (a prompt's length,
a batch's sequence length) is held at a bucketed capacity, and the ops of a transformer
run on that capacity with the true length as a runtime value: one executable per
capacity, not per length.

Why: per-op executables are compiled for exact shapes, so every new prompt length of
``generate()`` compiled ~50 executables (~1.5-3.5 s against ~0.1 s on CPU), and every
new sequence length of a training step ~90.

Representation: :class:`~torchtpu._tensor.storage.Grown` (also ``eager.growth``'s):
the storage's array has the logical shape but along one dim, where it holds the
capacity ``C`` (a power of two above the length ``n``, at least 128 while small,
``growth._capacity``); entries past ``n`` are **zeros** (every rule keeps them so).
Tensors keep their logical shape, strides and device bytes.

Where padded storages start: host transfers (``tensor.to("tpu")``) of integer or bool
tensors (token ids, attention masks, labels, positions: what carries a sequence's length
into a model; a model's float weights of many shapes must not look like one family) of a
family of shapes (the same shape but along one dim, the same dtype) that has met two
lengths along that dim (Dynamo's "automatic dynamic" rule): padded on the host, where the data
is (no sync; the exact host array is kept, so a read the rules do not cover gets the
exact array by a second transfer, not a compile).  ``eager.growth``'s cat chains (a KV
cache) and every result of a rule are padded storages too.

Rules (STRICT only: DeferAndFuse fuses whole steps, DEBUG's checks read every output).
The op runs through the executor on *capacity views* of its padded arguments (the same
view of the capacity array; a view must keep the padded dim whole and start at its
origin: reshapes that merge static dims, permutes and slices of static dims do), and
its padded results are wrapped with the true length:

* element-wise ops (``torch.Tag.pointwise``, not random; in-place too; ``_to_copy``):
  padded operands aligned on one result dim, the others broadcast along it (size 1);
  integer division and remainder are refused (their zero-divisor check would see the
  padding);
* reductions (``sum``, ``mean``, ``amax``/``amin``, ``any``/``all``, ``var``/``std``,
  ``prod``, ``max``/``min``/``argmax``/``argmin`` with a dim, ``_softmax``/
  ``_log_softmax``, ``native_layer_norm``) over other dims; ``sum``/``any``/``all``/
  ``amax``/``amin``/``prod``/``max``/``min`` over the padded dim or the whole tensor
  with the reduction's identity in the padding (``-0.0`` for float sums: the exact
  additive identity), their results exact; ``mean`` there as that sum divided by the
  true count; ``_softmax``/``_log_softmax`` over the padded dim with ``-inf`` there;
  ``cumsum`` along any dim (a prefix is unchanged by what follows);
* ``mm``/``addmm``/``bmm`` with the padded dim on rows or columns (padded results), or
  contracted on both operands (zeros times zeros: an exact result);
* ``embedding`` with padded indices (the padding reads row 0);
* attention (``torchtpu_attn::flash_fwd`` / ``flash_bwd``, no mask) with queries, keys
  and values padded alike: causal, no valid query sees a key past the length; otherwise
  those keys get a ``-inf`` bias (the log-sum-exp's padding holds ``+inf``, so the
  backward's probabilities are 0 there);
* ``nll_loss`` forward and backward with padded targets set to ``ignore_index``;
  ``embedding_dense_backward``; ``_softmax_backward_data``/``_log_softmax_backward_data``
  along other dims; ``slice_backward`` of a slice of a static dim;
* ``cat`` along another dim of operands padded alike (legacy empty 1-D operands skipped);
  ``cat`` along the padded dim: ``eager.growth``'s append for a whole storage, else an
  ``index_copy`` at the runtime offset; ``constant_pad_nd`` at the end of the padded dim;
* ``arange`` of a recent padded transfer's length (at least 8, one of the last 16:
  position ids) or of a family that made two lengths: made over the capacity.

A family of padded tensors (transfers of one shape but the padded dim and dtype; an
``arange``'s or a fill's arguments) whose storages keep being cut on the device (at
least one cut per padded tensor after two: an encoder's attention mask built by indexing
ops) stops being padded: each such cut compiles per length, so exact tensors cost less
(``metrics()["padded"]["families_off"]``).

Each result is then masked to zeros past ``n`` (``masked_fill`` with a mask made from
``n`` as a runtime value: one executable per capacity) unless the op keeps zeros
(copies, casts, ``cat``).  Anything else *cuts*: ``StorageData.get`` gives the exact
array (cut on the device, or transferred again from the kept host copy), counted in
``metrics()["padded"]["cuts"]`` / ``["host_cuts"]`` and by op in ``["cut_ops"]``.

Values: the valid positions equal the exact executable's up to the order of
floating-point sums where a sum runs over a padded dim (XLA may group a longer sum
differently), and ``-0.0`` may become ``0.0`` where a contraction runs over the padding
(``-0.0 + 0.0``); tests compare against CPU and against the exact path
(``TORCHTPU_PADDED=0``).  Nothing here reads a value on the host: padding and masking
run on the device, with the length as a runtime input.

Counters: ``torchtpu.metrics()["padded"]``.  ``TORCHTPU_PADDED=0`` switches it off.
"""

from __future__ import annotations

import contextlib

import math
import os

import numpy as np
import torch

from torchtpu import _metrics
from torchtpu._device import executable_limit as _executable_limit
from torchtpu._device import runtime
from torchtpu._tensor import storage as _st
from torchtpu.eager import growth as _growth
from torchtpu.eager.modes import CONFIG
from torchtpu.ops._schema import OPT_T, T

M = _metrics.METRICS
NO = _growth.NO  # a rule's answer: not for this call (the executor runs it as usual)
ON = [os.environ.get("TORCHTPU_PADDED", "1") not in ("0", "")]
_ACTIVE = [False]  # a rule is running its capacity call (no rule inside a rule)
_SEEN: dict = {}  # transfer family (dim, shape before, shape after, dtype) -> lengths
_SEEN_LIMIT = 4096
_LENGTHS_LIMIT = 64
# the lengths (>= _SEQ_MIN) of the last _RECENT padded transfers, most recent last: an
# arange or a fill of such a length is padded at once (a short dim of another tensor
# that happens to equal an old length is not)
_LENGTHS: dict = {}
_RECENT = 16
_TRANSFER_MAX = 64 << 20  # larger transfers are never padded (their host copy is kept)
_FAMILIES: dict = {}  # a family of padded tensors (transfers, aranges, fills) -> _Family
_BACK_OFF_AFTER = 2  # padded transfers of a family before its cuts may stop its padding
_SEQ_MIN = 8  # a 2-D integer transfer (batch, length) of at least this length: padded

aten = torch.ops.aten
_masked_fill = aten.masked_fill.Scalar


def set_enabled(enabled: bool) -> None:
    """Switch padded sequences on or off from now on (``TORCHTPU_PADDED`` sets the
    start-up value); storages already padded stay padded (their ops then cut them)."""
    ON[0] = bool(enabled)
    forget()


def forget() -> None:
    """Forget the families and lengths seen so far (which transfers, aranges and fills
    are padded next): as at start-up.  Storages already padded stay padded."""
    _SEEN.clear()
    _FAMILIES.clear()
    _LENGTHS.clear()
    _ARANGE_SEEN.clear()


def enabled() -> bool:
    return ON[0] and not CONFIG.defer and not CONFIG.debug_sync


@contextlib.contextmanager
def exact_transfers():
    """Inside: host-to-tpu transfers are exact tensors, never padded ones (for callers
    that choose their shapes themselves, such as the vLLM plugin's buckets: a padded
    transfer's storage would make their ops' programs depend on this module's state)."""
    saved = _ACTIVE[0]
    _ACTIVE[0] = True
    try:
        yield
    finally:
        _ACTIVE[0] = saved


# --------------------------------------------------------------------------- transfers


def transfer(arr: np.ndarray, dtype: torch.dtype, index: int):
    """The host array ``arr`` (of torch dtype ``dtype``) as a padded ``tpu:index``
    tensor when its shape family has met two lengths along one dim (and only one);
    else None (the caller transfers it exactly)."""
    if not enabled() or arr.ndim == 0 or _ACTIVE[0] or _growth._ACTIVE[0] \
            or dtype.is_floating_point or dtype.is_complex or arr.nbytes > _TRANSFER_MAX:
        return None
    shape = arr.shape
    if arr.ndim == 2 and shape[1] >= _SEQ_MIN and shape[1] > shape[0]:
        dyn = 1  # (batch, length) ids, masks, labels: a sequence from the start
    else:
        dyn = _dynamic_dim(shape, dtype)
    if dyn is None:
        return None
    key = (dyn, shape[:dyn], shape[dyn + 1:], dtype)
    fam = _family(("transfer",) + key)
    if fam is None:
        return None
    return _pad_host(arr, dyn, dtype, index, fam)


def _family(key):
    """The :class:`_Family` of ``key`` with one more padded tensor made, or None when the
    family's padded tensors keep being cut on the device (an attention mask built by
    indexing ops: each cut compiles per length, so exact tensors cost less)."""
    fam = _FAMILIES.get(key)
    if fam is None:
        if len(_FAMILIES) >= _SEEN_LIMIT:
            _FAMILIES.clear()
        fam = _FAMILIES[key] = _Family()
    if fam.transfers >= _BACK_OFF_AFTER and fam.cuts >= fam.transfers:
        if not fam.off:
            fam.off = True
            M.padded["families_off"] += 1
        return None
    fam.transfers += 1
    return fam


class _Family:
    """A family of padded tensors (transfers of a shape but the padded dim and a dtype;
    an ``arange``'s or a fill's arguments): padded tensors made (``transfers``), device
    cuts of the storages computed from them, whether padding stopped."""

    __slots__ = ("transfers", "cuts", "off")

    def __init__(self):
        self.transfers = 0
        self.cuts = 0
        self.off = False


def _dynamic_dim(shape, dtype):
    """The one dim along which transfers of ``shape``'s family met two lengths, or None."""
    dyn = None
    for j, n in enumerate(shape):
        seen = _record_length(_SEEN, (j, shape[:j], shape[j + 1:], dtype), n)
        if len(seen) >= 2 and n >= 2:
            if dyn is not None:
                return None  # more than one dim varies: not a sequence
            dyn = j
    return dyn


def _record_length(table: dict, key, n: int) -> set:
    """Add length ``n`` to ``table[key]`` (a family's lengths, bounded) and return them."""
    seen = table.get(key)
    if seen is None:
        if len(table) >= _SEEN_LIMIT:
            table.clear()
        seen = table[key] = set()
    if n not in seen and len(seen) < _LENGTHS_LIMIT:
        seen.add(n)
    return seen


def _pad_host(arr, dyn, dtype, index, family):
    n = arr.shape[dyn]
    shape = arr.shape
    unit = arr.nbytes // n
    if unit == 0:
        return None
    cap = _growth._capacity(n, unit)
    if cap * unit > _growth.MAX_BYTES:
        return None
    host = np.zeros(shape[:dyn] + (cap,) + shape[dyn + 1:], dtype=arr.dtype)
    host[(slice(None),) * dyn + (slice(0, n),)] = arr
    dev = runtime.jax().device_put(host, runtime.jax_device(index))
    M.padded["transfers"] += 1
    if n >= _SEQ_MIN:
        _LENGTHS.pop(n, None)
        _LENGTHS[n] = True
        if len(_LENGTHS) > _RECENT:
            del _LENGTHS[next(iter(_LENGTHS))]
    st = _st.new_storage(shape, dtype, index,
                         _st.Grown(dev, dyn, n, None, host_copy=arr, family=family))
    return _st.tensor_on(st, shape, _st.contiguous_strides(shape), 0, dtype)


# ------------------------------------------------------------------------------ views


def _padded(t):
    """``(StorageData, Grown)`` of a tensor whose storage is padded, else None."""
    if not isinstance(t, torch.Tensor):
        return None
    sd = getattr(t.untyped_storage(), "_tpu", None)
    if sd is None or sd.arr.__class__ is not _st.Grown:
        return None
    return sd, sd.arr


class Geometry:
    """How a view of a padded storage reads its capacity array.

    Attributes:
        size, stride, offset: the view's geometry over the capacity array (view dim
            ``i`` with ``outer * C * inner`` entries, or ``C - start`` for a view that
            starts at ``start`` along the padded dim).
        i: the view dim that spans the padded dim.
        desc: ``(outer, C, inner)``: view dim ``i`` is the storage dims merged around
            the padded one (``outer``: the product of the merged dims before it,
            ``inner``: after it; 1 and 1 for the padded dim alone).
        start, length: where the view starts along the padded dim and how many entries
            it reads (a view that is not the whole length is moved and masked by
            :meth:`_Call.view`).
    """

    __slots__ = ("size", "stride", "offset", "i", "desc", "start", "length")


def capacity_geometry(t, sd, g):
    """The :class:`Geometry` of view ``t`` of padded storage ``sd`` in its capacity
    array ``g.arr``, or None when ``t`` is not a view the rules take (a window of a few
    entries, a split of the padded dim, another dtype, conj/neg bits, an expand)."""
    if t.dtype is not sd.dtype or t.is_neg() or (t.dtype.is_complex and t.is_conj()):
        return None
    S = sd.shape
    d, n = g.dim, g.n
    if len(S) != len(g.arr.shape) or d >= len(S) or S[d] != n or n < 2:
        return None
    C = g.arr.shape[d]
    Sc = S[:d] + (C,) + S[d + 1:]
    cs = _st.contiguous_strides(S)
    csc = _st.contiguous_strides(Sc)
    off = t.storage_offset()
    coord = [0] * len(S)
    for k, s in enumerate(S):
        if s > 1:
            coord[k], off = divmod(off, cs[k])
    if off:
        return None
    size = list(t.shape)
    stride = tuple(t.stride())
    out = list(stride)
    ext = [0] * len(S)  # per storage dim: the view's extent along it (steps past coord)
    whole = set()  # storage dims merged into one view dim (read whole)
    geo = Geometry()
    geo.i = None
    for j, (sz, st) in enumerate(zip(size, stride)):
        if sz == 1:
            out[j] = 1
            continue
        if st == 0:  # an expand along a static dim
            continue
        if sz == 0 or st < 0:
            return None
        m = None
        for k, s in enumerate(S):  # the storage dim whose steps ``st`` is made of
            if s > 1 and cs[k] <= st < cs[k] * s:
                m = k
                break
        if m is None or st % cs[m] or m in whole:
            return None
        q = st // cs[m]
        if coord[m] + ext[m] + (sz - 1) * q < S[m]:  # a step within dim m
            if m == d:
                if q != 1 or geo.i is not None:
                    return None
                geo.i, geo.desc, geo.start, geo.length = j, (1, C, 1), coord[d], sz
                size[j] = C - coord[d]
            ext[m] += (sz - 1) * q
            out[j] = q * csc[m]
            continue
        if q != 1:
            return None
        k, total = m, S[m]  # storage dims k..m merged into one view dim, whole
        while total < sz and k > 0:
            k -= 1
            total *= S[k]
        group = range(k, m + 1)
        if total != sz or any(coord[x] or ext[x] or x in whole for x in group):
            return None
        whole.update(group)
        out[j] = csc[m]
        if d in group:
            if geo.i is not None:
                return None
            outer = math.prod(S[k:d])
            inner = math.prod(S[d + 1:m + 1])
            geo.i, geo.desc, geo.start, geo.length = j, (outer, C, inner), 0, n
            size[j] = outer * C * inner
    if geo.i is None:
        return None
    # a size-1 dim's stride never addresses anything, but element-wise results follow
    # their operands' strides: the view's own stride where it is a storage dim's (or the
    # whole storage's) step, carried over to the capacity, else a contiguous-like one (the
    # next dim's stride times its size), so results are laid out as PyTorch lays them out
    # ((n, 1) for a (1, n) result, (1, n) for a clone of its transpose, not (1, 1):
    # Dynamo guards on strides)
    total, totalc = math.prod(S), math.prod(Sc)
    for j in range(len(size) - 1, -1, -1):
        if size[j] == 1:
            st = stride[j]
            k = next((k for k in range(len(S)) if S[k] > 1 and cs[k] == st), None)
            if k is not None:
                out[j] = csc[k]
            elif st == total and total > 1:
                out[j] = totalc
            else:
                out[j] = out[j + 1] * max(size[j + 1], 1) if j + 1 < len(size) else 1
    geo.size = tuple(size)
    geo.stride = tuple(out)
    geo.offset = sum(c * s for c, s in zip(coord, csc))
    return geo


_SHIFT_LIMIT = 8  # a view starting at most this far into the padded dim is moved


class _Call:
    """One ruled call: the capacity storages made for its padded arguments (one per
    storage, so aliasing stays visible), and the common padded dim: its ``desc``
    (:class:`Geometry`) and length ``n``."""

    __slots__ = ("caps", "n", "desc", "index", "family")

    def __init__(self):
        self.caps = {}
        self.n = None
        self.desc = None
        self.index = None
        self.family = None  # the transfer family of the first padded operand that has one

    def view(self, t):
        """``(capacity tensor of t, i)``: ``(t, None)`` for a tensor that is not padded;
        None for a view the rules do not take or of another length or layout."""
        p = _padded(t)
        if p is None:
            return t, None
        sd, g = p
        geo = capacity_geometry(t, sd, g)
        if geo is None:
            return None
        moved = geo.start or geo.length != g.n
        if moved and (geo.start > _SHIFT_LIMIT or g.n - geo.length - geo.start > _SHIFT_LIMIT):
            return None  # a window (eager.growth's window reads take it)
        if self.n is None:
            self.n, self.desc, self.index = geo.length, geo.desc, sd.index
        elif self.n != geo.length or self.desc != geo.desc:
            return None
        if self.family is None:
            self.family = g.family
        st = self.caps.get(id(sd))
        if st is None:
            st = self.caps[id(sd)] = _st.new_storage(
                tuple(g.arr.shape), sd.dtype, sd.index, g.arr)
        x = _st.tensor_on(st, geo.size, geo.stride, geo.offset, t.dtype)
        if moved:  # a view from ``start`` or shorter than the storage: moved, masked
            i = geo.i
            if geo.start:
                pad = [0, 0] * (x.dim() - 1 - i) + [0, geo.start]
                x = _pad(x, pad, 0)
            x = _mask(x, i, self.desc, self.n)
        return x, geo.i


# ------------------------------------------------------------------------------ masks

_INVALID = _executable_limit.LRUCache(share=0.01)  # (desc, n, index) -> bool array


def _invalid(desc, n: int, index: int, ndim: int, i: int):
    """A bool tensor of ``ndim`` dims, ``outer * C * inner`` along dim ``i`` and 1
    elsewhere: True at the padding (computed on the device with ``n`` a runtime value)."""
    key = (desc, n, index)
    arr = _INVALID.get(key)
    outer, C, inner = desc
    total = outer * C * inner
    if arr is None:  # (inside a rule: these ops take no rule)
        dev = torch.device("tpu", index)
        pos = torch.arange(total, device=dev)
        if inner > 1:
            pos = torch.div(pos, inner, rounding_mode="floor")
        if outer > 1:
            pos = torch.remainder(pos, C)
        mask = torch.ge(pos, torch.tensor(n).to(dev))
        arr = _INVALID.put(key, _st.data(mask).get())
    t = _st.wrap(arr, index, torch.bool)
    shape = [1] * ndim
    shape[i] = total
    return t.view(shape)


def _mask(r, i, desc, n, fill=0):
    """``r`` (capacity shape) with ``fill`` at the padding of dim ``i``."""
    M.padded["masks"] += 1
    return _masked_fill(r, _invalid(desc, n, _st.data(r).index, r.dim(), i), fill)


def _identity(op_name: str, dtype: torch.dtype):
    """The identity of a reduction (what the padding must hold), or None."""
    if op_name == "any":
        return False
    if op_name == "all":
        return True
    if op_name == "sum":
        return -0.0 if dtype.is_floating_point or dtype.is_complex else 0
    if op_name == "prod":
        return 1
    if op_name in ("amax", "max", "amin", "min"):
        if dtype is torch.bool:
            return op_name in ("amin", "min")
        if dtype.is_complex:
            return None
        if dtype.is_floating_point:
            return float("-inf") if op_name in ("amax", "max") else float("inf")
        info = torch.iinfo(dtype)
        return info.min if op_name in ("amax", "max") else info.max
    return None


def _reshaped(arr, shape):
    """``arr`` (a JAX array) in ``shape`` (same elements, row-major)."""
    if tuple(arr.shape) == tuple(shape):
        return arr
    return runtime.jax().numpy.reshape(arr, shape)


def wrap_result(r, i: int, desc, n: int, family=None):
    """A capacity result ``r`` (zeros at the padding of dim ``i``, laid out by
    ``desc``) as the logical tensor (``outer * n * inner`` entries there) on a padded
    storage, or None where ``r``'s layout is not a dense one this can describe."""
    sd = _st.data(r)
    size = tuple(r.shape)
    if r.storage_offset() or r.dtype is not sd.dtype or math.prod(sd.shape) != r.numel():
        return None
    if sd.shape == size and r.is_contiguous():
        order = tuple(range(len(size)))
    else:
        perm = _st.dense_permutation(size, tuple(r.stride()))
        if perm is None or perm == "nondense":
            return None
        order = tuple(perm)
        if tuple(size[p] for p in order) != sd.shape:
            return None
    phys = sd.shape
    k = order.index(i)
    arr = sd.get()
    if tuple(arr.shape) != phys:
        return None
    outer, C, inner = desc
    before = (outer,) if outer > 1 else ()
    after = (inner,) if inner > 1 else ()
    dim = k + len(before)
    cap_phys = phys[:k] + before + (C,) + after + phys[k + 1:]
    lphys = phys[:k] + before + (n,) + after + phys[k + 1:]
    cs = _st.contiguous_strides(lphys)
    lstride = [0] * len(size)
    for q, p in enumerate(order):
        lstride[p] = cs[q if q < k else q + len(before) + len(after)]
    lsize = size[:i] + (outer * n * inner,) + size[i + 1:]
    st = _st.new_storage(lphys, r.dtype, sd.index,
                         _st.Grown(_reshaped(arr, cap_phys), dim, n, family=family))
    return _st.tensor_on(st, lsize, tuple(lstride), 0, r.dtype)


def _finish(r, i, c, mask=True):
    """The logical padded tensor of capacity result ``r`` (masked first, unless the op
    keeps zeros), or an exact copy where it cannot be wrapped."""
    if mask:
        perm = _st.dense_permutation(tuple(r.shape), tuple(r.stride()))
        if perm is None or perm == "nondense":
            r = _mask(r, i, c.desc, c.n)
        else:  # masked in its physical order, so the result keeps r's layout
            inverse = [0] * len(perm)
            for q, p in enumerate(perm):
                inverse[p] = q
            r = _mask(r.permute(perm), inverse[i], c.desc, c.n).permute(inverse)
    out = wrap_result(r, i, c.desc, c.n, c.family)
    if out is None:  # (not seen in the ruled ops' results; kept exact)
        outer, C, inner = c.desc
        shape = r.shape[:i] + (outer, C, inner) + r.shape[i + 1:]
        out = r.reshape(shape).narrow(i + 1, 0, c.n).reshape(
            r.shape[:i] + (outer * c.n * inner,) + r.shape[i + 1:]).clone()
    return out


# ------------------------------------------------------------------------------ rules


def _tensor_positions(plan):
    return [j for j, k in enumerate(plan.sig.kinds) if k in (T, OPT_T)]


def _run_capacity(plan, vals):
    """``plan``'s op on ``vals`` (capacity views), through the executor's own path
    (``run`` has set ``_ACTIVE``; growth's rules are kept off too)."""
    grow = _growth._ACTIVE[0]
    _growth._ACTIVE[0] = True
    try:
        r = plan._run(vals)
    finally:
        _growth._ACTIVE[0] = grow
    M.padded["runs"] += 1
    return r


def _pointwise_rule(plan, vals):
    """Element-wise ops, and ops element-wise but along one static dim (softmax
    backward): see the module docstring."""
    c = _Call()
    new = list(vals)
    tensors = [j for j in _tensor_positions(plan) if isinstance(vals[j], torch.Tensor)]
    out_ndim = max((vals[j].dim() for j in tensors), default=0)
    i_out = None
    others = []
    for j in tensors:
        v = c.view(vals[j])
        if v is None:
            return NO
        t, i = v
        if i is None:
            others.append(j)
            continue
        a = i + out_ndim - vals[j].dim()
        if i_out is None:
            i_out = a
        elif a != i_out:
            return NO
        new[j] = t
    if i_out is None:
        return NO
    for pos in others:
        t = vals[pos]
        j = i_out - (out_ndim - t.dim())
        if j < 0 or t.shape[j] == 1:
            continue
        new[pos] = _expanded(t, j, c)
        if new[pos] is None:
            return NO  # spans the padded dim without padding (or a broadcast error)
    if plan.pad_rowdim is not None and vals[plan.pad_rowdim] % max(out_ndim, 1) == i_out:
        return NO
    mutated = plan.sig.mutated
    if mutated:
        if plan.sig.out_args or mutated != [0]:
            return NO
        self_ = vals[0]
        p = _padded(self_)
        if p is None or len(_st.view_spec(self_, p[0])) != 2 or self_.dim() != out_ndim \
                or p[1].n != c.n:
            return NO
    if plan.pad_name == "_to_copy" and not _stays_on_tpu(plan, vals):
        return NO
    if plan.divides and any(not (vals[j].dtype.is_floating_point or vals[j].dtype.is_complex)
                            for j in tensors):
        return NO  # an integer divisor's zero check would see the padding
    r = _run_capacity(plan, new)
    if mutated:
        sd, g = _padded(vals[0])
        masked = _mask(new[0], i_out, c.desc, c.n)
        sd.arr = _st.Grown(_st.data(masked).get(), g.dim, g.n, family=g.family)
        return vals[0]
    if isinstance(r, tuple):  # (frexp: mantissa and exponent)
        return tuple(_finish(o, i_out, c, mask=plan.pad_masks) for o in r)
    return _finish(r, i_out, c, mask=plan.pad_masks)


def _isin_rule(plan, vals):
    """``isin(elements, test_elements)``: element-wise in ``elements`` (run over its
    capacity, the result masked); ``test_elements`` is a set, never padded (a padded one
    is cut: its padding would be tested as values)."""
    elements, test = vals[0], vals[1]
    if not isinstance(elements, torch.Tensor) or not isinstance(test, torch.Tensor):
        return NO
    c = _Call()
    v, w = c.view(elements), c.view(test)
    if v is None or w is None or v[1] is None or w[1] is not None:
        return NO
    new = list(vals)
    new[0] = v[0]
    return _finish(_run_capacity(plan, new), v[1], c, mask=plan.pad_masks)


def _expanded(t, j, c):
    """An exact tensor expanded along dim ``j`` (stride 0, the call's logical length: a
    sum's gradient) as the same expand over the capacity, or None."""
    outer, C, inner = c.desc
    if t.stride(j) != 0 or t.shape[j] != outer * c.n * inner:
        return None
    size = list(t.shape)
    size[j] = outer * C * inner
    return _st.tensor_on(t.untyped_storage(), size, t.stride(), t.storage_offset(), t.dtype)


def _reduce_dims(dims, ndim):
    if dims is None:
        return None
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return None
    return sorted({d % ndim if ndim else 0 for d in dims})


def _reduction_rule(plan, vals):
    """Reductions and normalizations (see the module docstring)."""
    if plan.sig.mutated:
        return NO
    name = plan.pad_name
    x = vals[0]
    c = _Call()
    v = c.view(x)
    if v is None or v[1] is None:
        return NO
    t, i = v
    for j in _tensor_positions(plan)[1:]:  # weights (layer norm), never padded
        if _padded(vals[j]) is not None:
            return NO
    ndim = x.dim()
    new = list(vals)
    new[0] = t
    if name in ("_softmax", "_log_softmax"):
        if not x.dtype.is_floating_point:
            return NO  # (PyTorch's error for integer inputs)
        if vals[1] % max(ndim, 1) == i:
            new[0] = _mask(t, i, c.desc, c.n, float("-inf"))
        return _finish(_run_capacity(plan, new), i, c)
    if name == "cumsum":
        if vals[1] % max(ndim, 1) == i and c.desc != (1, c.desc[1], 1):
            return NO  # (a scan along merged dims would run into the padding)
        return _finish(_run_capacity(plan, new), i, c)
    if name == "native_layer_norm":
        if i >= ndim - len(vals[1]):
            return NO
        return tuple(_finish(o, i, c) for o in _run_capacity(plan, new))
    # a reduction over dims (None: all)
    pos = plan.pad_dim_arg
    dims = _reduce_dims(vals[pos], ndim) if pos is not None else None
    keep = bool(vals[plan.pad_keep_arg]) if plan.pad_keep_arg is not None else False
    if dims is not None and i not in dims:
        r = _run_capacity(plan, new)
        i_out = i if keep else i - sum(1 for d in dims if d < i)
        if isinstance(r, tuple):
            return tuple(_finish(o, i_out, c) for o in r)
        return _finish(r, i_out, c)
    if name == "mean":
        return _mean(plan, vals, t, i, c, dims, keep)
    fill = _identity(name, x.dtype)
    if fill is None:
        return NO
    new[0] = _mask(t, i, c.desc, c.n, fill)
    return _run_capacity(plan, new)  # reduced over the padded dim: an exact result


_OPMATH = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _mean(plan, vals, t, i, c, dims, keep):
    """``mean`` over the padded dim: the sum over the capacity (``-0.0`` in the padding)
    divided by the true count (a runtime value), as the lowering divides its sum."""
    x = vals[0]
    out = vals[plan.sig.names.index("dtype")] or x.dtype
    if not (out.is_floating_point or out.is_complex) or x.dtype.is_complex:
        return NO  # (PyTorch's error, or complex: not ruled)
    acc = _OPMATH.get(out, out)
    ndim = x.dim()
    dims = list(range(ndim)) if dims is None else dims
    count = math.prod(x.shape[d] for d in dims)
    if count == 0:
        return NO
    filled = _mask(t, i, c.desc, c.n, -0.0)
    s = aten.sum.dim_IntList(filled, dims, keep, dtype=acc)
    r = aten.div.Tensor(s, torch.tensor(count, dtype=acc).to(x.device))
    if r.dtype is not out:
        r = r.to(out)
    M.padded["runs"] += 1
    return r


def _mm_rule(plan, vals):
    """``mm``/``addmm``/``bmm`` (see the module docstring)."""
    if plan.sig.mutated:
        return NO
    name = plan.pad_name
    first = 1 if name == "addmm" else 0
    a, b = vals[first], vals[first + 1]
    c = _Call()
    va, vb = c.view(a), c.view(b)
    if va is None or vb is None:
        return NO
    (ta, ia), (tb, ib) = va, vb
    nd = a.dim()
    row, col = nd - 2, nd - 1
    new = list(vals)
    new[first], new[first + 1] = ta, tb
    if name == "addmm" and _padded(vals[0]) is not None:
        return NO
    if ia == col and ib == row:  # contracted over the padding: zeros times zeros
        return _run_capacity(plan, new)
    if nd == 3 and (ia == 0 or ib == 0):  # the batch dim: padded on both
        if ia != 0 or ib != 0:
            return NO
        i_out = 0
    elif ia is not None and ib is not None:
        return NO
    elif ia is not None:
        if ia == col:
            return NO
        i_out = ia
    elif ib is not None:
        if ib == row:
            return NO
        i_out = ib
    else:
        return NO
    if name == "addmm":
        bias = vals[0]
        if i_out == 0 and bias.dim() == 2 and bias.shape[0] != 1 \
                or i_out == 1 and bias.dim() >= 1 and bias.shape[-1] != 1:
            return NO
    return _finish(_run_capacity(plan, new), i_out, c)


def _embedding_rule(plan, vals):
    """``embedding(weight, indices, ...)`` with padded indices (the padding reads row 0)."""
    if _padded(vals[0]) is not None:
        return NO
    return _one_padded(plan, vals, 1)


def _one_padded(plan, vals, j, mask=True):
    """``plan``'s op with its ``j``-th argument (padded) read from the capacity: the
    result padded along the same dim."""
    c = _Call()
    v = c.view(vals[j])
    if v is None or v[1] is None:
        return NO
    new = list(vals)
    new[j] = v[0]
    return _finish(_run_capacity(plan, new), v[1], c, mask=mask)


def _stays_on_tpu(plan, vals) -> bool:
    """Whether a ``device``/``memory_format`` op (``_to_copy``, ``*_like``) keeps its
    result on ``tpu`` in a layout the rules describe."""
    dev = vals[plan.sig.names.index("device")]
    fmt = vals[plan.sig.names.index("memory_format")]
    return (dev is None or torch.device(dev).type == "tpu") and fmt in (
        None, torch.preserve_format, torch.contiguous_format)


def _embedding_backward_rule(plan, vals):
    """``embedding_dense_backward(grad, indices, num_weights, padding_idx, scale)``
    with grad and indices padded alike: the padding adds zero rows to row 0 (an exact
    result); not with ``scale_grad_by_freq`` (the padding would count)."""
    if vals[4]:
        return NO
    c = _Call()
    g, ix = c.view(vals[0]), c.view(vals[1])
    if g is None or ix is None or ix[1] is None or g[1] != ix[1]:
        return NO
    new = list(vals)
    new[0], new[1] = g[0], ix[0]
    return _run_capacity(plan, new)


def _nll_rule(plan, vals):
    """``nll_loss_forward(x, target, weight, reduction, ignore_index)`` and its backward
    ``(grad, x, target, weight, reduction, ignore_index, total_weight)`` with the rows
    padded alike: padded targets become ``ignore_index`` (sums and the mean's count
    leave them out)."""
    bwd = plan.pad_name == "nll_loss_backward"
    xi, ti = (1, 2) if bwd else (0, 1)
    x, target = vals[xi], vals[ti]
    if x.dim() != 2 or _padded(vals[xi + 2]) is not None:
        return NO
    c = _Call()
    vx, vt = c.view(x), c.view(target)
    if vx is None or vt is None or vx[1] != 0 or vt[1] != 0:
        return NO
    new = list(vals)
    new[xi] = vx[0]
    ignore = vals[ti + 3]
    new[ti] = _mask(vt[0], 0, c.desc, c.n, ignore)
    reduction = vals[ti + 2]
    if bwd:
        if reduction == 0:  # 'none': the incoming gradient is padded per row
            g = c.view(vals[0])
            if g is None or g[1] != 0:
                return NO
            new[0] = g[0]
        elif _padded(vals[0]) is not None:
            return NO
        return _finish(_run_capacity(plan, new), 0, c)
    out, total = _run_capacity(plan, new)
    if reduction == 0:
        out = _finish(out, 0, c)
    return out, total


def _attention_rule(plan, vals):
    """``flash_fwd(q, k, v, None, is_causal, scale)`` padded alike along dim -2 (4-D):
    causal, no valid query sees a padded key; otherwise the keys past the length get a
    ``-inf`` bias.  The log-sum-exp's padding holds +inf, so the backward's
    probabilities are 0 there."""
    q, k, v, bias, is_causal = vals[:5]
    if bias is not None or q.dim() != 4:
        return NO
    c = _Call()
    new = list(vals)
    for j in range(3):
        w = c.view(vals[j])
        if w is None or w[1] != 2:
            return NO
        new[j] = w[0]
    if not is_causal:
        new[3] = _key_bias(c, q.dtype)
    out, lse = _run_capacity(plan, new)
    return _finish(out, 2, c), _finish_lse(lse, c)


def _key_bias(c, dtype):
    """An additive attention bias over the capacity's keys: 0, ``-inf`` past the length
    (float64 for float64 attention, else float32, as ``eager.growth``'s)."""
    bt = torch.float64 if dtype == torch.float64 else torch.float32
    inv = _invalid(c.desc, c.n, c.index, 1, 0)
    zeros = torch.zeros(inv.shape, dtype=bt, device=inv.device)
    return _masked_fill(zeros, inv, float("-inf"))


def _finish_lse(lse, c):
    out = wrap_result(_mask(lse, 2, c.desc, c.n, float("inf")), 2, c.desc, c.n, c.family)
    return lse.narrow(2, 0, c.n).clone() if out is None else out


def _attention_backward_rule(plan, vals):
    """``flash_bwd(dO, q, k, v, None, out, lse, is_causal, scale, False)`` of an
    attention padded alike: the padded rows of dO, q, k, v, out are zeros and the
    log-sum-exp's +inf, so no padded entry adds to a valid gradient (not causal: the
    forward's key bias again)."""
    if vals[4] is not None or vals[9] or vals[10] or vals[1].dim() != 4:
        return NO
    c = _Call()
    new = list(vals)
    for j in (1, 2, 3, 5, 6, 0):
        w = c.view(vals[j])
        if j == 0 and w is not None and w[1] is None:  # dO of a sum: expanded over rows
            w = _expanded(vals[0], 2, c), 2
        if w is None or w[1] != 2 or w[0] is None:
            return NO
        new[j] = w[0]
    if not vals[7]:  # not causal: the forward's key bias
        new[4] = _key_bias(c, vals[1].dtype)
    outs = _run_capacity(plan, new)
    return tuple(_finish(o, 2, c) if j < 3 else o for j, o in enumerate(outs))


def _cat_rule(plan, vals):
    """``cat`` of operands padded alike along another dim; one padded operand beside
    legacy empty 1-D ones (a lazily initialized cache) is copied."""
    tensors, dim = vals[0], vals[1]
    keep = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]
    if not keep or _padded(keep[0]) is None:
        return NO
    if len(keep) == 2 and _padded(keep[1]) is None:  # an append along the padded dim
        a, b = keep
        if len(_st.view_spec(a, _st.data(a))) == 2:
            return NO  # a whole storage: eager.growth's append (which also regrows)
        c = _Call()
        v = c.view(a)
        nd = a.dim()
        if v is None or v[1] is None or b.dim() != nd or not -nd <= dim < nd \
                or dim % nd != v[1] or a.dtype is not b.dtype or b.shape[v[1]] == 0 \
                or any(a.shape[j] != b.shape[j] for j in range(nd) if j != v[1]):
            return NO
        r = _append(c, v[0], v[1], b)
        return NO if r is None else r
    c = _Call()
    new = []
    i_out = None
    for t in keep:
        v = c.view(t)
        if v is None or v[1] is None:
            return NO
        if i_out is None:
            i_out = v[1]
        elif v[1] != i_out:
            return NO
        new.append(v[0])
    nd = keep[0].dim()
    if any(t.dim() != nd for t in keep) or not -nd <= dim < nd:
        return NO
    if dim % nd == i_out and len(keep) > 1:
        return NO  # along the padded dim: eager.growth's append
    return _finish(_run_capacity(plan, [new, dim % nd]), i_out, c, mask=False)


def _append(c, a, i, b):
    """``cat([a, b], i)`` along the padded dim of ``a`` (its capacity tensor ``a``, length
    ``c.n``) with ``b`` exact: ``b`` written at the runtime offset ``n`` (``index_copy``:
    one executable per capacity), or None where the capacity is full."""
    outer, C, inner = c.desc
    k = b.shape[i]
    if outer * inner != 1 or c.n + k > C:
        return None
    pos = torch.arange(c.n, c.n + k).to(a.device)  # (a runtime input: not padded)
    r = aten.index_copy.default(a, i, pos, b)
    M.padded["appends"] += 1
    c.n += k
    return _finish(r, i, c, mask=False)


def _pad_rule(plan, vals):
    """``constant_pad_nd(x, pad, value)``: static dims as they are; along the padded dim
    (unmerged) only at its end by ``k``: ``value`` written at ``n .. n+k-1`` (HF's loss
    pads the labels by one), the length becomes ``n + k``."""
    x, pad = vals[0], list(vals[1])
    c = _Call()
    v = c.view(x)
    if v is None or v[1] is None:
        return NO
    t, i = v
    nd = x.dim()
    if len(pad) % 2 or len(pad) > 2 * nd or any(p < 0 for p in pad):
        return NO
    before = after = 0
    j = nd - 1 - i
    if 2 * j < len(pad):
        before, after = pad[2 * j], pad[2 * j + 1]
    if before or (after and c.desc[0] * c.desc[2] != 1):
        return NO
    outer, C, inner = c.desc
    if c.n + after > C:
        return NO
    new = list(vals)
    new[0] = t
    if after:
        p = list(pad)
        p[2 * j + 1] = 0
        new[1] = p
    r = _run_capacity(plan, new) if any(new[1]) else t
    if after:  # value at n .. n+after-1: past the old length, before the new one
        inv_old = _invalid(c.desc, c.n, c.index, r.dim(), i)
        inv_new = _invalid(c.desc, c.n + after, c.index, r.dim(), i)
        r = _masked_fill(_mask(r, i, c.desc, c.n), inv_old & ~inv_new, vals[2])
    c.n += after
    return _finish(r, i, c, mask=False) if after else _finish(r, i, c)


_ARANGE_SEEN: dict = {}  # (op, start, step, dtype, device) -> lengths made


def _arange_rule(plan, vals):
    """``arange(start, end, step)`` of integer ``start``/``step`` whose family (the same
    op, start, step, dtype and device) has made two lengths: made over the capacity
    (``start + i * step`` for ``i < C``, then masked), so the ops on it run padded."""
    if plan.pad_name != "arange" or plan.sig.mutated:
        return NO
    names = plan.sig.names
    arg = dict(zip(names, vals))
    start, end, step = arg.get("start", 0), arg["end"], arg.get("step", 1)
    dtype, device = arg["dtype"], arg["device"]
    if not all(x.__class__ is int for x in (start, end, step)) or step == 0:
        return NO
    if dtype is None:
        dtype = torch.int64  # (integer start, end and step)
    if dtype not in (torch.int64, torch.int32, torch.float32, torch.float64):
        return NO
    n = -(-(end - start) // step)
    if n < 2:
        return NO
    key = (plan.op, start, step, dtype, str(device))
    seen = _record_length(_ARANGE_SEEN, key, n)
    if len(seen) < 2 and n not in _LENGTHS:
        return NO  # (positions of a padded transfer's length are padded at once)
    fam = _family(key)
    if fam is None:
        return NO
    if n * dtype.itemsize > _growth.MAX_BYTES // 2:
        return NO
    C = _growth._capacity(n, dtype.itemsize)
    end_c = start + C * step
    if dtype is torch.int32 and not -2**31 <= end_c < 2**31:
        return NO
    new = list(vals)
    new[names.index("end")] = end_c
    r = _run_capacity(plan, new)
    c = _Call()
    c.n, c.desc, c.index, c.family = n, (1, C, 1), _st.data(r).index, fam
    return _finish(r, 0, c)


def _slice_backward_rule(plan, vals):
    """``slice_backward(grad, input_sizes, dim, ...)`` of a slice along a static dim
    (rotary embeddings' halves): the same over the capacity."""
    c = _Call()
    v = c.view(vals[0])
    if v is None or v[1] is None:
        return NO
    t, i = v
    sizes = list(vals[1])
    if len(sizes) != t.dim() or vals[2] % len(sizes) == i:
        return NO
    outer, C, inner = c.desc
    if sizes[i] != outer * c.n * inner:
        return NO
    sizes[i] = outer * C * inner
    new = list(vals)
    new[0], new[1] = t, sizes
    return _finish(_run_capacity(plan, new), i, c, mask=False)


def _full_rule(plan, vals):
    """``ones``/``zeros``/``full`` on ``tpu`` of a size with exactly one dim equal to a
    padded transfer's length (``generate()``'s default attention mask
    ``torch.ones(input_ids.shape[:2])``): made over the capacity along that dim."""
    names = plan.sig.names
    size = list(vals[names.index("size")])
    dev = vals[names.index("device")]
    if dev is not None and torch.device(dev).type != "tpu" or not _LENGTHS:
        return NO
    hits = [j for j, k in enumerate(size) if k in _LENGTHS]
    if len(hits) != 1 or any(k.__class__ is not int or k < 0 for k in size):
        return NO
    i = hits[0]
    n = size[i]
    unit = math.prod(size) // n * 8
    if n < 2 or unit == 0 or n * unit > _growth.MAX_BYTES // 2:
        return NO
    fam = _family((plan.op, tuple(size[:i]), tuple(size[i + 1:]), str(dev)))
    if fam is None:
        return NO
    C = _growth._capacity(n, unit)
    new = list(vals)
    size[i] = C
    new[names.index("size")] = size
    r = _run_capacity(plan, new)
    c = _Call()
    c.n, c.desc, c.index, c.family = n, (1, C, 1), _st.data(r).index, fam
    return _finish(r, i, c, mask=plan.pad_name != "zeros")


def _copy_rule(plan, vals):
    """``copy_(dst, src)``: into a padded whole ``dst`` element-wise; a padded ``src``
    into an uninitialized whole ``dst`` of its shape and dtype (an ``out=`` result,
    ``torch.isin``'s) gives ``dst`` the padded copy."""
    dst, src = vals[0], vals[1]
    if _padded(dst) is not None:
        return _pointwise_rule(plan, vals)
    sd = _st.data(dst)
    if sd.arr is not None or len(_st.view_spec(dst, sd)) != 2 or dst.dtype is not src.dtype \
            or tuple(dst.shape) != tuple(src.shape):
        return NO
    c = _Call()
    v = c.view(src)
    if v is None or v[1] is None or c.desc[0] * c.desc[2] != 1:
        return NO
    t, i = v
    tmp = _st.empty(tuple(t.shape), dst.dtype, sd.index)
    new = list(vals)
    new[0], new[1] = tmp, t
    _run_capacity(plan, new)
    sd.arr = _st.Grown(_st.data(tmp).get(), i, c.n, family=c.family)
    return dst


def _like_rule(plan, vals):
    """``zeros_like``/``ones_like``/``full_like`` of a padded tensor (on ``tpu``): the same
    over the capacity (``generate()`` makes its attention mask with ``ones_like``)."""
    if not _stays_on_tpu(plan, vals):
        return NO
    return _one_padded(plan, vals, 0, mask=plan.pad_name != "zeros_like")


_REDUCTIONS = {  # name -> the overloads ruled (reductions with dim / keepdim arguments)
    "sum": ("default", "dim_IntList"), "mean": ("default", "dim"), "amax": ("default",),
    "amin": ("default",), "any": ("default", "dim", "dims"), "all": ("default", "dim", "dims"),
    "prod": ("default", "dim_int"), "var": ("correction",), "std": ("correction",),
    "max": ("default", "dim"), "min": ("default", "dim"), "argmax": ("default",),
    "argmin": ("default",),
}
_NORMS = ("_softmax", "_log_softmax", "cumsum", "native_layer_norm")
_ROWWISE = {"_softmax_backward_data": 2, "_log_softmax_backward_data": 2}
_DIVIDES = ("div", "div_", "remainder", "remainder_", "fmod", "fmod_", "floor_divide",
            "floor_divide_", "true_divide", "true_divide_")
_KEEPS_ZEROS = ("clone", "_to_copy")
_pad = aten.constant_pad_nd.default


def rule_for(plan):
    """The padded-sequence rule of executor plan ``plan`` (``rule(plan, vals) -> result
    or NO``), or None; sets the plan's rule parameters."""
    op = plan.op
    fop = plan.fsig.op
    name = fop._schema.name.split("::")[1]
    overload = fop._overloadname
    plan.pad_name = name
    plan.pad_masks = name not in _KEEPS_ZEROS
    plan.divides = name in _DIVIDES
    plan.pad_rowdim = _ROWWISE.get(name)
    plan.pad_factory = False
    if op is not fop and plan.sig.out_args:
        return None
    if str(fop) == "torchtpu_attn.flash_fwd.default":
        return _attention_rule
    if str(fop) == "torchtpu_attn.flash_bwd.default":
        return _attention_backward_rule
    if fop is aten.copy.default and op is not fop and not plan.sig.out_args:
        return _copy_rule
    if op is not fop:  # in-place
        pointwise = torch.Tag.pointwise in fop.tags
        return _pointwise_rule if pointwise and name not in _DIVIDES else None
    if fop in (aten.arange.start_step, aten.arange.start, aten.arange.default):
        plan.pad_factory = True
        return _arange_rule
    if fop is aten.cat.default:
        return _cat_rule
    if fop is aten.constant_pad_nd.default:
        return _pad_rule
    if fop in (aten.zeros_like.default, aten.ones_like.default, aten.full_like.default):
        return _like_rule
    if fop in (aten.ones.default, aten.zeros.default, aten.full.default):
        plan.pad_factory = True
        return _full_rule
    if fop is aten.slice_backward.default:
        return _slice_backward_rule
    if name in ("mm", "bmm") and overload == "default" or fop is aten.addmm.default:
        return _mm_rule
    if fop is aten.embedding.default:
        return _embedding_rule
    if fop is aten.isin.Tensor_Tensor:
        return _isin_rule
    if fop is aten.embedding_dense_backward.default:
        return _embedding_backward_rule
    if fop in (aten.nll_loss_forward.default, aten.nll_loss_backward.default):
        return _nll_rule
    if name in _NORMS:
        return _reduction_rule
    if name in _ROWWISE:
        return _pointwise_rule
    if overload in _REDUCTIONS.get(name, ()):
        names = plan.sig.names
        plan.pad_dim_arg = names.index("dim") if "dim" in names else None
        plan.pad_keep_arg = names.index("keepdim") if "keepdim" in names else None
        return _reduction_rule
    if fop is aten._to_copy.default or (torch.Tag.pointwise in fop.tags
                                        and torch.Tag.nondeterministic_seeded not in fop.tags):
        return _pointwise_rule
    return None


def run(plan, vals):
    """The executor's entry: ``plan.pad(plan, vals)`` when a padded storage may be among
    the arguments, else NO."""
    if _ACTIVE[0] or _growth._ACTIVE[0] or not (_st.GROWN_MADE[0] or plan.pad_factory) \
            or not enabled():
        return NO
    _ACTIVE[0] = True  # the rule's own ops (masks, copies, capacity calls) take no rule,
    try:  # no shape bucket (they pad through the host) and no padded transfer
        return plan.pad(plan, vals)
    finally:
        _ACTIVE[0] = False
