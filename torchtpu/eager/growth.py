"""Growing tensors: a tensor that grows by ``torch.cat`` each step is held with spare
capacity, so a decoding loop does not compile an executable per length.

Why: HF's ``DynamicCache`` appends each new token's keys and values with
``torch.cat([cache, new], dim=-2)``, and ``generate()`` appends each token to
``input_ids`` and ``attention_mask`` the same way.  Per-op executables are compiled for
exact shapes, so every new length compiled the ``cat``, the attention over the cache and
every small read of the ids again (``generate(max_new_tokens=64)`` of a 2-layer Llama:
617 compiles, ~9 per token).

What: ``cat([a, b], dim)`` whose ``a`` is the result of an earlier such ``cat`` (a
*chain*: the same shapes but for ``dim``, the same ``b`` shape, and ``a``'s length along
``dim`` one of the lengths such cats produced) returns a tensor whose storage holds a
:class:`~torchtpu._tensor.storage.Grown` array: capacity along ``dim`` for the next
power of two above its length, at least 128 entries where those take at most 16 MiB
(zeros past the length).  From then on, in STRICT and DEBUG:

* ``cat([grown, b], dim)`` writes ``b`` into the spare capacity at the runtime offset
  (``index_copy`` with the positions as a runtime input): one executable per capacity,
  not per length; when the capacity is full it doubles (``constant_pad_nd``, one
  executable per capacity pair);
* attention (``torchtpu_attn::flash_fwd``, what ``scaled_dot_product_attention``
  lowers to) whose keys and values are grown storages of one length runs over the whole
  capacity with an additive mask that is ``-inf`` at positions past the length (the
  mask computed from the length as a runtime value);
* any window view of a grown storage (``ids[:, -1]``, ``mask[:, -1:]``) reads the
  capacity array at runtime starts (``storage.grown_view_spec``): one executable;
* every other read gets the exact array, cut from the capacity on the device
  (``StorageData.get``, counted as ``cuts``), as does every write (the storage then
  stays exact); ``.cpu()`` cuts on the host.  The chain's next cat grows it again; a
  chain cut twice (read whole every step, e.g. an attention mask turned into a bias) goes
  on as ordinary exact cats, and a family whose chains are mostly cut (at least 4 cuts,
  and half as many as chains started: a beam search reorders its cache each step) starts
  no more chains.

Values: ``cat`` and the window reads are exact copies; masked attention adds exact zeros
for the masked positions, so it equals the exact executable's result up to the order of
the floating-point sums (it is compared against CPU with the usual tolerances).  A
reduction fused with a window read may also round differently (1 ulp seen: the sum of a
``(2, 2, 1, 1)`` window read from a ``(2, 2, 128, 1)`` capacity array), since XLA's
reduction order depends on the fused input's shape.  Results
keep their logical shape, strides and device bytes (``memory_allocated`` counts the
logical bytes; the capacity array may be up to twice as large on the device).

Not grown: DeferAndFuse (its fused segments already hold the whole step), ``cat`` of
more than two tensors, of mixed dtypes or devices, or whose first tensor is a view;
tensors over ``MAX_BYTES``.  ``TORCHTPU_GROWTH=0`` switches growth off.

Counters: ``torchtpu.metrics()["growth"]`` (see ``torchtpu._metrics``).
"""

from __future__ import annotations

import os
import weakref

import torch

from torchtpu import _metrics
from torchtpu._tensor import storage as _st
from torchtpu.eager.modes import CONFIG

M = _metrics.METRICS
NO = object()  # a rule's answer: not for this call (the executor runs it as usual)
ON = [os.environ.get("TORCHTPU_GROWTH", "1") not in ("0", "")]
MAX_BYTES = 1 << 30  # capacity arrays above this many bytes are not made
_MIN_CAPACITY = 128
_SMALL_BYTES = 16 << 20

# family key -> _Family: the lengths along dim such cats produced, starts and cuts
_MADE: dict = {}
# exact storages that were grown (cut) -> their Chain; weakly held
_CUT = weakref.WeakKeyDictionary()
_CUT_LIMIT = 2  # a chain cut this often goes on as exact cats
_PLANS = weakref.WeakSet()  # executor plans of the ruled ops (see watch)
_CHAIN_LIMIT = 4096
_LENGTH_LIMIT = 4096
_ACTIVE = [False]  # a rule is running its replacement ops (no rule inside a rule)

_cat = torch.ops.aten.cat.default
_index_copy = torch.ops.aten.index_copy.default
_pad = torch.ops.aten.constant_pad_nd.default


def set_enabled(enabled: bool) -> None:
    """Switch growth on or off for cats and reads from now on (``TORCHTPU_GROWTH``
    sets the start-up value); storages already grown keep their capacity."""
    ON[0] = bool(enabled)
    _MADE.clear()
    _CUT.clear()
    # the rules run only when a call misses the executor's hot path: forget the hot
    # entries of the ruled ops, so cats that ran while growth was off reach the rule
    for plan in list(_PLANS):
        if plan.hot is not None:
            plan.hot.clear()


def watch(plan) -> None:
    """Remember ``plan`` (an executor plan whose op has a rule, with a ``hot`` table
    or None) for :func:`set_enabled`."""
    _PLANS.add(plan)


def rule_for(op):
    """The growth rule of ``op`` (``rule(plan, vals) -> result or NO``), or None."""
    if op is _cat:
        return _cat_rule
    if str(op) == "torchtpu_attn.flash_fwd.default":
        _FLASH[0] = op
        return _attention_rule
    return None


def min_capacity(unit: int) -> int:
    """The least capacity of a growing tensor whose entries are ``unit`` bytes each: 128
    while that costs at most ``_SMALL_BYTES`` (fewer capacities, so fewer executables,
    for short sequences: a 12-token prompt and 64 new tokens need one capacity instead
    of four), else 1.  Shared by ``compile.seq_buckets`` (compiled decoding steps)."""
    return _MIN_CAPACITY if _MIN_CAPACITY * unit <= _SMALL_BYTES else 1


def _capacity(n: int, unit: int) -> int:
    """The capacity for ``n`` entries of ``unit`` bytes each: a power of two above ``n``,
    and at least :func:`min_capacity`."""
    return max(1 << n.bit_length(), min_capacity(unit))


def _unit(a, n: int) -> int:
    """Bytes per entry along the growing dim of ``a`` (length ``n > 0`` there)."""
    return a.numel() // n * a.dtype.itemsize


def _whole(t, sd) -> bool:
    """Whether ``t`` reads its whole storage, contiguous, in the storage's dtype, without
    conj/neg bits (``storage.view_spec``'s short form)."""
    return len(_st.view_spec(t, sd)) == 2


def _concrete(a) -> bool:
    return a is not None and a.__class__ not in (_st.Lazy, _st.Padded)


def _cat_rule(plan, vals):
    """``cat([a, b], dim)``: an append into ``a``'s spare capacity, a chain's start, or
    NO (see the module docstring)."""
    if not ON[0] or CONFIG.defer or _ACTIVE[0]:
        return NO
    tensors, dim = vals[0], vals[1]
    if len(tensors) != 2:
        return NO
    a, b = tensors
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return NO
    sa = getattr(a.untyped_storage(), "_tpu", None)
    sb = getattr(b.untyped_storage(), "_tpu", None)
    nd = a.dim()
    if sa is None or sb is None or sa.index != sb.index or nd == 0 or b.dim() != nd \
            or a.dtype is not b.dtype or not -nd <= dim < nd:
        return NO
    d = dim % nd
    sa_shape, sb_shape = tuple(a.shape), tuple(b.shape)
    if sa_shape[:d] != sb_shape[:d] or sa_shape[d + 1:] != sb_shape[d + 1:] \
            or sb_shape[d] == 0 or not _whole(a, sa):
        return NO
    n, k = sa_shape[d], sb_shape[d]
    g = sa.arr
    if g.__class__ is _st.Lazy and g.node is _st.ASYNC:  # a pending first call's value
        g = sa.get()
    grown = g.__class__ is _st.Grown
    if grown and g.dim != d or not grown and (not _concrete(g) or n == 0):
        return NO
    key = (sa_shape[:d], sa_shape[d + 1:], d, a.dtype, sb_shape, sa.index)
    fam = _MADE.get(key)
    if fam is None:
        if len(_MADE) >= _CHAIN_LIMIT:
            _MADE.clear()
        fam = _MADE[key] = _Family()
    made = fam.made
    grows = n in made  # a is (by its length) what such a cat made: a chain
    # every length such a cat made is kept (up to _LENGTH_LIMIT): a call of the
    # executor's hot path does not reach this rule, so a second generate() with the same
    # prompt length starts its chains at the same step as the first
    if len(made) >= _LENGTH_LIMIT:
        made.clear()
    made.add(n + k)
    if grown:
        return _append(a, sa, g.arr, b, d, n, k, g.chain)
    chain = _CUT.get(sa)
    if chain is not None and chain.cuts >= _CUT_LIMIT:
        # a chain that keeps being read whole (an attention mask turned into a bias each
        # step): grown again it would cost a capacity and a cut per length; it goes on
        # as exact cats, remembered as the same chain
        _ACTIVE[0] = True
        try:
            out = _cat([a, b], d)
        finally:
            _ACTIVE[0] = False
        _CUT[_st.data(out)] = chain
        return out
    if not grows:  # an ordinary cat, remembered
        return NO
    if fam.cuts >= _CUT_LIMIT * 2 and fam.cuts * 2 >= fam.starts:
        # most chains of this family were cut soon after they started (a beam search
        # reorders its cache each step: a new tensor, so no chain of it lasts)
        return NO
    if _capacity(n + k, _unit(a, n)) * _unit(a, n) > MAX_BYTES:
        return NO
    M.growth["started"] += 1
    fam.starts += 1
    return _append(a, sa, None, b, d, n, k, chain or Chain(fam))


class _Family:
    """What growth knows of one family of cats (shapes but the dim, ``b``'s shape,
    dtype, device): the lengths they made, chains started, cuts of their storages."""

    __slots__ = ("made", "starts", "cuts")

    def __init__(self):
        self.made = set()
        self.starts = 0
        self.cuts = 0


class Chain:
    """One chain of cats (one growing tensor's history): how often its grown storages
    were cut to their exact arrays (``StorageData.get`` calls :meth:`cut`)."""

    __slots__ = ("cuts", "family")

    def __init__(self, family):
        self.cuts = 0
        self.family = family

    def cut(self, sd) -> None:
        """Grown storage ``sd`` of this chain was cut: the chain's next cat takes it
        as its first input (remembered, weakly, in ``_CUT``)."""
        self.cuts += 1
        self.family.cuts += 1
        _CUT[sd] = self


_POS: dict = {}  # (count, device index) -> the array of arange(count) on that device


def _positions(count: int, index: int) -> torch.Tensor:
    """``arange(count)`` (int64) on tpu device ``index``, made once per count: the array
    is kept, not a tensor (a kept tensor would count in ``memory_allocated()``)."""
    arr = _POS.get((count, index))
    if arr is None:
        if len(_POS) > 64:
            _POS.clear()
        arr = _POS[(count, index)] = _st.data(
            torch.arange(count, device=torch.device("tpu", index))).get()
    return _st.wrap(arr, index, torch.int64)


def _append(a, sa, cap_arr, b, d, n, k, chain):
    """The result of ``cat([a, b], d)`` as a grown storage: ``b`` written at ``n`` into
    ``a``'s capacity array ``cap_arr`` (None: ``a`` is exact, a new capacity), the
    capacity doubled first where it is full."""
    index = sa.index
    _ACTIVE[0] = True
    try:
        if cap_arr is None:
            base = a
            have = n
        else:
            base = _st.wrap(cap_arr, index, a.dtype)
            have = cap_arr.shape[d]
        if n + k > have or cap_arr is None:
            want = _capacity(n + k, _unit(a, n))
            if cap_arr is not None:
                M.growth["regrows"] += 1
            pad = [0, 0] * (a.dim() - 1 - d) + [0, want - have]
            base = _pad(base, pad, 0)
        pos = _positions(k, index) + n  # n: a runtime scalar (no transfer, no recompile)
        out = _index_copy(base, d, pos, b)
        arr = _st.data(out).get()
    finally:
        _ACTIVE[0] = False
    M.growth["appends"] += 1
    size = tuple(a.shape[:d]) + (n + k,) + tuple(a.shape[d + 1:])
    st = _st.new_storage(size, a.dtype, index, _st.Grown(arr, d, n + k, chain))
    return _st.tensor_on(st, size, _st.contiguous_strides(size), 0, a.dtype)


# --------------------------------------------------------------------------- attention

_FLASH = [None]  # torchtpu_attn::flash_fwd (ops.sdpa defines it; set by rule_for)
_BIAS: dict = {}  # (capacity, length, dtype, index) -> the last mask's array (one entry)


def _attention_rule(plan, vals):
    """``flash_fwd(q, k, v, None, is_causal, scale)`` with ``k`` and ``v`` grown storages
    of one length along dim -2: the same op over their capacity arrays, with an
    additive mask that is -inf past the length."""
    if not ON[0] or CONFIG.defer or _ACTIVE[0]:
        return NO
    q, k, v, bias, is_causal, scale = vals
    if bias is not None or not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
        return NO
    sk = getattr(k.untyped_storage(), "_tpu", None)
    sv = getattr(v.untyped_storage(), "_tpu", None)
    if sk is None or sv is None:
        return NO
    gk, gv = sk.arr, sv.arr
    if gk.__class__ is not _st.Grown or gv.__class__ is not _st.Grown:
        return NO
    d = k.dim() - 2
    if gk.dim != d or gv.dim != d or gk.n != gv.n or gk.arr.shape[d] != gv.arr.shape[d] \
            or not _whole(k, sk) or not _whole(v, sv):
        return NO
    cap, n, index = gk.arr.shape[d], gk.n, sk.index
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    _ACTIVE[0] = True
    try:
        key = (cap, n, dtype, index)
        arr = _BIAS.get(key)
        if arr is None:
            # 0 where the position holds a value, -inf past the length (n: a runtime
            # scalar, so one executable serves every length of this capacity)
            mask = torch.zeros((cap,), dtype=dtype, device=k.device).masked_fill(
                _positions(cap, index) >= n, float("-inf"))
            _BIAS.clear()
            # the array is kept, not the tensor: a kept tensor would stay counted in
            # memory_allocated() after the user's tensors are gone
            _BIAS[key] = _st.data(mask).get()
        else:
            mask = _st.wrap(arr, index, dtype)
        kc = _st.wrap(gk.arr, index, k.dtype)
        vc = _st.wrap(gv.arr, index, v.dtype)
        out = _FLASH[0](q, kc, vc, mask, is_causal, scale)
    finally:
        _ACTIVE[0] = False
    M.growth["attention_calls"] += 1
    return out
