"""Ops that are not lowerings: allocation, host<->device copies, ``item``, resize, set_.

Each handler is the PrivateUse1 kernel of one ATen overload (see ``HANDLERS``); the
executor consults this table before the lowering table.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from torchtpu import _metrics
from torchtpu._device import runtime, state
from torchtpu._tensor import storage as _st
from torchtpu.eager import host_reads as _hr
from torchtpu.eager import padded as _padded

M = _metrics.METRICS
aten = torch.ops.aten
HANDLERS: dict = {}


def handles(*ops):
    def deco(fn):
        for op in ops:
            HANDLERS[op] = fn
        return fn

    return deco


def _index(device) -> int:
    if device is None:
        return state.current_device
    device = torch.device(device)
    return state.current_device if device.index is None else device.index


def _check_index(index):
    runtime.jax_device(index)  # raises for a bad ordinal
    return index


@handles(aten.empty.memory_format)
def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    index = _check_index(_index(device))
    runtime.to_np_dtype(dtype)  # clear error for unsupported dtypes
    stride = None
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
    return _st.empty(tuple(size), dtype, index, stride)


@handles(aten.empty_strided.default)
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    index = _check_index(_index(device))
    runtime.to_np_dtype(dtype)
    return _st.empty(tuple(size), dtype, index, tuple(stride))


# ----------------------------------------------------------------------- copies


# dtypes numpy lacks (ml_dtypes/JAX has them): host copies go through their bits
_BITS_AS = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.float8_e4m3fnuz: torch.uint8,
    torch.float8_e5m2fnuz: torch.uint8,
}


npdt_bits = {torch.int16: np.int16, torch.uint8: np.uint8}


def host_array(src: torch.Tensor) -> np.ndarray:
    """A private C-contiguous numpy copy of CPU tensor ``src`` (never aliases the CPU
    buffer, so a later change of ``src`` cannot reach an asynchronous host->device copy).
    PyTorch copies ``src`` into a new numpy buffer (conj / neg views resolved): a numpy
    view of ``src`` itself would leave ``src``'s storage not resizable until Python's
    cycle collector freed the view (``x.to("tpu"); x.resize_(n)`` raised).

    Raises:
        NotImplementedError / TypeError: a dtype XLA lacks (``runtime.to_np_dtype``).
    """
    np_dt = runtime.to_np_dtype(src.dtype)
    src = src.detach()
    bits = _BITS_AS.get(src.dtype)
    if bits is not None:  # numpy (ml_dtypes) types PyTorch cannot wrap: copy the bits
        out = np.empty(tuple(src.shape), runtime.to_np_dtype(bits))
        torch.from_numpy(out).copy_(src.resolve_neg().view(bits))
        return out.view(np_dt)
    out = np.empty(tuple(src.shape), np_dt)
    torch.from_numpy(out).copy_(src)
    return out


# Small host values copied again and again (a model's ``torch.tensor([])`` or
# ``torch.tensor(1.0)`` made on the CPU every step): their device arrays, by value.  JAX
# arrays are immutable and a storage write replaces its array, so sharing one is safe;
# the extra reference also keeps them from being donated.
_SMALL_BYTES = 64
_SMALL: dict = {}
# Host transfers up to this size keep their host values beside the device array while it
# lives (storage.remember_host_copy, at most storage.HOST_COPY_BYTES in all): host-side
# index checks and shape buckets' padding (eager.buckets) read them without a sync.
_KNOWN_BYTES = 64 << 10


def to_device(src: torch.Tensor, index: int) -> torch.Tensor:
    """A new contiguous ``tpu:index`` tensor with the values of CPU tensor ``src``."""
    arr = host_array(src)
    M.transfers_to_device_bytes += arr.nbytes
    t = _padded.transfer(arr, src.dtype, index)  # a sequence of changing length
    if t is not None:
        return t
    if arr.nbytes <= _SMALL_BYTES:
        key = (arr.tobytes(), arr.dtype.str, arr.shape, src.dtype, index)
        dev_arr = _SMALL.get(key)
        if dev_arr is None:
            if len(_SMALL) > 4096:
                _SMALL.clear()
            dev_arr = _SMALL[key] = runtime.jax().device_put(arr, runtime.jax_device(index))
            # (host-side checks read such values without a sync: ops.indexing's bounds)
            _st.remember_host_copy(dev_arr, arr)
        return _st.wrap(dev_arr, index, src.dtype)
    dev_arr = runtime.put_host(arr, index)
    if arr.nbytes <= _KNOWN_BYTES:  # (arr is private: host_array made it for this copy)
        _st.remember_host_copy(dev_arr, arr)
    return _st.wrap(dev_arr, index, src.dtype)


_COPY_PLAN = None


def _copy_plan():
    global _COPY_PLAN
    if _COPY_PLAN is None:
        from torchtpu import ops
        from torchtpu.eager import executor as ex

        _COPY_PLAN = ex.LoweredPlan(
            aten.copy_.default,
            ex.Signature(aten.copy_.default),
            ops.table()[aten.copy.default],
            ex.Signature(aten.copy.default),
        )
    return _COPY_PLAN


def _upload_whole(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether CPU tensor ``src`` was copied into ``tpu`` tensor ``dst`` as a new device
    array for ``dst``'s whole storage (same dtype and shape, ``dst`` the storage's
    contiguous full view); False (nothing done) otherwise."""
    sd = _st.data(dst)
    if (
        src.dtype == dst.dtype
        and tuple(src.shape) == tuple(dst.shape)
        and len(_st.view_spec(dst, sd)) == 2
    ):
        arr = host_array(src)
        M.transfers_to_device_bytes += arr.nbytes
        sd.arr = runtime.put_host(arr, sd.index)
        return True
    return False


def upload_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` for a ``tpu`` tensor ``dst`` and a CPU tensor ``src``, without
    PyTorch's dispatcher where ``dst`` is a plain tensor (no autograd, no subclass such
    as a FakeTensor) that is its storage's whole contiguous view, of ``src``'s dtype and
    shape: the storage takes a new device array (5-10 us less than ``copy_``'s 30 us
    here).  The values and what later reads see are ``copy_``'s (it does the
    same); anything else goes through ``dst.copy_(src)`` and its errors.  Returns
    ``dst``.  For runtimes that upload whole host buffers every step (the vLLM plugin's
    model runner)."""
    if (type(dst) is torch.Tensor and type(src) is torch.Tensor
            and dst.device.type == "tpu" and src.device.type == "cpu"
            and not dst.requires_grad and _upload_whole(dst, src)):
        return dst
    return dst.copy_(src)


def upload_changed(dst: torch.Tensor, src: torch.Tensor, held: dict) -> torch.Tensor:
    """:func:`upload_into` ``(dst, src)``, skipped when ``dst``'s storage still holds the
    very device array that the last call uploaded into it and ``src`` (a CPU tensor of a
    numpy dtype) has the values uploaded then: for a buffer re-sent every step whose
    values rarely change (a batch's query start locations while it decodes).  ``held``:
    the caller's record of those uploads, a dict this function fills (one entry per
    destination storage, holding it and a host copy of its values: for a few
    long-lived buffers).  Any other write into ``dst`` (an op, a ``copy_``) gives its
    storage another array, so the next call uploads.  Returns ``dst``."""
    if type(dst) is torch.Tensor and type(src) is torch.Tensor and src.device.type == "cpu" \
            and dst.device.type == "tpu" and not dst.requires_grad and src.dtype not in _BITS_AS:
        sd = _st.data(dst)
        host = src.detach().numpy()
        last = held.get(id(sd))
        if last is not None and sd.arr is last[1] and np.array_equal(last[2], host):
            return dst
        if _upload_whole(dst, src):
            held[id(sd)] = (sd, sd.arr, host.copy())
            return dst
    return dst.copy_(src)


@handles(aten.copy_.default)
def copy_(self, src, non_blocking=False):
    dst_tpu = self.device.type == "tpu"
    src_tpu = src.device.type == "tpu"
    if dst_tpu and not src_tpu:
        if src.device.type != "cpu":
            raise RuntimeError(f"copy_: cannot copy from {src.device} to {self.device}")
        if _upload_whole(self, src):
            return self
        src = to_device(src, self.device.index)
        src_tpu = True
    if dst_tpu and src_tpu:
        if src.device.index != self.device.index:
            arr = runtime.jax().device_put(
                _hr.to_jax(src),
                runtime.jax_device(self.device.index),
            )
            src = _st.wrap(arr, self.device.index, src.dtype)
        return _copy_plan()((self, src, non_blocking), {})
    # tpu -> cpu

    host = _host_tensor(_hr.to_numpy(src, "to_cpu"), src)
    return self.copy_(host)


@handles(aten._copy_from.default)
def _copy_from(self, dst, non_blocking=False):
    return copy_(dst, self, non_blocking)


@handles(aten._copy_from_and_resize.default)
def _copy_from_and_resize(self, dst):
    if tuple(dst.shape) != tuple(self.shape):
        dst.resize_(self.shape)
    return copy_(dst, self)


@handles(aten._local_scalar_dense.default)
def _local_scalar_dense(self):

    arr = _hr.to_numpy(self, "item")
    if self.dtype in _BITS_AS:  # an ml_dtypes scalar is not a Python float
        return arr.astype(np.float32).item()  # any one-element shape, as CPU
    return arr.item()


# ----------------------------------------------------------------- resize / set_


@handles(aten.resize_.default)
def resize_(self, size, memory_format=None):
    size = tuple(size)
    stride = _st.contiguous_strides(size)
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
    need = (self.storage_offset() + math.prod(size)) * self.dtype.itemsize
    st = self.untyped_storage()
    if need > st.nbytes():

        old = st._tpu
        n = self.storage_offset() + math.prod(size)
        new = _st.new_storage((n,), self.dtype, old.index)
        if old.arr is not None and old.dtype is self.dtype:
            jnp = runtime.jax().numpy
            flat = old.get().reshape(-1)
            k = min(flat.shape[0], n)
            new._tpu.arr = jnp.zeros((n,), flat.dtype).at[:k].set(flat[:k])
        st = new
    return aten.set_.source_Storage_storage_offset.redispatch(
        _st._CPU_KEYSET, self, st, self.storage_offset(), size, stride
    )


def _adopt_dtype(t: torch.Tensor) -> torch.Tensor:
    """After ``set_``: a raw byte storage (``torch.load``, ``UntypedStorage(n)``) takes
    the dtype of the first typed tensor put on it, so later reads need no bitcast.
    The bytes are unchanged, so views of any dtype still read the same values."""
    sd = _st.data(t)
    if sd.dtype is torch.uint8 and t.dtype is not torch.uint8 and sd.nbytes % t.dtype.itemsize == 0:

        n = sd.nbytes // t.dtype.itemsize
        whole = (t.storage_offset() == 0 and t.is_contiguous() and t.numel() == n)
        shape = tuple(t.shape) if whole else (n,)
        if sd.arr is not None:
            sd.arr = _hr.retype(sd.get(), t.dtype, shape)
        sd.dtype, sd.shape = t.dtype, shape
    return t


def _set_storage(op):
    def fn(*args, **kwargs):
        return _adopt_dtype(op.redispatch(_st._CPU_KEYSET, *args, **kwargs))

    return fn


for _op in (
    aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset,
    aten.set_.source_Tensor,
):
    HANDLERS[_op] = _set_storage(_op)


@handles(aten.set_.default)
def set_(self):
    st = _st.new_storage((0,), self.dtype, self.device.index)
    return aten.set_.source_Storage_storage_offset.redispatch(
        _st._CPU_KEYSET, self, st, 0, (0,), (1,)
    )


@handles(aten.record_stream.default)
def record_stream(self, stream):
    return None


@handles(aten._has_compatible_shallow_copy_type.default)
def _compat(self, from_):
    return self.device.type == from_.device.type


_TO_COPY_PLAN = None


@handles(aten._to_copy.default)
def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    """``Tensor.to`` / ``.cpu()`` / ``.tpu()``: host<->device transfers, casts on tpu."""
    global _TO_COPY_PLAN
    dst = torch.device(device) if device is not None else x.device
    if dst.type == "tpu" and dst.index is None:
        dst = torch.device("tpu", state.current_device)
    if x.device.type != "tpu":  # host -> tpu
        if x.device.type != "cpu":
            raise RuntimeError(f"_to_copy: cannot copy from {x.device} to {dst}")
        if dtype is not None and dtype != x.dtype:
            x = x.to(dtype)
        strides = _result_strides(x, memory_format)
        if strides is not None:  # a permuted layout (channels_last, a transpose...)
            out = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=dst)
            return out.copy_(x.contiguous())
        return to_device(x, _check_index(dst.index))
    if dst.type == "cpu":  # tpu -> host
        host = _host_tensor(_hr.to_numpy(x, "to_cpu"), x)
        if dtype is not None and dtype != host.dtype:
            host = host.to(dtype)
        strides = _result_strides(x, memory_format)
        if strides is not None:
            host = torch.empty_strided(host.shape, strides, dtype=host.dtype).copy_(host)
        if pin_memory:
            host = host.pin_memory()
        return host
    if dst.type != "tpu":
        raise RuntimeError(f"_to_copy: cannot copy from {x.device} to {dst}")
    if dst.index != x.device.index:  # tpu:i -> tpu:j
        arr = runtime.jax().device_put(_hr.to_jax(x), runtime.jax_device(_check_index(dst.index)))
        x = _st.wrap(arr, dst.index, x.dtype)
        if dtype is None or dtype == x.dtype:
            return x
    if _TO_COPY_PLAN is None:
        from torchtpu import ops
        from torchtpu.eager import executor as ex

        _TO_COPY_PLAN = ex.LoweredPlan(
            aten._to_copy.default, ex.Signature(aten._to_copy.default),
            ops.table()[aten._to_copy.default],
        )
    return _TO_COPY_PLAN((x,), {"dtype": dtype, "memory_format": memory_format})


def _result_strides(x: torch.Tensor, memory_format) -> tuple | None:
    """The strides PyTorch's ``_to_copy`` gives a copy of ``x`` under ``memory_format``
    (``preserve_format`` keeps a dense tensor's strides: a transposed or channels_last
    tensor stays so across devices), or None when they are the contiguous ones."""
    if x.dim() < 2:
        return None
    mf = torch.preserve_format if memory_format is None else memory_format
    if mf is torch.preserve_format and x.is_contiguous():
        # the common case, without a meta call; a dense tensor keeps its strides as they
        # are, a size-1 dimension's included (ones(3, 1).t(): (1, 1), not (3, 1))
        st = x.stride()
        return None if st == _st.contiguous_strides(tuple(x.shape)) else st
    strides = torch.empty_like(x, device="meta", memory_format=mf).stride()
    return None if strides == _st.contiguous_strides(tuple(x.shape)) else strides


def _host_tensor(arr: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A CPU tensor (own memory) from a host array read off tpu tensor ``like``."""
    if like.numel() == 0:
        # numpy gives an empty array all-zero strides, which from_numpy would keep
        return torch.empty(tuple(like.shape), dtype=like.dtype)
    bits = _BITS_AS.get(like.dtype)
    if bits is not None:
        host = torch.from_numpy(np.array(arr.view(npdt_bits[bits]), copy=True)).view(like.dtype)
    else:
        host = torch.from_numpy(np.array(arr, copy=True))
    return host.reshape(like.shape)


# ------------------------------------------------------------- index_reduce (in-place)

_INDEX_REDUCE_OUT_PLAN = None


@handles(aten.index_reduce.out)
def index_reduce_out(self, dim, index, source, reduce, *, include_self=True, out):
    """``index_reduce.out`` (what ``index_reduce_`` reaches): the lowered plan, except for
    an empty ``index``, where PyTorch's meta kernel of the out variant fails (IndexError
    from ``select``) but CPU leaves ``self`` unchanged: PyTorch's checks run through the
    functional op's meta kernel, then ``out`` gets ``self``'s values."""
    global _INDEX_REDUCE_OUT_PLAN
    from torchtpu.eager import executor as ex

    if index.numel() == 0:
        if reduce not in ("prod", "mean", "amax", "amin"):
            raise RuntimeError("index_reduce(): Expected reduce to be one of prod, mean, "
                               f"amax or amin but got {reduce}.")
        meta = [ex._meta_of(v) for v in (self, index, source)]
        aten.index_reduce.default(meta[0], dim, meta[1], meta[2], reduce,
                                  include_self=include_self)
        if out is not self:
            out.copy_(self)
        return out
    if _INDEX_REDUCE_OUT_PLAN is None:
        from torchtpu import ops

        f = aten.index_reduce.default
        _INDEX_REDUCE_OUT_PLAN = ex.LoweredPlan(
            aten.index_reduce.out, ex.Signature(aten.index_reduce.out), ops.table()[f],
            ex.Signature(f),
        )
    return _INDEX_REDUCE_OUT_PLAN(
        (self, dim, index, source, reduce), {"include_self": include_self, "out": out}
    )
