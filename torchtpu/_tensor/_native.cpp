// The one thing PyTorch 2.13's Python backend API cannot do: make a PrivateUse1 tensor
// on a given StorageImpl whatever its device index (torch._C._acc.create_empty_tensor
// always uses index 0, and set_ refuses a storage of another index).  Built on first use
// of a tpu:N>0 tensor by torchtpu/_tensor/native.py.
#include <torch/extension.h>
#include <torch/csrc/Storage.h>

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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("make_on_storage", &make_on_storage,
        "A PrivateUse1 tensor viewing a storage (any device index).");
}
