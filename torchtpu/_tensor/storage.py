"""Device storage for ``tpu`` tensors: one PJRT buffer per PyTorch storage.

How a ``tpu`` tensor holds data
-------------------------------
A ``tpu`` tensor is a plain ``torch.Tensor`` (dispatch key PrivateUse1, no subclass) whose
``StorageImpl`` has the real byte size and a unique, never-dereferenced address made up
here (``_construct_storage_from_data_pointer``).  The data itself is a JAX array kept on
the storage's Python object (PyTorch preserves that object, and so its attributes, for as
long as the StorageImpl lives).  So, exactly as on CPU:

* views (``view``, ``t``, slicing, ``as_strided``...) are tensors sharing the StorageImpl,
  with CPU-identical ``size()``, ``stride()``, ``storage_offset()`` and ``is_contiguous()``;
* ``untyped_storage().data_ptr()`` tells storages apart (tied weights, ``safetensors``);
* an in-place op through any view replaces the storage's array, so the base and every
  sibling view see it.

The array is kept in the logical shape of the tensor that allocated the storage (a flat
buffer would force relayout copies on TPU).  :class:`ViewSpec` describes how a tensor reads
its elements out of the storage array; :func:`read_view` / :func:`write_view` turn that into
slices, reshapes and transposes (a gather/scatter only for overlapping ``as_strided``
views) inside the op's compiled executable, so a view costs no extra dispatch.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import torch

from torchtpu._device import executable_limit as _executable_limit
from torchtpu._device import runtime
from torchtpu._tensor import native as _native

_CPU_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset
_set_storage_boxed = _set_storage._handle.redispatch_boxed
_EMPTY = [0]
_create_empty = torch._C._acc.create_empty_tensor
_storage_from_ptr = torch._C._construct_storage_from_data_pointer

# Fake addresses: unique, 512-byte aligned, never reused, starting well above any real
# heap (2**46).  They are never dereferenced: only our kernels touch tpu data.
_ADDR_ALIGN = 512
_next_addr = [1 << 46]


class _Allocator:
    """Counts live and peak device bytes per ``tpu`` index (``torch.tpu.memory_*``)."""

    def __init__(self):
        self.allocated: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.num_allocs = 0

    # (the C++ hot path does the same to these attributes: _native.cpp's account())
    def alloc(self, index: int, nbytes: int):
        cur = self.allocated.get(index, 0) + nbytes
        self.allocated[index] = cur
        if cur > self.peak.get(index, 0):
            self.peak[index] = cur
        self.num_allocs += 1

    def free(self, index: int, nbytes: int):
        self.allocated[index] = self.allocated.get(index, 0) - nbytes


ALLOCATOR = _Allocator()


class StorageData:
    """The device side of one ``tpu`` storage.

    Attributes:
        arr: the JAX array holding the storage's elements, or ``None`` while the storage is
            uninitialized (``torch.empty``); read as zeros then.
        shape: the array's shape (logical shape of the allocating tensor).
        dtype: the torch dtype of the elements.
        index: the ``tpu`` device index.
        nbytes: storage size in bytes.
    """

    __slots__ = ("arr", "shape", "dtype", "index", "nbytes", "counted", "__weakref__")

    def __init__(self, arr, shape, dtype, index, nbytes):
        # (the C++ hot path makes these without this frame: _native.cpp's
        # new_storage_data does the same, and must be changed with it)
        self.arr = arr
        self.shape = shape
        self.dtype = dtype
        self.index = index
        self.nbytes = nbytes
        # Device bytes are counted once the storage has (or will surely get) a buffer: a
        # DeferAndFuse value is counted only if it is still alive when its segment runs;
        # an asynchronous first call's value (eager.async_compile) at once.
        self.counted = arr.__class__ is not Lazy or arr.node is ASYNC
        if self.counted:
            ALLOCATOR.alloc(index, nbytes)
        else:
            arr.owner = weakref.ref(self)

    def __del__(self):
        # (replaced by its C form, _native.cpp's storage_data_del, once the C++ hot path
        # is set up; a change here must be made there too)
        try:
            if self.counted:
                ALLOCATOR.free(self.index, self.nbytes)
        except Exception:  # interpreter shutdown
            pass

    def resolve(self, value) -> None:
        """A DeferAndFuse segment computed this storage's pending value."""
        self.arr = value
        if not self.counted:
            self.counted = True
            ALLOCATOR.alloc(self.index, self.nbytes)

    def get(self, charge: bool = True):
        """The concrete storage array: zeros for an uninitialized storage; a pending
        DeferAndFuse value runs its segment first (a sync point); a pending first call
        (``eager.async_compile``) is waited for.  ``charge=False``: a padded storage cut
        here is not charged to its transfer family (``eager.padded``'s back-off: a
        compiled graph reading it is not an op without a rule)."""
        a = self.arr
        if a.__class__ is Lazy:
            self.resolve(settle(a))
            return self.arr
        if a is None:
            self.arr = zeros(self.shape, self.dtype, self.index)
        elif a.__class__ is Padded:  # cut the bucket padding off, on the device
            from torchtpu import _metrics

            _metrics.METRICS.shape_buckets["device_cuts"] += 1
            self.arr = a.exact(self.shape, self.dtype, self.index)
        elif a.__class__ is Grown:  # cut the spare capacity off, on the device
            from torchtpu import _metrics

            if a.chain is not None:
                _metrics.METRICS.growth["cuts"] += 1
            elif a.host_copy is None:
                _metrics.METRICS.padded["cuts"] += 1
                if charge and a.family is not None:
                    a.family.cuts += 1
            self.arr = a.exact(self.shape, self.dtype, self.index)
            if a.chain is not None:
                a.chain.cut(self)
        return self.arr


_ZEROS = _executable_limit.LRUCache(share=0.125)  # one executable per shape and dtype


def zeros(shape: tuple, dtype: torch.dtype, index: int):
    """A JAX array of zeros on ``tpu:index`` (one cached executable per shape and dtype:
    cheaper than two eagerly dispatched JAX primitives)."""
    key = (shape, dtype, index)
    f = _ZEROS.get(key)
    if f is None:
        jax = runtime.jax()
        from jax.sharding import SingleDeviceSharding

        np_dtype = runtime.to_np_dtype(dtype)
        f = _ZEROS.put(key, jax.jit(
            lambda: jax.numpy.zeros(shape, np_dtype),
            out_shardings=SingleDeviceSharding(runtime.jax_device(index)),
        ))
    return f()


def _no_segment():
    raise RuntimeError("torchtpu: a deferred value without a DeferAndFuse recorder")


# runs the pending DeferAndFuse segment: ``torchtpu.eager.defer`` installs its ``flush``
# here when it is imported (it is the only maker of Lazy values), so this module does not
# import the eager layer above it
_MATERIALIZE = _no_segment


def set_materializer(fn) -> None:
    """``fn()``: compute every pending DeferAndFuse value (``eager.defer`` installs it)."""
    global _MATERIALIZE
    _MATERIALIZE = fn


# Lazy.node of a value that an asynchronous first call computes (``eager.async_compile``;
# its Lazy.seg is the job, with a ``wait()`` that sets the value or raises its error)
ASYNC = "async"
# Lazy.node of a storage a stitched compiled step made and whose device-side check failed
# (``eager.defer.poison``): reading it raises its ``error``
POISONED = "poisoned"


def settle(lz):
    """The array of pending value ``lz`` (a :class:`Lazy`): a DeferAndFuse value runs its
    segment (a sync point), an asynchronous first call's value is waited for (its compile
    and run; an error in either is raised here)."""
    if lz.value is None:
        if lz.node is ASYNC:
            lz.seg.wait()
        elif lz.error is None:
            _MATERIALIZE()  # eager.defer runs the pending segment (a sync point)
        if lz.value is None and lz.error is not None:
            if lz.node is POISONED:
                raise RuntimeError(
                    f"torchtpu: this tensor was made by a compiled step whose device-side "
                    f"check then failed ({type(lz.error).__name__}: "
                    f"{str(lz.error)[:300]}), so it holds no value: on CPU that step raised "
                    f"before making it.  Make it again (e.g. the optimizer state a failed "
                    f"first step created: optimizer.state.clear())") from lz.error
            raise RuntimeError(
                f"torchtpu: this tensor's value was never computed: the deferred program "
                f"that was to compute it failed ({type(lz.error).__name__}: "
                f"{str(lz.error)[:300]})") from lz.error
    return lz.value


def _nothing_pending():
    pass


# waits for every asynchronous first call in flight and counts its storages' bytes
# (``eager.async_compile`` installs it; memory statistics call it first)
_SETTLE_ALL = _nothing_pending


def set_settler(fn) -> None:
    """``fn()``: wait for every pending asynchronous first call and give its storages
    their arrays (``eager.async_compile`` installs it)."""
    global _SETTLE_ALL
    _SETTLE_ALL = fn


def settle_all() -> None:
    """Wait for every pending asynchronous first call (memory statistics read the
    storages' counted bytes after it)."""
    _SETTLE_ALL()


class Lazy:
    """A value not computed yet: output ``out`` of node ``node`` of a recorded
    DeferAndFuse segment ``seg``; ``value`` is set when the segment runs (if it is still
    needed).  With ``node`` :data:`ASYNC`, a result of an asynchronous first call
    (``eager.async_compile``): ``seg`` is its job, ``out`` the result's JAX weak type, and
    ``value`` is set by the worker thread (:func:`settle` waits for it)."""

    __slots__ = ("seg", "node", "out", "shape", "dtype", "value", "owner", "error",
                 "__weakref__")

    def __init__(self, seg, node, out, shape, dtype):
        self.owner = None  # weakref to the StorageData holding it
        self.error = None  # why its segment never computed it (it failed to compile or run)
        self.seg = seg
        self.node = node
        self.out = out
        self.shape = shape
        self.dtype = dtype
        self.value = None


class Padded:
    """A storage's elements held at the front of a longer 1-D array (``eager.buckets``).

    Attributes:
        arr: JAX array of shape ``(B,)``, ``B >= n``, of the storage's dtype.
        n: how many leading elements are the storage's (its elements, flat, row-major).
        edge: whether every element after ``n`` equals element ``n - 1`` (else they are
            arbitrary values).

    Bucketed ops read and write such arrays directly; anything else gets the storage's
    own array from :meth:`StorageData.get`, which cuts the padding off on the device (no
    host sync; one small executable per bucket length, length and shape).
    """

    __slots__ = ("arr", "n", "edge")

    def __init__(self, arr, n: int, edge: bool):
        self.arr = arr
        self.n = n
        self.edge = edge

    def host(self, shape: tuple) -> np.ndarray:
        """The storage's elements on the host, in ``shape`` (a sync point)."""
        return np.array(np.asarray(self.arr)[: self.n]).reshape(shape)

    def exact(self, shape: tuple, dtype: torch.dtype, index: int):
        """The storage's own array (of ``shape``, ``n`` elements): the padding cut off on
        the device (one executable per bucket length and shape; no host sync)."""
        n = self.n
        return _cut(("padded", tuple(self.arr.shape), shape, dtype, index),
                    lambda a: a[:n].reshape(shape), index, self.arr)


class Grown:
    """A storage's elements held in a JAX array with spare capacity along one dim
    (``eager.growth``: a tensor that grows by ``torch.cat`` each step, a KV cache).

    Attributes:
        arr: JAX array of the storage's logical shape except along ``dim``, where it has
            ``arr.shape[dim] >= n`` entries; entries ``n:`` along ``dim`` are zeros.
        dim: the dim along which the storage grows.
        n: the storage's logical length along ``dim``.
        chain: ``eager.growth``'s record of a cat chain, or None.
        host_copy: the storage's exact elements as a numpy array (a padded host transfer,
            ``eager.padded``), or None.
        family: ``eager.padded``'s record of the transfer family the storage descends
            from (counts its device cuts), or None.

    The growth rules (``eager.growth``), the padded-sequence rules (``eager.padded``)
    and window views (:func:`grown_view_spec`) read
    the capacity array directly, with ``n`` a runtime value, so one executable serves
    every length up to the capacity; anything else gets the storage's own array from
    :meth:`StorageData.get`, which cuts the capacity off on the device (no host sync).
    """

    __slots__ = ("arr", "dim", "n", "chain", "host_copy", "family")

    def __init__(self, arr, dim: int, n: int, chain=None, host_copy=None, family=None):
        self.arr = arr
        self.dim = dim
        self.n = n
        # the maker's record of this storage's chain (eager.growth): told, with
        # ``chain.cut(storage_data)``, when the storage is cut to its exact array
        self.chain = chain
        # the exact elements on the host (a padded host transfer, eager.padded): a cut
        # transfers them again instead of compiling a cut
        self.host_copy = host_copy
        # eager.padded's record of the transfer family this storage descends from: told
        # (``family.cuts``) when the storage is cut on the device
        self.family = family
        GROWN_MADE[0] = True

    def exact(self, shape: tuple, dtype: torch.dtype, index: int):
        """The storage's own array (of ``shape``): the capacity cut off, on the device
        (one executable per capacity and length)."""
        if self.host_copy is not None:
            from torchtpu import _metrics

            _metrics.METRICS.padded["host_cuts"] += 1
            arr = runtime.put_host(self.host_copy, index)
            if self.host_copy.nbytes <= _HOST_COPY_BYTES:
                remember_host_copy(arr, self.host_copy)
            return arr
        box = tuple(slice(0, k) for k in shape)
        return _cut((tuple(self.arr.shape), shape, dtype, index), lambda a: a[box], index,
                    self.arr)

    def host(self, shape: tuple) -> np.ndarray:
        """The storage's elements on the host, in ``shape`` (a sync point: the capacity
        array comes to the host and is cut there)."""
        if self.host_copy is not None:
            return np.array(self.host_copy).reshape(shape)
        return np.ascontiguousarray(np.asarray(self.arr)[tuple(slice(0, k) for k in shape)])


# whether a Grown storage was ever made (eager.padded's rules are skipped until then)
GROWN_MADE = [False]
_HOST_COPY_BYTES = 64  # host copies of padded transfers kept for host-side checks
_CUTTERS = _executable_limit.LRUCache(share=0.125)  # Grown/Padded.exact: one per capacity and length


def _cut(key, fn, index: int, arr):
    """``fn(arr)`` on the device through the executable cached under ``key`` (a cut of a
    storage's spare capacity or padding, its result committed to ``tpu:index``)."""
    f = _CUTTERS.get(key)
    if f is None:
        jax = runtime.jax()
        from jax.sharding import SingleDeviceSharding

        f = _CUTTERS.put(key, jax.jit(
            fn, out_shardings=SingleDeviceSharding(runtime.jax_device(index))))
    return f(arr)


def grown_view_spec(t: torch.Tensor, sd: StorageData, g: Grown, offs: list):
    """:func:`dynamic_view_spec` of a window view ``t`` of the :class:`Grown` storage
    ``sd``, in the coordinates of its capacity array ``g.arr``: the box's start per
    storage dim is appended to ``offs`` (runtime values) and the spec names the capacity
    shape, so the key does not depend on the logical length.  None when ``t`` is not a
    window (a whole read, a view that wraps, other dtype, conj/neg bits): the caller then
    reads the exact array (``sd.get()``)."""
    if offs is None or t.dtype is not sd.dtype or t.is_neg() or (t.dtype.is_complex
                                                                  and t.is_conj()):
        return None
    size = tuple(t.shape)
    if 0 in size or size == sd.shape:
        return None
    stride = tuple(t.stride())
    win = _window_plan(size, stride, sd.shape)
    if win is None:
        return None
    starts = _window_starts(t.storage_offset(), sd.shape, win)
    if starts is None:
        return None
    cap = tuple(g.arr.shape)
    nat = contiguous_strides(cap)
    # a unit view dim maps to no storage dim: its stride is never read (0 in the key)
    cstride = tuple(0 if d is None else nat[d] for d in win[1])
    k = len(offs)
    offs.extend(starts)
    return (size, t.dtype, cstride, ("w", k), cap, sd.dtype)


def new_storage(shape: tuple, dtype: torch.dtype, index: int, arr=None):
    """A new ``tpu:index`` ``UntypedStorage`` for ``prod(shape)`` elements of ``dtype``.

    ``arr`` (optional) is the JAX array to hold, already on the right device.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    addr = _next_addr[0]
    _next_addr[0] = addr + (nbytes // _ADDR_ALIGN + 1) * _ADDR_ALIGN
    dev = _DEVICES.get(index)
    if dev is None:
        dev = _DEVICES[index] = torch.device("tpu", index)
    st = _storage_from_ptr(addr, dev, nbytes)
    st._tpu = StorageData(arr, tuple(shape), dtype, index, nbytes)
    return st


_DEVICES: dict = {}


def resize_bytes(st, nbytes: int) -> None:
    """``UntypedStorage.resize_(nbytes)`` of a ``tpu`` storage, in place (FSDP2 frees its
    unsharded parameters with ``resize_(0)`` and re-allocates them with ``resize_(n)``).

    As on CPU/CUDA, the first ``min(old, new)`` bytes are kept and the rest is
    uninitialized (read as zeros here); every tensor viewing the storage sees the new
    size.  The storage's array becomes flat (``(nbytes // itemsize,)``).  Growing gives
    the storage a new (fake) address, as a CUDA reallocation does.

    Raises:
        NotImplementedError: ``nbytes`` is not a multiple of the storage's element size
            while it holds data (its bytes would have to be reinterpreted).
    """
    from torchtpu._tensor import native

    nbytes = int(nbytes)
    if nbytes < 0:
        raise RuntimeError(f"Storage size must be non-negative, got {nbytes}")
    sd = st._tpu
    old = sd.nbytes
    if nbytes == old:
        return
    dtype = sd.dtype
    keep = min(old, nbytes)
    if nbytes % dtype.itemsize:
        if keep and sd.arr is not None:
            raise NotImplementedError(
                f"torchtpu: UntypedStorage.resize_({nbytes}) of a tpu storage of {dtype} "
                f"elements ({dtype.itemsize} bytes each) is not supported")
        dtype = torch.uint8
    n = nbytes // dtype.itemsize
    arr = None
    if keep and sd.arr is not None:
        jnp = runtime.jax().numpy
        flat = sd.get().reshape(-1)
        k = keep // dtype.itemsize
        arr = flat[:n] if n <= k else jnp.zeros((n,), flat.dtype).at[:k].set(flat[:k])
    if sd.counted:
        ALLOCATOR.free(sd.index, old)
    sd.arr, sd.shape, sd.dtype, sd.nbytes, sd.counted = arr, (n,), dtype, nbytes, True
    ALLOCATOR.alloc(sd.index, nbytes)
    addr = 0
    if nbytes > old:
        addr = _next_addr[0]
        _next_addr[0] = addr + (nbytes // _ADDR_ALIGN + 1) * _ADDR_ALIGN
    native.module().set_storage_nbytes(st, nbytes, addr)


def tensor_on(storage, size, stride, offset, dtype) -> torch.Tensor:
    """A ``tpu`` tensor viewing ``storage`` with the given geometry."""
    mod = _native.LOADED
    if mod is not None:  # one C++ call (the C++ helper is loaded in this process)
        return mod.make_on_storage(storage, size, stride, offset, dtype)
    if storage.device.index:
        # tpu:N>0: PyTorch's Python backend API only makes index-0 tensors
        return _native.make_on_storage(storage, size, stride, offset, dtype)
    return _set_storage_boxed(_CPU_KEYSET, _create_empty(_EMPTY, dtype), storage, offset, size,
                              stride)


def contiguous_strides(size) -> tuple:
    strides = []
    acc = 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def dense_permutation(size, stride):
    """The permutation ``p`` with ``r.transpose(p)`` laid out as ``stride`` when ``stride``
    is dense and non-overlapping (a transpose, channels_last...); None when ``stride`` is
    contiguous; ``"nondense"`` otherwise.  Results with a permutation are computed in
    their physical order, so their storage array keeps the tensor's layout."""
    if tuple(stride) == contiguous_strides(size):
        return None
    order = sorted(range(len(size)), key=lambda d: (-stride[d], -size[d]))
    expect = 1
    for d in reversed(order):
        if size[d] != 1 and stride[d] != expect:
            return "nondense"
        expect *= size[d]
    return tuple(order)


def empty(size, dtype: torch.dtype, index: int, stride=None) -> torch.Tensor:
    """An uninitialized ``tpu:index`` tensor (``torch.empty`` / ``empty_strided``)."""
    size = tuple(size)
    if stride is None or tuple(stride) == contiguous_strides(size):
        st = new_storage(size, dtype, index)
        return tensor_on(st, size, contiguous_strides(size), 0, dtype)
    numel = 1 + sum((s - 1) * abs(d) for s, d in zip(size, stride)) if all(size) else 0
    st = new_storage((numel,), dtype, index)
    return tensor_on(st, size, tuple(stride), 0, dtype)


# id(device array) -> (weak reference to it, its values on the host): arrays made by a
# host transfer (``torch.tensor([3], device="tpu")``, a Python list index moved over, a
# small CPU tensor's ``.to("tpu")``), whose values host-side checks and shape buckets'
# padding (``eager.buckets``) read without a sync while a storage still holds that array.
# An entry goes when its array is freed; at most HOST_COPY_BYTES bytes of host values
# are kept (the oldest entries go first).
_HOST_COPIES: dict = {}
_HOST_COPIES_LIMIT = 4096
HOST_COPY_BYTES = 64 << 20
_host_copy_bytes = [0]


def remember_host_copy(dev_arr, host: np.ndarray) -> None:
    """Record that the device array ``dev_arr`` holds ``host``'s values (a host transfer;
    ``host`` must not be written afterwards).  Keeps no reference to ``dev_arr``."""
    key = id(dev_arr)
    if key in _HOST_COPIES:
        return
    nbytes = host.nbytes
    while _HOST_COPIES and (len(_HOST_COPIES) >= _HOST_COPIES_LIMIT
                            or _host_copy_bytes[0] + nbytes > HOST_COPY_BYTES):
        _pop_oldest()
    try:
        ref = weakref.ref(dev_arr, lambda r, k=key: _forget_host_copy(k, r))
    except TypeError:  # an array type without weak references: not remembered
        return
    _HOST_COPIES[key] = (ref, host)
    _host_copy_bytes[0] += nbytes


def _pop_oldest() -> None:
    try:
        k = next(iter(_HOST_COPIES))
    except (StopIteration, RuntimeError):  # (emptied, or changed by a freed array's callback)
        return
    e = _HOST_COPIES.pop(k, None)  # (None: its array's callback removed it meanwhile)
    if e is not None:
        _host_copy_bytes[0] -= e[1].nbytes


def _forget_host_copy(key, ref) -> None:
    e = _HOST_COPIES.get(key)
    if e is not None and e[0] is ref and _HOST_COPIES.pop(key, None) is e:
        _host_copy_bytes[0] -= e[1].nbytes


def host_copy(arr) -> np.ndarray | None:
    """The host values of device array ``arr`` when a host transfer made it
    (:func:`remember_host_copy`), else None.  The result must not be written."""
    e = _HOST_COPIES.get(id(arr))
    if e is None or e[0]() is not arr:
        return None
    return e[1]


def host_values(t: torch.Tensor) -> np.ndarray | None:
    """The values of the ``tpu`` tensor ``t`` when the host knows them without a sync:
    ``t`` views a storage whose array came from a small host transfer and was not
    written since (a write gives the storage a new array); else None.  A view's values
    are read with its size, strides and offset."""
    sd = getattr(t.untyped_storage(), "_tpu", None)
    if sd is None or sd.arr is None:
        return None
    a = sd.arr
    if a.__class__ is Grown and a.host_copy is not None:  # a padded host transfer
        host = a.host_copy
    else:
        host = host_copy(a)
        if host is None:
            return None
    if t.dtype is not sd.dtype or t.is_neg():
        return None
    flat = host.reshape(-1)
    off = t.storage_offset()
    if t.is_contiguous():  # (numpy's as_strided costs ~10 us: the common case without it)
        v = flat[off:off + t.numel()].reshape(tuple(t.shape))
        v.flags.writeable = False
        return v
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat[off:], tuple(t.shape),
                                           tuple(k * item for k in t.stride()),
                                           writeable=False)


def wrap(arr, index: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new contiguous ``tpu:index`` tensor owning the JAX array ``arr``."""
    if dtype is None:
        dtype = runtime.to_torch_dtype(arr.dtype)
    size = tuple(arr.shape)
    st = new_storage(size, dtype, index, arr)
    return tensor_on(st, size, contiguous_strides(size), 0, dtype)


def new_tensor(arr, index: int, dtype: torch.dtype, size: tuple, stride: tuple) -> torch.Tensor:
    """A new ``tpu:index`` tensor of ``size``/``stride`` (contiguous) owning the JAX array
    ``arr`` of shape ``size``: :func:`wrap` without reading the array's shape (the
    executor's per-op results, whose geometry the signature fixes)."""
    st = new_storage(size, dtype, index, arr)
    mod = _native.LOADED
    if mod is not None:
        return mod.make_on_storage(st, size, stride, 0, dtype)
    return tensor_on(st, size, stride, 0, dtype)


def data(t: torch.Tensor) -> StorageData:
    """The :class:`StorageData` behind a ``tpu`` tensor."""
    return t.untyped_storage()._tpu


# ---------------------------------------------------------------------------- views


def view_spec(t: torch.Tensor, sd: StorageData):
    """Hashable description of how ``t`` reads its elements from its storage array.

    ``(size, dtype)`` when ``t`` is the whole storage, contiguous, in the storage's
    shape and dtype; else ``(size, dtype, stride, offset, storage_shape, storage_dtype)``.
    """
    size = tuple(t.shape)
    dtype = t.dtype
    if t.is_neg() or (dtype.is_complex and t.is_conj()):
        # PyTorch's lazy conjugation / negation bits: the tensor's values are
        # conj(storage) / -storage.  Applied on read (and inverted on write).
        return (size, dtype, tuple(t.stride()), t.storage_offset(), sd.shape, sd.dtype,
                t.is_conj(), t.is_neg())
    if size == sd.shape and dtype is sd.dtype and t.storage_offset() == 0 and t.is_contiguous():
        return (size, dtype)
    return (size, dtype, tuple(t.stride()), t.storage_offset(), sd.shape, sd.dtype)


# A view's storage offset travels as a runtime int32 scalar, not a constant compiled
# into the executable: one executable serves ``x[i]`` for every ``i``.  The spec then
# holds ``("o", k)`` where the offset would be, and ``offs[k]`` holds the offset.
_MARKS = tuple(("o", k) for k in range(64))
_LIMITS: dict = {}  # offset-free spec -> largest in-bounds offset, or None (keep static)
_INT32_ELEMS = 1 << 31


def dynamic_view_spec(t: torch.Tensor, sd: StorageData, offs: list):
    """:func:`view_spec` of ``t``, with the storage offset of a view replaced by a
    marker ``("o", k)``; the offset itself is appended to ``offs`` (at ``k``).

    The offset is checked against the storage on the host here (a view reaching past a
    storage shrunk by ``UntypedStorage.resize_`` raises PyTorch's ``setStorage``
    RuntimeError), since the executable no longer sees it.  Empty views get offset 0
    (they read nothing); storages of 2**31 elements or more keep a static offset.
    """
    size = tuple(t.shape)
    dtype = t.dtype
    off = t.storage_offset()
    if t.is_neg() or (dtype.is_complex and t.is_conj()):
        tail = (sd.shape, sd.dtype, t.is_conj(), t.is_neg())
    elif size == sd.shape and dtype is sd.dtype and off == 0 and t.is_contiguous():
        return (size, dtype)
    else:
        tail = (sd.shape, sd.dtype)
    stride = tuple(t.stride())
    base = (size, dtype, stride) + tail
    limit = _LIMITS.get(base, -1)
    if limit == -1:
        limit = _offset_limit(size, dtype, stride, sd.shape, sd.dtype)
        if len(_LIMITS) > 100_000:
            _LIMITS.clear()
        _LIMITS[base] = limit
    if limit is None:
        return (size, dtype, stride, 0 if 0 in size else off) + tail
    if off > limit:
        _check_bounds(size, stride, off, dtype, math.prod(sd.shape) * sd.dtype.itemsize)
    k = len(offs)
    if dtype is sd.dtype:
        win = _WINDOWS.get(base, -1)
        if win == -1:
            win = _window_plan(size, stride, sd.shape)
            if len(_WINDOWS) > 100_000:
                _WINDOWS.clear()
            _WINDOWS[base] = win
        if win is not None:
            starts = _window_starts(off, sd.shape, win)
            if starts is not None:
                offs.extend(starts)
                return (size, dtype, stride, ("w", k)) + tail
    offs.append(off)
    return (size, dtype, stride, _MARKS[k] if k < 64 else ("o", k)) + tail


# A view that is a box of its storage array's own (row-major) index space, such as
# ``x[:, j]`` or ``x[i, 1:3]`` of a storage of ``x``'s shape, is read with a
# ``dynamic_slice`` and written with a ``dynamic_update_slice`` on the storage array
# itself, at start indices passed at run time: XLA then updates a donated storage in
# place and moves only the box's elements.  The flat form (a gather/scatter over the
# flattened storage) made XLA:CPU copy the storage and split 15-element gathers over
# threads: ~45 us per ``x0[:, j, :] = src[:, i, :]`` against ~30 us now.  The spec then
# holds ``("w", k)`` where the offset would be, and ``offs[k: k + storage ndim]`` hold
# the box's start indices.
_WINDOWS: dict = {}  # offset-free spec -> window plan or None


def _window_plan(size, stride, sshape):
    """``(box, dims)`` when every non-unit dim ``i`` of a view of ``size``/``stride`` steps
    along its own dim ``dims[i]`` of a row-major storage array of shape ``sshape``
    (``box``: the box's extent per storage dim), else None.  Unit view dims map to no
    storage dim (``dims[i]`` is None)."""
    if not sshape:
        return None
    nat = contiguous_strides(sshape)
    box = [1] * len(sshape)
    dims = []
    for n, s in zip(size, stride):
        if n == 1:
            dims.append(None)
            continue
        d = next((d for d in range(len(sshape)) if nat[d] == s and sshape[d] > 1), None)
        if d is None or box[d] != 1 or n > sshape[d]:
            return None
        box[d] = n
        dims.append(d)
    return tuple(box), tuple(dims), nat


def _window_starts(off, sshape, win):
    """The box's start index per storage dim for storage offset ``off``, or None when
    the box would wrap past the end of a storage dim (then it is no box)."""
    box, _, nat = win
    starts = []
    for n, b, st in zip(sshape, box, nat):
        q, off = divmod(off, st)
        if q + b > n:
            return None
        starts.append(q)
    return starts


def _read_window(arr, size, stride, offs, k):
    """Traced: the elements of a window view (see ``_WINDOWS``) of storage array ``arr``."""
    lax = runtime.jax().lax
    jnp = runtime.jax().numpy
    box, dims, _ = _window_plan(size, stride, arr.shape)
    starts = [offs[k + d] for d in range(arr.ndim)]
    x = lax.dynamic_slice(arr, starts, box)
    mapped = [d for d in dims if d is not None]
    order = sorted(mapped)
    x = x.reshape([box[d] for d in order])
    if mapped != order:
        x = jnp.transpose(x, [order.index(d) for d in mapped])
    return x.reshape(size)


def _write_window(arr, size, stride, offs, k, value):
    """Traced: storage array ``arr`` after writing ``value`` (of ``size``) through a
    window view (see ``_WINDOWS``)."""
    lax = runtime.jax().lax
    jnp = runtime.jax().numpy
    box, dims, _ = _window_plan(size, stride, arr.shape)
    starts = [offs[k + d] for d in range(arr.ndim)]
    mapped = [d for d in dims if d is not None]
    order = sorted(mapped)
    v = value.reshape([box[d] for d in mapped])
    if mapped != order:
        v = jnp.transpose(v, [mapped.index(d) for d in order])
    return lax.dynamic_update_slice(arr, v.reshape(box).astype(arr.dtype), starts)


def _offset_limit(size, dtype, stride, sshape, sdtype):
    """Largest storage offset at which a view of ``size``/``stride`` stays inside the
    storage, or None where the offset stays a constant (empty views, huge storages)."""
    elems = math.prod(sshape) * sdtype.itemsize // dtype.itemsize
    if 0 in size or elems >= _INT32_ELEMS:
        return None
    return elems - (1 + sum((n - 1) * abs(s) for n, s in zip(size, stride)))


def _offset(spec, offs):
    """A spec's storage offset: its constant, or (traced) its runtime value in ``offs``."""
    off = spec[3]
    return off if off.__class__ is int else offs[off[1]]


def _bits(x, spec):
    """Apply a spec's conj/neg bits (their own inverses) to values ``x``."""
    if len(spec) > 6:
        if spec[6]:
            x = runtime.jax().numpy.conj(x)
        if spec[7]:
            x = -x
    return x


def _nested_plan(size, stride):
    """Express a strided view as slice -> reshape -> index, or None if it overlaps.

    Returns (region_len, shape, index, sorted_dims, bcast_dims) where the region
    ``flat[offset: offset + region_len]`` reshaped to ``shape`` and indexed by ``index``
    gives the non-broadcast, non-unit dims in ``sorted_dims`` order.
    """
    real = [(i, n, s) for i, (n, s) in enumerate(zip(size, stride)) if n != 1 and s != 0]
    if any(s < 0 for _, _, s in real):
        return None
    real.sort(key=lambda d: -d[2])
    for (_, _, sp), (_, n, s) in zip(real, real[1:]):
        if sp % s or n * s > sp:
            return None
    if not real:
        return (1, (1,), (0,), [], )
    shape = [real[0][1]]
    index = [slice(None)]
    for (_, _, sp), (_, n, s) in zip(real, real[1:]):
        shape.append(sp // s)
        index.append(slice(0, n))
    shape.append(real[-1][2])
    index.append(0)
    return (real[0][1] * real[0][2], tuple(shape), tuple(index), [d[0] for d in real])


def _region(flat, offset, length):
    jnp = runtime.jax().numpy
    lax = runtime.jax().lax
    n = flat.shape[0]
    if offset + length > n:
        flat = jnp.concatenate([flat, jnp.zeros((offset + length - n,), flat.dtype)])
    return lax.slice(flat, (offset,), (offset + length,))


def _index_array(size, stride, offset):
    idx = np.full((), offset, dtype=np.int64)
    for n, s in zip(size, stride):
        idx = idx[..., None] + np.arange(n, dtype=np.int64) * s
    return idx


def _bitcast(flat, dtype):
    """Traced: 1-D ``flat`` reinterpreted as elements of torch ``dtype`` (1-D), using
    the little-endian memory layout PyTorch's ``Tensor.view(dtype)`` exposes."""
    lax = runtime.jax().lax
    target = np.dtype(runtime.to_np_dtype(dtype))
    if flat.dtype == target:
        return flat
    if flat.dtype == np.bool_:
        flat = flat.astype(np.uint8)
    to_bool = target == np.bool_
    if to_bool:
        target = np.dtype(np.uint8)
    jnp = runtime.jax().numpy
    if jnp.iscomplexobj(flat):  # complex -> its (real, imag) pairs, then on
        part = np.dtype(np.float32 if flat.dtype == np.complex64 else np.float64)
        flat = jnp.stack([jnp.real(flat), jnp.imag(flat)], axis=-1).astype(part).reshape(-1)
        return _bitcast(flat, runtime.to_torch_dtype(target) if not to_bool else torch.bool)
    if target.kind == "c":  # -> complex: build from (real, imag) pairs
        part = np.dtype(np.float32 if target == np.complex64 else np.float64)
        pairs = _bitcast(flat, runtime.to_torch_dtype(part)).reshape(-1, 2)
        return lax.complex(pairs[:, 0], pairs[:, 1]).astype(target)
    src_size, dst_size = flat.dtype.itemsize, target.itemsize
    if src_size == dst_size:
        out = lax.bitcast_convert_type(flat, target)
    elif src_size > dst_size:  # e.g. float32 -> uint8: (N,) -> (N, 4) -> (4N,)
        out = lax.bitcast_convert_type(flat, target).reshape(-1)
    else:  # e.g. uint8 -> float32: (4N,) -> (N, 4) -> (N,)
        r = dst_size // src_size
        n = flat.shape[0] // r
        out = lax.bitcast_convert_type(flat[: n * r].reshape(n, r), target)
    return out.astype(np.bool_) if to_bool else out


def _check_bounds(size, stride, offset, dtype, storage_nbytes) -> None:
    """A view reaching past its storage (one shrunk by ``UntypedStorage.resize_``, as
    FSDP2 frees parameters) raises, with PyTorch's ``setStorage`` message, instead of
    reading clamped indices (CPU reads freed memory there)."""
    need = (offset + 1 + sum((n - 1) * abs(s) for n, s in zip(size, stride))) * dtype.itemsize
    if need > storage_nbytes:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset "
            f"{offset}, and itemsize {dtype.itemsize} requiring a storage size of {need} "
            f"are out of bounds for storage of size {storage_nbytes}")


def read_view(arr, spec, offs=None):
    """Traced: the elements of a tensor with ``spec`` from its storage array ``arr``.

    ``offs``: the runtime offsets of a :func:`dynamic_view_spec` (int32[k]), else None.
    """
    if len(spec) == 2:
        return arr
    if len(spec) > 6:
        return _bits(read_view(arr, spec[:6], offs), spec)
    size, dtype, stride, offset, _, sdtype = spec
    jnp = runtime.jax().numpy
    lax = runtime.jax().lax
    flat = arr.reshape(-1)
    if dtype is not sdtype:
        flat = _bitcast(flat, dtype)
    if math.prod(size) == 0:
        return jnp.zeros(size, flat.dtype)
    dynamic = offset.__class__ is not int
    if dynamic and offset[0] == "w" and dtype is sdtype:
        return _read_window(arr, size, stride, offs, offset[1])
    if dynamic:  # checked on the host by dynamic_view_spec
        offset = offs[offset[1]]
    else:
        _check_bounds(size, stride, offset, dtype, math.prod(arr.shape) * sdtype.itemsize)
    plan = _nested_plan(size, stride)
    if plan is None or _sparse(size, stride):
        return flat[_index_array(size, stride, 0) + offset]
    length, shape, index, order = plan
    if dynamic:
        x = _dynamic_region(flat, offset, length, _extent(size, stride))
    else:
        x = _region(flat, offset, length)
    x = x.reshape(shape)[index]
    if not order:
        return lax.broadcast_in_dim(x.reshape(()), size, ())
    # x has the non-unit, non-broadcast dims in `order`; put them back in place.
    perm = sorted(range(len(order)), key=lambda k: order[k])
    x = jnp.transpose(x, perm)
    return lax.broadcast_in_dim(x, size, tuple(sorted(order)))


_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def read_view_host(host, t: torch.Tensor) -> np.ndarray:
    """Host twin of :func:`read_view`: the elements of ``t`` (a view of the storage whose
    host copy is the numpy array ``host``, of the same dtype) as a new numpy array of
    ``t``'s shape, with ``t``'s conj/neg bits applied.  Raises PyTorch's ``setStorage``
    RuntimeError for a view reaching past the storage."""
    size = tuple(t.shape)
    flat = host.reshape(-1)
    if 0 in size:
        return np.zeros(size, flat.dtype)
    stride = t.stride()
    off = t.storage_offset()
    _check_bounds(size, stride, off, t.dtype, flat.nbytes)
    item = flat.itemsize
    # strided through an unsigned view of the same width: numpy's as_strided rebuilds
    # the dtype from its type string, which ml_dtypes' float8_e5m2 ("<f1") cannot give
    bits = _UINT_OF_SIZE.get(item)
    src = flat[off:] if bits is None else flat[off:].view(bits)
    x = np.array(np.lib.stride_tricks.as_strided(
        src, size, tuple(s * item for s in stride), writeable=False))
    if bits is not None:
        x = x.view(flat.dtype)
    if t.dtype.is_complex and t.is_conj():
        x = np.conj(x)
    if t.is_neg():
        x = np.negative(x)
    return x


def _sparse(size, stride) -> bool:
    """A view whose elements are spread far apart in its storage (``x[:, i]`` of a wide
    ``x``): a gather/scatter of its own elements beats slicing the whole region it spans
    (``(5, 3)`` elements of a ``(5, 40000, 3)`` storage: 15 elements, not 480,003)."""
    n = math.prod(size)
    return n <= 65536 and _extent(size, stride) > max(4096, 16 * n)


def _extent(size, stride):
    """Number of storage elements from a (non-empty) view's first element to its last."""
    return 1 + sum((n - 1) * abs(s) for n, s in zip(size, stride))


def _dynamic_region(flat, offset, length, extent):
    """Traced: ``flat[offset: offset + length]`` for a runtime ``offset`` where only the
    first ``extent`` elements are in bounds (the rest read as zeros, never used)."""
    jnp = runtime.jax().numpy
    x = runtime.jax().lax.dynamic_slice(flat, (offset,), (extent,))
    if length > extent:
        x = jnp.concatenate([x, jnp.zeros((length - extent,), flat.dtype)])
    return x


def write_view(arr, spec, value, offs=None):
    """Traced: the storage array ``arr`` after writing ``value`` through a view ``spec``.

    ``offs``: the runtime offsets of a :func:`dynamic_view_spec` (int32[k]), else None.
    """
    if len(spec) == 2:
        return value.astype(arr.dtype).reshape(arr.shape)
    if len(spec) > 6:
        value = _bits(value.astype(runtime.to_np_dtype(spec[1])), spec)
        return write_view(arr, spec[:6], value, offs)
    size, dtype, stride, offset, sshape, sdtype = spec
    jnp = runtime.jax().numpy
    lax = runtime.jax().lax
    if math.prod(size) == 0:
        return arr
    dynamic = offset.__class__ is not int
    if not dynamic:  # else checked on the host by dynamic_view_spec
        _check_bounds(size, stride, offset, dtype, math.prod(sshape) * sdtype.itemsize)
    value = value.astype(runtime.to_np_dtype(dtype))
    if dtype is not sdtype:
        # write in the view's dtype over a reinterpreted copy of the storage, then back
        flat = _bitcast(arr.reshape(-1), dtype)
        new = write_view(flat, (size, dtype, stride, offset, flat.shape, dtype), value, offs)
        back = _bitcast(new, sdtype)
        return back.reshape(arr.shape)
    if dynamic and offset[0] == "w":
        return _write_window(arr, size, stride, offs, offset[1], value)
    if dynamic:
        offset = offs[offset[1]]
    flat = arr.reshape(-1)
    n = flat.shape[0]
    plan = _nested_plan(size, stride)
    if plan is None or _sparse(size, stride) or any(
            s == 0 and k != 1 for k, s in zip(size, stride)):
        idx = (_index_array(size, stride, 0) + offset).reshape(-1)
        return flat.at[idx].set(value.reshape(-1)).reshape(arr.shape)
    length, shape, index, order = plan
    if order:
        v = value.reshape([size[d] for d in sorted(order)])
        perm = [sorted(order).index(d) for d in order]
        v = jnp.transpose(v, perm)
    else:
        v = value.reshape(())
    if dynamic:
        extent = _extent(size, stride)
        region = _dynamic_region(flat, offset, length, extent).reshape(shape)
        region = region.at[index].set(v).reshape(-1)[:extent]
        return lax.dynamic_update_slice(flat, region, (offset,)).reshape(arr.shape)
    pad = max(0, offset + length - n)
    if pad:
        flat = jnp.concatenate([flat, jnp.zeros((pad,), flat.dtype)])
    region = lax.slice(flat, (offset,), (offset + length,)).reshape(shape)
    region = region.at[index].set(v).reshape(-1)
    flat = lax.dynamic_update_slice(flat, region, (offset,))
    if pad:
        flat = flat[:n]
    return flat.reshape(arr.shape)
