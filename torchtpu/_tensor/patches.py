"""The few places where PyTorch assumes a C++ allocator for the backend, patched.

``torch.UntypedStorage(n, device="tpu")`` would call the (missing) PrivateUse1 C++
allocator and crash; ``torch.load(..., map_location="tpu")`` and ``storage.to("tpu")``
go through it.  We route that constructor to :func:`torchtpu._tensor.storage.new_storage`.
"""

from __future__ import annotations

import warnings

import torch

_orig_new = None


def _storage_new(cls, *args, device=None, **kwargs):
    if device is not None:
        dev = torch.device(device)
        if dev.type == "tpu":
            from torchtpu._device import state
            from torchtpu._tensor import storage as _st

            index = state.current_device if dev.index is None else dev.index
            if len(args) == 0:
                n = 0
            elif len(args) == 1 and isinstance(args[0], int):
                n = args[0]
            else:
                raise NotImplementedError(
                    "torchtpu: torch.UntypedStorage(..., device='tpu') supports only a size"
                )
            return _st.new_storage((n,), torch.uint8, index)
    return _orig_new(cls, *args, device=device, **kwargs)


_orig_resize = None


def _storage_resize(self, size):
    """``UntypedStorage.resize_``: PyTorch sends a tpu storage to the C++ PrivateUse1
    hooks' ``resizePrivateUse1Bytes``, which a Python backend cannot provide."""
    if self.device.type == "tpu":
        from torchtpu._tensor import storage as _st

        _st.resize_bytes(self, size)
        return self
    return _orig_resize(self, size)


_orig_reduce: dict = {}


def _storage_reduce(cls):
    """``pickle`` of a storage (and so of a tensor: ``pickle.dumps(t)``, object
    collectives, multiprocessing): PyTorch's ``__reduce__`` saves it in the legacy format,
    whose C++ writer wraps the StorageImpl in a tensor the Python backend cannot read.
    A tpu storage pickles through ``torch.save``'s current format instead (its bytes
    copied to the host) and loads back on its tpu device, as a CUDA storage does."""
    orig = _orig_reduce[cls] = cls.__reduce__

    def __reduce__(self):
        # a TypedStorage's own ``device`` warns that TypedStorage is deprecated
        st = self._untyped_storage if isinstance(self, torch.TypedStorage) else self
        if st.device.type == "tpu":
            import io

            b = io.BytesIO()
            torch.save(self, b)
            return (torch.storage._load_from_bytes, (b.getvalue(),))
        return orig(self)

    return __reduce__


def install() -> None:
    """Install every patch (idempotent)."""
    for cls in (torch.UntypedStorage, torch.TypedStorage):
        if cls not in _orig_reduce:
            cls.__reduce__ = _storage_reduce(cls)
    global _orig_new
    if _orig_new is None:
        _orig_new = torch.UntypedStorage.__new__
        torch.UntypedStorage.__new__ = _storage_new
    global _orig_resize
    if _orig_resize is None:
        _orig_resize = torch.UntypedStorage.resize_
        torch.UntypedStorage.resize_ = _storage_resize
    install_pinned()
    install_accelerator()
    install_module_apply()
    install_printing()


# ------------------------------------------------------------------- printing
# ``repr(t)`` / ``print(t)`` format the values element by element: a 0-d tensor and an
# ``item()`` per element, twice (PyTorch's ``_Formatter`` and ``_scalar_str``), each a
# host sync on tpu (3,340 syncs for torchao's ``"FakeTensor" in x.__repr__()`` of one
# decode step).  PyTorch copies xla, lazy, ipu and mtia tensors to the CPU before
# formatting them; tpu tensors get the same: the contents are formatted from one host
# copy (``_tensor_str``), the suffixes (device, dtype, grad_fn) from the tensor itself.
_orig_tensor_str = None


def _tensor_str_via_host(self, indent):
    if self.device.type == "tpu":
        with torch.no_grad():
            self = self.detach().to("cpu")
    return _orig_tensor_str(self, indent)


def install_printing() -> None:
    global _orig_tensor_str
    import torch._tensor_str as ts

    if _orig_tensor_str is None:
        _orig_tensor_str = ts._tensor_str
        ts._tensor_str = _tensor_str_via_host


# --------------------------------------------------------------- pinned memory
# ``Tensor.pin_memory()`` asks the current accelerator's C++ hooks for a pinned-memory
# allocator, which a Python backend cannot provide.  Host->tpu copies go through a
# private host copy anyway (see handlers.host_array), so page-locking buys nothing:
# pin_memory() returns a copy marked as pinned, as CUDA returns a pinned copy.
_orig_pin = None
_orig_is_pinned = None


def _pin_memory(self, device=None):
    if self.device.type != "cpu":
        return _orig_pin(self, device) if device is not None else _orig_pin(self)
    if getattr(self, "_torchtpu_pinned", False):
        return self
    out = self.clone()
    out._torchtpu_pinned = True
    return out


def _is_pinned(self, device=None):
    if self.device.type != "cpu":
        return False
    return bool(getattr(self, "_torchtpu_pinned", False))


def install_pinned() -> None:
    global _orig_pin, _orig_is_pinned
    if _orig_pin is None:
        _orig_pin = torch.Tensor.pin_memory
        _orig_is_pinned = torch.Tensor.is_pinned
        torch.Tensor.pin_memory = _pin_memory
        torch.Tensor.is_pinned = _is_pinned


# --------------------------------------------------------------- torch.accelerator
# torch.accelerator's synchronize and memory queries call C++ device-allocator hooks that a
# Python backend cannot register; route them to torch.tpu when the accelerator is tpu.
_ACCEL = {
    "synchronize": "synchronize",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_peak_memory_stats",
    "empty_cache": "empty_cache",
    "empty_host_cache": "empty_host_cache",
    "get_memory_info": "mem_get_info",
}


_NO_DEVICE = {"empty_cache", "empty_host_cache"}  # torch.tpu functions of _ACCEL that take no device


def _accel_wrapper(orig, target):
    def fn(device_index=None, *args, **kwargs):
        dev = device_index
        if isinstance(dev, (str, torch.device)):
            dev = torch.device(dev)
            if dev.type != "tpu":
                return orig(device_index, *args, **kwargs)
            dev = dev.index
        if target in _NO_DEVICE:  # (torch.accelerator.empty_cache() takes none either)
            return getattr(torch.tpu, target)()
        return getattr(torch.tpu, target)(dev)

    fn.__name__ = getattr(orig, "__name__", target)
    fn.__doc__ = (f"torch.accelerator.{fn.__name__} for the tpu device: "
                  f"torch.tpu.{target} (see its docstring).")
    return fn


def install_accelerator() -> None:
    import torch.accelerator as acc

    for name, target in _ACCEL.items():
        orig = getattr(acc, name, None)
        if orig is not None and not getattr(orig, "_torchtpu", False):
            w = _accel_wrapper(orig, target)
            w._torchtpu = True
            setattr(acc, name, w)


# ------------------------------------------------------- parameter identity in Module.to
# ``Module._apply`` (behind ``.to``, ``.tpu()``, ``.cpu()``, ``.half()``...) keeps each
# Parameter object, swapping its ``.data``, only when ``torch._has_compatible_shallow_copy_type``
# allows it.  PyTorch's C++ rule knows CPU/CUDA/MPS/HIP/XPU/HPU/MTIA but not PrivateUse1, and
# ``param.data = t`` checks the same rule, so ``model.to("tpu")`` would make *new* Parameter
# objects: an optimizer built before the move (accelerate's ``prepare(model, optimizer)``,
# Lightning Fabric...) would keep updating the old CPU tensors and train nothing, and tied
# parameters would come apart.  For a cpu<->tpu move of a parameter we give the Parameter
# object the moved tensor's TensorImpl instead (``torch._C._swap_tensor_impl``; the Python
# object keeps its class, ``__dict__`` and hooks), which is what ``param.data = moved`` does
# on CUDA; its gradient is moved the same way after ``_apply``.  PyTorch's own opt-in flags
# (``torch.__future__.set_overwrite/swap_module_params_on_conversion``) are honoured as is.
_orig_apply = None
_apply_depth = [0]
_MOVABLE = ("cpu", "tpu")


def _crosses_tpu(t, out) -> bool:
    """``out = fn(t)`` moved ``t`` between cpu and tpu (where ``.data =`` is refused)."""
    a, b = t.device.type, out.device.type
    return (a != b and "tpu" in (a, b) and a in _MOVABLE and b in _MOVABLE
            and t.layout == torch.strided and out.layout == torch.strided)


def _poison(grad_outputs):
    raise RuntimeError(
        "torchtpu: this graph was built before its parameter moved between cpu and tpu "
        "(module.to(...)); run backward before moving the module, or rebuild the graph")


def _take_impl(t, new) -> None:
    """Make tensor ``t`` hold ``new``'s data (device, dtype, storage) keeping the Python
    object, its attributes, ``requires_grad``, version number and tensor hooks: what
    ``t.data = new`` does between CPU and CUDA."""
    new = new.detach()  # a fresh TensorImpl sharing new's storage, referenced only here
    new.requires_grad_(t.requires_grad)
    version = t._version
    pre = t._backward_hooks
    post = t._post_accumulate_grad_hooks
    node = None
    if t.requires_grad and t._use_count() > 1:
        # a live graph holds the old tensor (its AccumulateGrad node): a later backward
        # through it would accumulate into the old tensor, so make that graph raise
        node = torch.autograd.graph.get_gradient_edge(t).node
    torch._C._swap_tensor_impl(t, new)  # raises (changing nothing) if t has C++ weakrefs
    if node is not None:
        node.register_prehook(_poison)
    torch._C._autograd._unsafe_set_version_counter((t,), (version,))
    if pre is not None:
        t._backward_hooks = pre  # re-registers the hook dict on the new TensorImpl
    if post is not None:
        t._post_accumulate_grad_hooks = post


def _module_apply(self, fn, recurse=True):
    if (_apply_depth[0] or torch.__future__.get_swap_module_params_on_conversion()
            or torch.__future__.get_overwrite_module_params_on_conversion()):
        return _orig_apply(self, fn, recurse)
    params = {id(p) for m in (self.modules() if recurse else (self,))
              for p in m._parameters.values() if p is not None}
    moved = []  # (parameter, its gradient before the move)

    def keep_identity(t):
        out = fn(t)
        if (id(t) in params and out is not t and type(out) is torch.Tensor
                and _crosses_tpu(t, out)):
            grad = t.grad
            if grad is not None:
                t.grad = None
            try:
                _take_impl(t, out)
            except RuntimeError as e:
                t.grad = grad
                warnings.warn(
                    f"torchtpu: {type(self).__name__}._apply could not keep a Parameter object "
                    f"across the move to {out.device} ({e}); it is replaced by a new one, "
                    f"which an optimizer built before the move does not update")
                return out
            moved.append((t, grad))
            return t  # Module._apply then sees a compatible tensor: t.data = t
        return out

    _apply_depth[0] += 1
    try:
        out = _orig_apply(self, keep_identity, recurse)
    finally:
        _apply_depth[0] -= 1
    for p, grad in moved:  # as Module._apply does for CUDA: param.grad.data = fn(grad)
        if grad is None:
            continue
        with torch.no_grad():
            g = fn(grad)
        if g is not grad:
            if torch._has_compatible_shallow_copy_type(grad, g):
                grad.data = g
            else:
                try:
                    _take_impl(grad, g)
                except RuntimeError:  # (C++ weakrefs) a new gradient object, as before
                    grad = g
        p.grad = grad
    return out


def install_module_apply() -> None:
    global _orig_apply
    if _orig_apply is None:
        _orig_apply = torch.nn.Module._apply
        torch.nn.Module._apply = _module_apply
