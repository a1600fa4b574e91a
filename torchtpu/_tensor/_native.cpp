// Small C++ helper of torchtpu, compiled on first use by torchtpu/_tensor/native.py
// (torch.utils.cpp_extension.load, cached under TORCH_EXTENSIONS_DIR).  Two things that
// PyTorch 2.13's Python backend API cannot do:
//
// 1. make_on_storage: a PrivateUse1 tensor on a given StorageImpl whatever its device
//    index (torch._C._acc.create_empty_tensor always uses index 0, and set_ refuses a
//    storage of another index).
// 2. install_device_guard: a C++ DeviceGuardImpl for PrivateUse1 that replaces the Python
//    one (torch._C._acc.DeviceGuard).  The Python guard answers getDevice() by calling
//    its Python type_() method; the autograd engine calls it from a stream guard's
//    destructor while unwinding an exception that a Python hook raised, with the Python
//    error indicator still set, so that call fails inside a noexcept destructor and the
//    process aborts.  This guard never calls into Python.  It holds the current tpu
//    device index (the one source of truth once installed: torch.tpu.current_device /
//    set_device read and write it through current_device()/set_current_device()).
// 3. set_storage_nbytes: UntypedStorage.resize_ of a tpu storage (FSDP2 frees and
//    re-allocates its unsharded parameters that way).  PyTorch sends it to the C++
//    PrivateUse1 hooks' resizePrivateUse1Bytes, which the Python hooks cannot provide;
//    the device data lives on the storage's Python object, so only the StorageImpl's
//    byte size (and, when it grows, its never-dereferenced address) changes here.
// 4. register_view_kernels: PrivateUse1 kernels for as_strided and view that are PyTorch's
//    own CPU ones (metadata only: a TensorImpl on the same storage).  Without them each
//    view op (x[i], x.view(...)) went C++ -> Python fallback -> CPU kernel, ~13 us; here
//    it stays in C++.
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <torch/csrc/Storage.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>

at::Tensor make_on_storage(py::object storage_obj, std::vector<int64_t> size,
                           std::vector<int64_t> stride, int64_t offset,
                           at::ScalarType dtype) {
  c10::Storage storage = THPStorage_Unpack(storage_obj.ptr());
  TORCH_CHECK(storage.device_type() == c10::DeviceType::PrivateUse1,
              "make_on_storage: expected a tpu storage, got ", storage.device());
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride, offset);
  return t;
}

void set_storage_nbytes(py::object storage_obj, int64_t nbytes, int64_t addr) {
  c10::Storage storage = THPStorage_Unpack(storage_obj.ptr());
  TORCH_CHECK(storage.device_type() == c10::DeviceType::PrivateUse1,
              "set_storage_nbytes: expected a tpu storage, got ", storage.device());
  auto* impl = storage.unsafeGetStorageImpl();
  if (addr != 0) {
    impl->set_data_ptr_noswap(
        c10::DataPtr(reinterpret_cast<void*>(addr), storage.device()));
  }
  impl->set_nbytes(static_cast<size_t>(nbytes));
}

namespace {

// Process-wide, as CUDA's current device is per thread but torch.tpu.set_device has
// always been process-wide in torchtpu (state.current_device).
std::atomic<c10::DeviceIndex> g_current{0};
std::atomic<c10::DeviceIndex> g_count{1};

// Every tpu stream is the one PJRT queue of its device (torchtpu/_device/streams.py):
// the guard only knows default streams, and events need no device work.
struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType T = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return T; }
  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == T);
    c10::Device old = getDevice();
    if (old.index() != d.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(T, g_current.load()); }
  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == T);
    TORCH_CHECK(d.index() >= 0 && d.index() < g_count.load(),
                "tpu: invalid device ordinal ", static_cast<int>(d.index()),
                " (", static_cast<int>(g_count.load()), " devices)");
    g_current.store(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) g_current.store(d.index());
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d.has_index() ? d : getDevice());
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream getNewStream(c10::Device d, int priority = 0) const override {
    (void)priority;
    return getStream(d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return g_count.load(); }
  void record(void** /*event*/, const c10::Stream& /*stream*/,
              const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {}
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* /*event*/, const c10::DeviceIndex /*device_index*/)
      const noexcept override {}
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
};

}  // namespace

// Replace whatever guard is registered for PrivateUse1 (the Python one) by TpuGuardImpl.
// The registry is non-owning and its entries live for the whole process, so the guard is
// leaked on purpose, as C10_REGISTER_GUARD_IMPL does.  Idempotent.
bool install_device_guard(int64_t device_count, int64_t current) {
  static const TpuGuardImpl* impl = nullptr;
  g_count.store(static_cast<c10::DeviceIndex>(device_count));
  g_current.store(static_cast<c10::DeviceIndex>(current));
  if (impl == nullptr) impl = new TpuGuardImpl();
  auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(
      c10::DeviceType::PrivateUse1)];
  bool replaced = slot.load() != impl;
  slot.store(impl);
  return replaced;
}

bool device_guard_installed() {
  auto p = c10::impl::device_guard_impl_registry[static_cast<size_t>(
                                                     c10::DeviceType::PrivateUse1)]
               .load();
  return dynamic_cast<const TpuGuardImpl*>(p) != nullptr;
}

int64_t current_device() { return g_current.load(); }
void set_current_device(int64_t index) {
  g_current.store(static_cast<c10::DeviceIndex>(index));
}

at::Tensor tpu_as_strided(const at::Tensor& self, c10::SymIntArrayRef size,
                          c10::SymIntArrayRef stride, std::optional<c10::SymInt> offset) {
  std::optional<int64_t> off;
  if (offset.has_value()) off = offset->expect_int();
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size),
                                           C10_AS_INTARRAYREF_SLOW(stride), off);
}

at::Tensor tpu_view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

std::unique_ptr<torch::Library> g_view_lib;

bool register_view_kernels() {
  if (g_view_lib) return false;
  g_view_lib = std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  g_view_lib->impl("as_strided", TORCH_FN(tpu_as_strided));
  g_view_lib->impl("view", TORCH_FN(tpu_view));
  return true;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_view_kernels", &register_view_kernels,
        "Register C++ PrivateUse1 kernels for as_strided and view (PyTorch's CPU ones).");
  m.def("make_on_storage", &make_on_storage,
        "A PrivateUse1 tensor viewing a storage (any device index).");
  m.def("set_storage_nbytes", &set_storage_nbytes,
        "Set a tpu StorageImpl's byte size (and, if addr != 0, its fake address).");
  m.def("install_device_guard", &install_device_guard,
        "Register the C++ PrivateUse1 device guard (replaces the Python one).");
  m.def("device_guard_installed", &device_guard_installed);
  m.def("current_device", &current_device);
  m.def("set_current_device", &set_current_device);
}
