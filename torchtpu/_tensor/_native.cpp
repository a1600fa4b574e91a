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
// 5. HotPlan: strict eager's per-op hot path in C++ (torchtpu/eager/hotpath.py says what
//    it does; this is the same hot key, lookup, executable call and result wrapping,
//    without per-op Python).
// 6. register_kernels: the C++ PrivateUse1 kernel of every lowered ATen op (see "C++ op
//    kernels" below): the hot path's hits run without a Python frame.
// 7. graph_gather: a compiled graph call's input loop (torchtpu/compile/graph.py,
//    GraphExecutable._gather says what it does), in one call.
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
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <structmember.h>

#include <atomic>
#include <string>
#include <unordered_map>
#include <vector>

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


// ------------------------------------------------------------------------ hot path
// See torchtpu/eager/hotpath.py: HotPlan(...)(args, kwargs) runs one call of a lowered op
// whose executable the plan's table knows; otherwise it returns (MISS, vals, hot) with the
// normalized, prepared arguments and the call's hot gather (or None), for the Python
// general path.  The hot key it builds is exactly hotpath.gather's (one table, filled by
// either).
namespace hot {

enum Code { TENSOR = 0, LIST = 1, DYN_SCALAR = 2, CONST_SCALAR = 3, CONST = 4,
            DYN_SCALAR_LIST = 5 };

struct Globals {
  py::object executable_cls, allocator;
  py::object array_cls, storage_data_cls, asarray, np_bool, np_int, np_float, np_complex,
      lazy_cls;
  py::object default_marker, miss, inflight, cache, call_donating, call_other,
      wrap_other, group_results, check_pending, next_addr,
      matmul_precision, float_tag, defer_record;
  int64_t donate_after = 0, addr_align = 512, check_limit = 256;
};
Globals* G = nullptr;  // set once by setup(); lives as long as the process

PyObject *s_tpu, *s_move_to_end, *s_last_outputs, *s_pending_checks, *s_value, *s_resolve, *s_owner;

// Counters of the C++ kernels, folded into torchtpu.metrics() when it is read
// (take_counts): a Python attribute increment per op cost ~0.1 us each.
enum Count { C_OPS_DISPATCHED = 0, C_LOWERED_OPS, C_CACHE_HITS, C_HOT_PATH_CALLS, C_N };
int64_t g_counts[C_N] = {0, 0, 0, 0};

py::object steal(PyObject* o) {
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

// Slot attributes of executables.Executable and storage.StorageData (both __slots__ classes)
// read and written at their offsets: the descriptor protocol of a getattr cost ~35 ns,
// and a hit reads about fifteen of them.  An object of another class (a subclass) goes
// through getattr/setattr as before.
struct Slot {
  PyTypeObject* type = nullptr;
  Py_ssize_t offset = 0;
  PyObject* name = nullptr;
};
enum ExSlot { EX_CALL = 0, EX_OUT_META, EX_WRITES, EX_DEVICE_INDEX, EX_COMPILED,
              EX_CHECK_INFO, EX_GROUPS, EX_KEY, EX_CALLS, EX_N };
enum SdSlot { SD_ARR = 0, SD_SHAPE, SD_DTYPE, SD_INDEX, SD_NBYTES, SD_COUNTED, SD_N };
Slot g_ex[EX_N], g_sd[SD_N];

void find_slots(py::object cls, Slot* slots, const char* const* names, int n) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  for (int i = 0; i < n; ++i) {
    PyObject* d = PyDict_GetItemString(type->tp_dict, names[i]);
    if (d == nullptr || Py_TYPE(d) != &PyMemberDescr_Type ||
        reinterpret_cast<PyMemberDescrObject*>(d)->d_member->type != T_OBJECT_EX)
      throw std::runtime_error(std::string("torchtpu hot path: ") + type->tp_name + "." +
                               names[i] + " is not a __slots__ attribute");
    slots[i].type = type;
    slots[i].offset = reinterpret_cast<PyMemberDescrObject*>(d)->d_member->offset;
    slots[i].name = PyUnicode_InternFromString(names[i]);
  }
}

inline PyObject** slot_ptr(PyObject* obj, const Slot& s) {
  return reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + s.offset);
}

// obj.<slot> (a new reference)
inline py::object get(PyObject* obj, const Slot& s) {
  if (Py_TYPE(obj) == s.type) {
    PyObject* v = *slot_ptr(obj, s);
    if (v != nullptr) return py::reinterpret_borrow<py::object>(v);
  }
  return steal(PyObject_GetAttr(obj, s.name));
}

// obj.<slot> = v
inline void put(PyObject* obj, const Slot& s, PyObject* v) {
  if (Py_TYPE(obj) == s.type) {
    PyObject** p = slot_ptr(obj, s);
    PyObject* old = *p;
    Py_INCREF(v);
    *p = v;
    Py_XDECREF(old);
    return;
  }
  if (PyObject_SetAttr(obj, s.name, v) < 0) throw py::error_already_set();
}

// storage._Allocator.alloc (sign 1) / free (sign -1) of ALLOCATOR, in C: its per-device
// byte counts (dicts index -> bytes), peak and allocation count.  The Python methods say
// what they mean; a change there must be made here too.
void bump(PyObject* obj, PyObject* name);

void account(PyObject* index, PyObject* nbytes, int sign) {
  static PyObject *s_allocated = PyUnicode_InternFromString("allocated"),
                  *s_peak = PyUnicode_InternFromString("peak"),
                  *s_num_allocs = PyUnicode_InternFromString("num_allocs");
  PyObject* a = G->allocator.ptr();
  py::object allocated = steal(PyObject_GetAttr(a, s_allocated));
  PyObject* prev = PyDict_GetItemWithError(allocated.ptr(), index);
  if (prev == nullptr && PyErr_Occurred()) throw py::error_already_set();
  long long cur = (prev == nullptr ? 0 : PyLong_AsLongLong(prev)) +
                  sign * PyLong_AsLongLong(nbytes);
  if (PyErr_Occurred()) throw py::error_already_set();
  py::object curo = steal(PyLong_FromLongLong(cur));
  if (PyDict_SetItem(allocated.ptr(), index, curo.ptr()) < 0) throw py::error_already_set();
  if (sign < 0) return;
  py::object peak = steal(PyObject_GetAttr(a, s_peak));
  PyObject* p = PyDict_GetItemWithError(peak.ptr(), index);
  if (p == nullptr && PyErr_Occurred()) throw py::error_already_set();
  if (p == nullptr || cur > PyLong_AsLongLong(p)) {
    if (PyDict_SetItem(peak.ptr(), index, curo.ptr()) < 0) throw py::error_already_set();
  }
  bump(a, s_num_allocs);
}

// StorageData.__del__ once the hot path is set up (a method descriptor: no Python frame):
// the storage's device bytes are no longer allocated.  Never raises, as the Python one.
PyObject* storage_data_del(PyObject* self, PyObject*) {
  try {
    py::object counted = get(self, g_sd[SD_COUNTED]);
    if (counted.ptr() == Py_True) {
      py::object index = get(self, g_sd[SD_INDEX]), nbytes = get(self, g_sd[SD_NBYTES]);
      account(index.ptr(), nbytes.ptr(), -1);
    }
  } catch (...) {
  }
  PyErr_Clear();
  Py_RETURN_NONE;
}
PyMethodDef g_sd_del_def = {"__del__", storage_data_del, METH_NOARGS,
                            "StorageData.__del__ (C form)"};

// fn(args...) through the vectorcall protocol (pybind11's call builds a tuple and casts)
template <typename... A>
py::object call(const py::object& fn, A... args) {
  return steal(PyObject_CallFunctionObjArgs(fn.ptr(), static_cast<PyObject*>(args)..., nullptr));
}

void bump(PyObject* obj, PyObject* name) {
  py::object v = steal(PyObject_GetAttr(obj, name));
  py::object one = steal(PyLong_FromLong(1));
  py::object n = steal(PyNumber_Add(v.ptr(), one.ptr()));
  if (PyObject_SetAttr(obj, name, n.ptr()) < 0) throw py::error_already_set();
}

void setup(py::dict g) {
  if (G == nullptr) G = new Globals();
  G->array_cls = g["array_cls"];
  G->storage_data_cls = g["storage_data_cls"];
  G->executable_cls = g["executable_cls"];
  G->allocator = g["allocator"];
  {
    static const char* const ex_names[EX_N] = {"call", "out_meta", "writes", "device_index",
                                               "compiled", "check_info", "groups", "key",
                                               "calls"};
    static const char* const sd_names[SD_N] = {"arr", "shape", "dtype", "index", "nbytes",
                                               "counted"};
    find_slots(G->executable_cls, g_ex, ex_names, EX_N);
    find_slots(G->storage_data_cls, g_sd, sd_names, SD_N);
    py::object del = steal(PyDescr_NewMethod(g_sd[0].type, &g_sd_del_def));
    if (PyObject_SetAttrString(G->storage_data_cls.ptr(), "__del__", del.ptr()) < 0)
      throw py::error_already_set();
  }
  G->lazy_cls = g["lazy_cls"];
  G->asarray = g["asarray"];
  G->np_bool = g["np_bool"];
  G->np_int = g["np_int"];
  G->np_float = g["np_float"];
  G->np_complex = g["np_complex"];
  G->default_marker = g["default_marker"];
  G->miss = g["miss"];
  G->inflight = g["inflight"];  // torchtpu.eager.inflight: LAST_OUTPUTS, PENDING_CHECKS
  G->cache = g["cache"];
  G->call_donating = g["call_donating"];
  G->call_other = g["call_other"];
  G->wrap_other = g["wrap_other"];
  G->group_results = g["group_results"];
  G->check_pending = g["check_pending"];
  G->next_addr = g["next_addr"];
  G->matmul_precision = g["matmul_precision"];
  G->defer_record = g["defer_record"];
  G->float_tag = py::str("float");
  G->donate_after = g["donate_after"].cast<int64_t>();
  G->addr_align = g["addr_align"].cast<int64_t>();
  G->check_limit = g["check_limit"].cast<int64_t>();
#define INTERN(var, text) var = PyUnicode_InternFromString(text)
  INTERN(s_tpu, "_tpu");
  INTERN(s_move_to_end, "move_to_end");
  INTERN(s_last_outputs, "LAST_OUTPUTS");
  INTERN(s_pending_checks, "PENDING_CHECKS");
  INTERN(s_value, "value");
  INTERN(s_resolve, "resolve");
  INTERN(s_owner, "owner");
#undef INTERN
}

py::object tuple_of(c10::IntArrayRef xs) {
  py::object t = steal(PyTuple_New(static_cast<Py_ssize_t>(xs.size())));
  for (size_t i = 0; i < xs.size(); ++i)
    PyTuple_SET_ITEM(t.ptr(), i, PyLong_FromLongLong(xs[i]));
  return t;
}

// A constant as hotpath._const makes it (lists as tuples; -0.0 and NaN by their text).
py::object const_of(PyObject* v) {
  if (PyList_CheckExact(v)) return steal(PySequence_Tuple(v));
  if (PyFloat_CheckExact(v)) {
    double d = PyFloat_AS_DOUBLE(v);
    if (d == 0 || d != d) {
      py::object r = steal(PyObject_Repr(v));
      return py::make_tuple(G->float_tag, r);
    }
  }
  return py::reinterpret_borrow<py::object>(v);
}

// The numpy dtype of an exact Python number class, or nullptr.
PyObject* number_np(PyObject* v) {
  PyTypeObject* t = Py_TYPE(v);
  if (t == &PyBool_Type) return G->np_bool.ptr();
  if (t == &PyLong_Type) {
    // an int outside int64 (2**63 <= v < 2**64, an unsigned Scalar to PyTorch): not a
    // hot-path call; the general path (keying.gather) passes it as uint64
    int overflow = 0;
    PyLong_AsLongLongAndOverflow(v, &overflow);
    return overflow ? nullptr : G->np_int.ptr();
  }
  if (t == &PyFloat_Type) return G->np_float.ptr();
  if (t == &PyComplex_Type) return G->np_complex.ptr();
  return nullptr;
}

struct Gather {
  py::list key, arrays, sds, dyn;
  int64_t index = -1;
};

// One tensor of the call into the gather; false: not a hot-path call.  lazy: admit
// DeferAndFuse's pending values (one whose segment ran is replaced by its array first).
bool add_tensor(Gather& g, PyObject* x, bool lazy) {
  if (!THPVariable_Check(x)) return false;
  const at::Tensor& t = THPVariable_Unpack(x);
  if (!t.has_storage() || t.device().type() != c10::DeviceType::PrivateUse1) return false;
  py::object st = steal(THPStorage_Wrap(t.storage()));
  PyObject* sd_raw = PyObject_GetAttr(st.ptr(), s_tpu);
  if (sd_raw == nullptr) {
    PyErr_Clear();
    return false;
  }
  py::object sd = steal(sd_raw);
  py::object arr = get(sd.ptr(), g_sd[SD_ARR]);
  if (reinterpret_cast<PyObject*>(Py_TYPE(arr.ptr())) != G->array_cls.ptr()) {
    if (!lazy || reinterpret_cast<PyObject*>(Py_TYPE(arr.ptr())) != G->lazy_cls.ptr())
      return false;
    py::object value = steal(PyObject_GetAttr(arr.ptr(), s_value));
    if (!value.is_none()) {
      steal(PyObject_CallMethodObjArgs(sd.ptr(), s_resolve, value.ptr(), nullptr));
      arr = get(sd.ptr(), g_sd[SD_ARR]);
    }
  }
  py::object sdtype = get(sd.ptr(), g_sd[SD_DTYPE]);
  py::object sshape = get(sd.ptr(), g_sd[SD_SHAPE]);
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
  auto sizes = t.sizes();
  int64_t off = t.storage_offset();
  bool neg = t.is_neg(), conj = t.is_conj();
  bool same_shape = PyTuple_Check(sshape.ptr()) &&
                    PyTuple_GET_SIZE(sshape.ptr()) == static_cast<Py_ssize_t>(sizes.size());
  if (same_shape) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      PyObject* d = PyTuple_GET_ITEM(sshape.ptr(), i);
      if (!PyLong_Check(d) || PyLong_AsLongLong(d) != sizes[i]) {
        same_shape = false;
        break;
      }
    }
  }
  bool whole = dtype == sdtype.ptr() && same_shape && off == 0 && !neg && !conj &&
               t.is_contiguous();
  int64_t index = t.device().index();
  if (g.index < 0) {
    g.index = index;
  } else if (index != g.index) {
    return false;
  }
  Py_ssize_t n = PyList_GET_SIZE(g.sds.ptr()), j = 0;
  for (; j < n; ++j)
    if (PyList_GET_ITEM(g.sds.ptr(), j) == sd.ptr()) break;
  if (j == n) {
    g.sds.append(sd);
    g.arrays.append(arr);
  }
  py::object shape = tuple_of(sizes);
  py::object jj = steal(PyLong_FromSsize_t(j));
  if (whole) {
    g.key.append(steal(PyTuple_Pack(3, jj.ptr(), shape.ptr(), dtype)));
  } else {
    g.key.append(py::make_tuple(jj, shape, py::handle(dtype), tuple_of(t.strides()),
                                steal(PyLong_FromLongLong(off)), sshape, sdtype,
                                py::bool_(neg), py::bool_(conj)));
  }
  return true;
}

py::object np_value(PyObject* v, PyObject* npdt) {
  return steal(PyObject_CallFunctionObjArgs(G->asarray.ptr(), v, npdt, nullptr));
}

struct HotPlan {
  std::vector<int> codes;
  py::list defaults, names;
  py::dict table;
  py::object prepare, op;
  bool precision = false, mutated = false;
  std::vector<int> mutated_returns;
  int nret = 1;
  std::vector<int> bumped_lists;  // Signature.bumped_lists: version counters to bump
  // prepare's skip_at_defaults: positions at which the schema default objects make
  // prepare a no-op (it is then not called); has_skip false: always called
  bool has_skip = false;
  std::vector<int> prepare_skip;

  HotPlan(std::vector<int> codes_, py::list defaults_, py::list names_, py::dict table_,
          py::object prepare_, py::object op_, bool precision_, bool mutated_,
          std::vector<int> mutated_returns_, int nret_, std::vector<int> bumped_lists_,
          py::object prepare_skip_)
      : codes(std::move(codes_)), defaults(defaults_), names(names_), table(table_),
        prepare(prepare_), op(op_), precision(precision_), mutated(mutated_),
        mutated_returns(std::move(mutated_returns_)), nret(nret_),
        bumped_lists(std::move(bumped_lists_)) {
    if (!prepare_skip_.is_none()) {
      has_skip = true;
      prepare_skip = prepare_skip_.cast<std::vector<int>>();
    }
  }

  // (key, arrays, storages, dyn), or None when the call is not a hot-path one.
  py::object gather(py::list vals, bool lazy) {
    Gather g;
    size_t n = codes.size();
    for (size_t i = 0; i < n; ++i) {
      PyObject* v = PyList_GET_ITEM(vals.ptr(), i);
      int code = codes[i];
      if (code == TENSOR) {
        if (v == Py_None) {
          g.key.append(py::none());
          continue;
        }
        PyObject* npdt = number_np(v);
        if (npdt != nullptr) {  // a wrapped number: a runtime input
          g.key.append(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(v))));
          g.dyn.append(np_value(v, npdt));
          continue;
        }
        if (!add_tensor(g, v, lazy)) return py::none();
      } else if (code == LIST) {
        if (v == Py_None) {
          g.key.append(py::none());
          continue;
        }
        if (!PyList_Check(v) && !PyTuple_Check(v)) return py::none();
        py::object seq = steal(PySequence_Fast(v, "list"));
        Py_ssize_t m = PySequence_Fast_GET_SIZE(seq.ptr());
        g.key.append(steal(PyLong_FromSsize_t(m)));
        PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
        for (Py_ssize_t k = 0; k < m; ++k) {
          if (items[k] == Py_None) {
            g.key.append(py::none());
          } else if (!add_tensor(g, items[k], lazy)) {
            return py::none();
          }
        }
      } else if (code == DYN_SCALAR) {
        if (v == Py_None) {
          g.key.append(py::none());
        } else if (v == PyList_GET_ITEM(defaults.ptr(), i)) {
          g.key.append(G->default_marker);
        } else {
          PyObject* npdt = number_np(v);
          if (npdt == nullptr) return py::none();
          g.key.append(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(v))));
          g.dyn.append(np_value(v, npdt));
        }
      } else if (code == DYN_SCALAR_LIST) {  // Python numbers: runtime inputs, in order
        if (!PyList_Check(v) && !PyTuple_Check(v)) return py::none();
        py::object seq = steal(PySequence_Fast(v, "list"));
        Py_ssize_t m = PySequence_Fast_GET_SIZE(seq.ptr());
        PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
        py::tuple kinds(m);
        for (Py_ssize_t k = 0; k < m; ++k) {
          PyObject* npdt = number_np(items[k]);
          if (npdt == nullptr) return py::none();
          kinds[k] = py::handle(reinterpret_cast<PyObject*>(Py_TYPE(items[k])));
          g.dyn.append(np_value(items[k], npdt));
        }
        g.key.append(py::make_tuple("SL", kinds));
      } else if (code == CONST_SCALAR) {
        if (v == Py_None) {
          g.key.append(py::none());
        } else if (number_np(v) != nullptr) {
          g.key.append(py::make_tuple(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(v))),
                                      const_of(v)));
        } else {
          return py::none();
        }
      } else {
        g.key.append(const_of(v));
      }
    }
    if (g.index < 0) return py::none();
    g.key.append(steal(PyLong_FromLongLong(g.index)));
    g.key.append(py::handle(reinterpret_cast<PyObject*>(torch::getTHPDtype(
        c10::typeMetaToScalarType(c10::get_default_dtype())))));
    if (precision) g.key.append(G->matmul_precision());
    py::object key = steal(PyList_AsTuple(g.key.ptr()));
    return steal(PyTuple_Pack(4, key.ptr(), g.arrays.ptr(), g.sds.ptr(), g.dyn.ptr()));
  }

  py::object miss(py::object vals, py::object hot) {
    return py::make_tuple(G->miss, vals, hot);
  }

  py::object operator()(py::tuple args, py::dict kwargs) {
    size_t n = codes.size();
    Py_ssize_t na = PyTuple_GET_SIZE(args.ptr());
    if (static_cast<size_t>(na) > n) return miss(py::none(), py::none());
    py::list vals(n);
    for (size_t i = 0; i < n; ++i) {
      PyObject* v;
      if (static_cast<Py_ssize_t>(i) < na) {
        v = PyTuple_GET_ITEM(args.ptr(), i);
      } else {
        v = PyDict_GetItemWithError(kwargs.ptr(), PyList_GET_ITEM(names.ptr(), i));
        if (v == nullptr) {
          if (PyErr_Occurred()) throw py::error_already_set();
          v = PyList_GET_ITEM(defaults.ptr(), i);
        }
      }
      Py_INCREF(v);
      PyList_SET_ITEM(vals.ptr(), i, v);
    }
    return call_vals(vals);
  }

  // The call on its arguments in schema order with defaults filled (Signature.normalize).
  // defer: DeferAndFuse records the call (eager.defer.record) instead of running it.
  py::object call_vals(py::list vals, bool defer = false) {
    bool skip = has_skip;
    for (size_t k = 0; skip && k < prepare_skip.size(); ++k) {
      int i = prepare_skip[k];
      skip = PyList_GET_ITEM(vals.ptr(), i) == PyList_GET_ITEM(defaults.ptr(), i);
    }
    if (!prepare.is_none() && !skip) {
      py::object r = prepare(vals);
      if (!PyList_Check(r.ptr())) return miss(py::none(), py::none());
      vals = py::reinterpret_borrow<py::list>(r);
    }
    py::object hot = gather(vals, defer);
    if (hot.is_none()) return miss(vals, hot);
    PyObject* key = PyTuple_GET_ITEM(hot.ptr(), 0);
    PyObject* entry = PyDict_GetItemWithError(table.ptr(), key);
    if (entry == nullptr) {
      if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw py::error_already_set();
        PyErr_Clear();  // an unhashable constant argument
        return miss(vals, py::none());
      }
      return miss(vals, hot);
    }
    if (defer) return record(py::reinterpret_borrow<py::object>(entry), hot, vals);
    return run(py::reinterpret_borrow<py::object>(entry), hot, vals);
  }

  // A hit's inputs: the call's arrays, storages and numbers (with the views' offsets, fixed
  // by the hot key), after counting the hit and moving the executable up in the LRU.
  struct Hit {
    py::list arrays, sds, dyn;
  };
  Hit begin_hit(PyObject* ex, PyObject* offs, const py::object& hot) {
    Hit h{py::reinterpret_borrow<py::list>(PyTuple_GET_ITEM(hot.ptr(), 1)),
          py::reinterpret_borrow<py::list>(PyTuple_GET_ITEM(hot.ptr(), 2)),
          py::reinterpret_borrow<py::list>(PyTuple_GET_ITEM(hot.ptr(), 3))};
    if (offs != Py_None) h.dyn.append(py::handle(offs));
    ++g_counts[C_LOWERED_OPS];
    ++g_counts[C_CACHE_HITS];
    ++g_counts[C_HOT_PATH_CALLS];
    py::object exkey = get(ex, g_ex[EX_KEY]);
    steal(PyObject_CallMethodObjArgs(G->cache.ptr(), s_move_to_end, exkey.ptr(), nullptr));
    return h;
  }

  // An executable with device-side checks returns their flags last: queue them
  // (inflight.PENDING_CHECKS) and return the other outputs.  *over: more are pending than
  // the limit (the caller verifies them after finishing the call).
  py::object take_checks(PyObject* ex, py::object outs, bool* over) {
    py::object check_info = get(ex, g_ex[EX_CHECK_INFO]);
    if (!PyObject_IsTrue(check_info.ptr())) return outs;
    py::object pending = steal(PyObject_GetAttr(G->inflight.ptr(), s_pending_checks));
    Py_ssize_t no = PyTuple_GET_SIZE(outs.ptr());
    py::object last = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(outs.ptr(), no - 1));
    py::list(pending).append(py::make_tuple(last, check_info, op));
    *over = PyList_GET_SIZE(pending.ptr()) > G->check_limit;
    return steal(PyTuple_GetSlice(outs.ptr(), 0, no - 1));
  }

  static Py_ssize_t n_writes(const py::object& writes) {
    return PyList_Check(writes.ptr()) ? PyList_GET_SIZE(writes.ptr()) : 0;
  }

  // DeferAndFuse: append the call to the pending segment; its results are Lazy values.
  py::object record(py::object entry, py::object hot, py::list vals) {
    PyObject* ex = PyTuple_GET_ITEM(entry.ptr(), 0);
    Hit h = begin_hit(ex, PyTuple_GET_ITEM(entry.ptr(), 1), hot);
    py::object outs = steal(PySequence_Tuple(
        G->defer_record(py::handle(ex), h.arrays, h.dyn).ptr()));
    bool over = false;  // (verified when the segment runs, as on the Python path)
    outs = take_checks(ex, outs, &over);
    py::object writes = get(ex, g_ex[EX_WRITES]);
    return finish(ex, h.sds, vals, outs, writes, n_writes(writes));
  }

  py::object run(py::object entry, py::object hot, py::list vals) {
    PyObject* ex = PyTuple_GET_ITEM(entry.ptr(), 0);
    {  // recorded by DeferAndFuse only so far: the general path makes its first call
      py::object compiled = get(ex, g_ex[EX_COMPILED]);
      if (!PyObject_IsTrue(compiled.ptr())) return miss(vals, hot);
    }
    Hit h = begin_hit(ex, PyTuple_GET_ITEM(entry.ptr(), 1), hot);
    int64_t calls = 0;
    {
      py::object c = get(ex, g_ex[EX_CALLS]);
      calls = PyLong_AsLongLong(c.ptr()) + 1;
      if (calls == 0 && PyErr_Occurred()) throw py::error_already_set();
      put(ex, g_ex[EX_CALLS], steal(PyLong_FromLongLong(calls)).ptr());
    }
    py::object writes = get(ex, g_ex[EX_WRITES]);
    Py_ssize_t nw = n_writes(writes);
    py::object outs;
    if (nw > 0 && calls > G->donate_after) {
      outs = G->call_donating(py::handle(ex), h.arrays, h.dyn);
    } else {
      py::object fn = get(ex, g_ex[EX_CALL]);
      PyObject* r = PyObject_CallFunctionObjArgs(fn.ptr(), h.arrays.ptr(), h.dyn.ptr(), nullptr);
      if (r == nullptr) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw py::error_already_set();
        PyErr_Clear();  // another input structure: through jax.jit (executor)
        outs = G->call_other(py::handle(ex), h.arrays, h.dyn);
      } else {
        outs = steal(r);
      }
    }
    if (PyObject_SetAttr(G->inflight.ptr(), s_last_outputs, outs.ptr()) < 0)
      throw py::error_already_set();
    bool check = false;
    outs = take_checks(ex, outs, &check);
    py::object result = finish(ex, h.sds, vals, outs, writes, nw);
    if (check) G->check_pending();
    return result;
  }

  py::object finish(PyObject* ex, py::list sds, py::list vals, py::object outs,
                    py::object writes, Py_ssize_t nw) {
    PyObject* o = outs.ptr();
    for (Py_ssize_t k = 0; k < nw; ++k) {
      Py_ssize_t j = PyLong_AsSsize_t(PyList_GET_ITEM(writes.ptr(), k));
      PyObject* sd = PyList_GET_ITEM(sds.ptr(), j);
      PyObject* arr = PyTuple_GET_ITEM(o, k);
      put(sd, g_sd[SD_ARR], arr);
      if (reinterpret_cast<PyObject*>(Py_TYPE(arr)) == G->lazy_cls.ptr()) {
        py::object ref = steal(PyWeakref_NewRef(sd, nullptr));  // as LoweredPlan._finish
        if (PyObject_SetAttr(arr, s_owner, ref.ptr()) < 0) throw py::error_already_set();
      }
    }
    if (mutated) {
      for (int i : bumped_lists) {  // as LoweredPlan._finish
        py::object seq = steal(PySequence_Fast(PyList_GET_ITEM(vals.ptr(), i), "list"));
        Py_ssize_t m = PySequence_Fast_GET_SIZE(seq.ptr());
        for (Py_ssize_t k = 0; k < m; ++k) {
          PyObject* x = PySequence_Fast_GET_ITEM(seq.ptr(), k);
          if (THPVariable_Check(x)) THPVariable_Unpack(x).unsafeGetTensorImpl()->bump_version();
        }
      }
      if (mutated_returns.size() == 1) return vals[mutated_returns[0]];
      if (mutated_returns.empty()) return py::none();
      py::tuple r(mutated_returns.size());
      for (size_t i = 0; i < mutated_returns.size(); ++i) r[i] = vals[mutated_returns[i]];
      return r;
    }
    py::object meta = get(ex, g_ex[EX_OUT_META]);
    int64_t index = py::cast<int64_t>(get(ex, g_ex[EX_DEVICE_INDEX]));
    py::object seq = steal(PySequence_Fast(meta.ptr(), "out_meta"));
    Py_ssize_t nm = PySequence_Fast_GET_SIZE(seq.ptr());
    py::list results;
    for (Py_ssize_t i = 0; i < nm; ++i) {
      PyObject* m = PySequence_Fast_GET_ITEM(seq.ptr(), i);
      PyObject* arr = PyTuple_GET_ITEM(o, nw + i);
      if (PyTuple_GET_ITEM(m, 3) != Py_None) {  // a permuted layout: Python wraps it
        results.append(G->wrap_other(py::handle(ex), py::handle(arr), py::handle(m)));
      } else {
        results.append(new_tensor(arr, index, PyTuple_GET_ITEM(m, 0), PyTuple_GET_ITEM(m, 1),
                                  PyTuple_GET_ITEM(m, 2)));
      }
    }
    py::object groups = get(ex, g_ex[EX_GROUPS]);
    py::object res = results;
    if (!groups.is_none()) res = G->group_results(results, groups);
    if (nret == 1) return py::reinterpret_borrow<py::list>(res)[0];
    return steal(PySequence_Tuple(res.ptr()));
  }

  static std::vector<int64_t> ints(PyObject* seq_obj) {
    py::object seq = steal(PySequence_Fast(seq_obj, "ints"));
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    std::vector<int64_t> out(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq.ptr(), i));
      if (out[i] == -1 && PyErr_Occurred()) throw py::error_already_set();
    }
    return out;
  }

  // StorageData(arr, shape, dtype, index, nbytes) without its Python __init__ frame: the
  // same slots and the same device-byte accounting (storage.StorageData.__init__ says
  // what they mean; a change there must be made here too).
  static py::object new_storage_data(PyObject* arr, PyObject* shape, PyObject* dtype,
                                     PyObject* index, PyObject* nbytes) {
    auto* type = g_sd[0].type;
    py::object sd = steal(type->tp_alloc(type, 0));
    PyObject* o = sd.ptr();
    put(o, g_sd[SD_ARR], arr);
    put(o, g_sd[SD_SHAPE], shape);
    put(o, g_sd[SD_DTYPE], dtype);
    put(o, g_sd[SD_INDEX], index);
    put(o, g_sd[SD_NBYTES], nbytes);
    bool counted = reinterpret_cast<PyObject*>(Py_TYPE(arr)) != G->lazy_cls.ptr();
    if (!counted) {
      // an asynchronous first call's result (eager.async_compile, Lazy.node "async") is
      // counted at once: it surely gets its buffer (storage.StorageData.__init__)
      py::object node = steal(PyObject_GetAttrString(arr, "node"));
      counted = PyUnicode_Check(node.ptr()) && PyUnicode_CompareWithASCIIString(node.ptr(), "async") == 0;
    }
    put(o, g_sd[SD_COUNTED], counted ? Py_True : Py_False);
    if (counted) {
      account(index, nbytes, 1);
    } else {
      py::object ref = steal(PyWeakref_NewRef(o, nullptr));
      if (PyObject_SetAttr(arr, s_owner, ref.ptr()) < 0) throw py::error_already_set();
    }
    return sd;
  }

  // storage.new_tensor in C++: a new storage (fake address) holding arr, and its tensor.
  static py::object new_tensor(PyObject* arr, int64_t index, PyObject* size, PyObject* stride,
                               PyObject* dtype) {
    at::ScalarType st = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
    std::vector<int64_t> sz = ints(size), sd = ints(stride);
    int64_t numel = 1;
    for (int64_t d : sz) numel *= d;
    int64_t nbytes = numel * static_cast<int64_t>(c10::elementSize(st));
    PyObject* na = G->next_addr.ptr();
    int64_t addr = PyLong_AsLongLong(PyList_GET_ITEM(na, 0));
    py::object next = steal(PyLong_FromLongLong(
        addr + (nbytes / G->addr_align + 1) * G->addr_align));
    if (PyList_SetItem(na, 0, next.release().ptr()) < 0) throw py::error_already_set();
    py::object idx = steal(PyLong_FromLongLong(index));
    py::object nb = steal(PyLong_FromLongLong(nbytes));
    // as torch._C._construct_storage_from_data_pointer makes it: a fixed-size storage on
    // a never-dereferenced address, without an allocator
    c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(nbytes),
                         c10::DataPtr(reinterpret_cast<void*>(addr),
                                      c10::Device(c10::DeviceType::PrivateUse1,
                                                  static_cast<c10::DeviceIndex>(index))),
                         /*allocator=*/nullptr, /*resizable=*/false);
    py::object storage_obj = steal(THPStorage_Wrap(storage));
    py::object shape = steal(PySequence_Tuple(size));
    py::object sdata = new_storage_data(arr, shape.ptr(), dtype, idx.ptr(), nb.ptr());
    if (PyObject_SetAttr(storage_obj.ptr(), s_tpu, sdata.ptr()) < 0) throw py::error_already_set();
    auto t = at::detail::make_tensor<c10::TensorImpl>(
        std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        c10::scalarTypeToTypeMeta(st));
    t.unsafeGetTensorImpl()->set_sizes_and_strides(sz, sd, 0);
    return steal(THPVariable_Wrap(std::move(t)));
  }
};

// ------------------------------------------------------------- C++ op kernels
// The PrivateUse1 kernel of each lowered ATen op once this module is loaded (in place of
// the Python kernels torchtpu._device registers at import): it converts the boxed
// arguments to Python objects as PyTorch's Python kernels get them
// (parseIValuesToPyArgsKwargs), runs the op's HotPlan when strict eager's hot path
// applies, and calls the op's Python runner (its executor plan) otherwise or on a miss.
// This saves the Python frames of the kernel and of LoweredPlan.__call__ on every hit.
struct KernelState {
  py::object runner;  // runner(args, kwargs, missed) -> result: the op's executor plan
  py::object hot;     // the op's HotPlan, or None (not lowered, or no hot-path table)
  HotPlan* hotp = nullptr;  // the C++ object of hot (kept alive by it), or nullptr
  // schema facts, computed at the first call
  bool ready = false;
  std::vector<int> kinds;  // per argument: ARG_* below
  size_t kwarg_only_start = 0;
};
enum ArgKind { ARG_OTHER = 0, ARG_TENSOR, ARG_DTYPE, ARG_LAYOUT, ARG_MEMFMT };
std::unordered_map<std::string, KernelState*>* g_kernels = nullptr;  // leaked: see below
torch::Library* g_kernel_lib = nullptr;
PyObject *s_defer = nullptr, *s_debug_sync = nullptr;
py::object* g_config = nullptr;       // eager.modes.CONFIG
py::object* g_hot_switches = nullptr;  // (hotpath.ENABLED, hotpath.NATIVE): one-item lists

// States are keyed by the qualified overload name, "aten::add.Tensor", "aten::sum.default".
KernelState* kernel_state(const std::string& name) {
  if (g_kernels == nullptr) g_kernels = new std::unordered_map<std::string, KernelState*>();
  auto it = g_kernels->find(name);
  if (it != g_kernels->end()) return it->second;
  auto* st = new KernelState{py::none(), py::none()};
  (*g_kernels)[name] = st;
  return st;
}

// 0: the hot path is off (switched off, Python form chosen, DEBUG mode); 1: STRICT runs
// the call; 2: DEFER_AND_FUSE records it.
int hot_mode() {
  if (G == nullptr || g_config == nullptr) return 0;
  PyObject* sw = g_hot_switches->ptr();
  for (int i = 0; i < 2; ++i) {
    PyObject* l = PyTuple_GET_ITEM(sw, i);
    if (!PyObject_IsTrue(PyList_GET_ITEM(l, 0))) return 0;
  }
  py::object debug = steal(PyObject_GetAttr(g_config->ptr(), s_debug_sync));
  if (PyObject_IsTrue(debug.ptr())) return 0;
  py::object defer = steal(PyObject_GetAttr(g_config->ptr(), s_defer));
  return PyObject_IsTrue(defer.ptr()) ? 2 : 1;
}

int arg_kind(const c10::Argument& a) {
  c10::TypePtr t = a.real_type();
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  switch (t->kind()) {
    case c10::TensorType::Kind: return ARG_TENSOR;
    case c10::ScalarTypeType::Kind: return ARG_DTYPE;
    case c10::LayoutType::Kind: return ARG_LAYOUT;
    case c10::MemoryFormatType::Kind: return ARG_MEMFMT;
    default: return ARG_OTHER;
  }
}

void schema_facts(KernelState* st, const c10::FunctionSchema& schema) {
  const auto& args = schema.arguments();
  st->kinds.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) st->kinds[i] = arg_kind(args[i]);
  size_t k = args.size();
  while (k > 0 && args[k - 1].kwarg_only()) --k;
  st->kwarg_only_start = k;
  st->ready = true;
}

// One boxed argument as the Python kernels of PyTorch get it (dtype/layout/memory format
// objects for those types, torch.jit's conversion for the rest).
py::object to_py(int kind, const c10::IValue& v) {
  if (v.isNone()) return py::none();
  switch (kind) {
    case ARG_TENSOR:
      // (a wrapped number -- the 2.0 of t * 2.0 -- becomes a Python number there)
      if (v.isTensor() && !v.unsafeToTensorImpl()->is_wrapped_number())
        return steal(THPVariable_Wrap(v.toTensor()));
      break;
    case ARG_DTYPE:
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
          torch::getTHPDtype(static_cast<c10::ScalarType>(v.toInt()))));
    case ARG_LAYOUT:
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
          torch::getTHPLayout(static_cast<c10::Layout>(v.toInt()))));
    case ARG_MEMFMT:
      return py::reinterpret_borrow<py::object>(
          torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(v.toInt())));
    default:
      break;
  }
  if (v.isDouble()) return steal(PyFloat_FromDouble(v.toDouble()));
  if (v.isBool()) return py::bool_(v.toBool());
  if (v.isInt()) return steal(PyLong_FromLongLong(v.toInt()));
  return torch::jit::toPyObject(v);
}

void push_result(const c10::OperatorHandle& op, torch::jit::Stack* stack, py::object out) {
  const auto& rets = op.schema().returns();
  if (rets.empty()) {
    TORCH_CHECK(out.is_none(), "torchtpu kernel of ", op.operator_name(),
                " returned a value where the schema returns nothing");
    return;
  }
  auto one = [&](PyObject* o, const c10::Argument& r) {
    if (THPVariable_Check(o) && r.real_type()->kind() == c10::TensorType::Kind) {
      torch::jit::push(stack, THPVariable_Unpack(o));
    } else {
      torch::jit::push(stack, torch::jit::toIValue(o, r.real_type()));
    }
  };
  if (rets.size() == 1) {
    one(out.ptr(), rets[0]);
    return;
  }
  py::object seq = steal(PySequence_Fast(out.ptr(), "torchtpu kernel results"));
  TORCH_CHECK(PySequence_Fast_GET_SIZE(seq.ptr()) == static_cast<Py_ssize_t>(rets.size()),
              "torchtpu kernel of ", op.operator_name(), " returned ",
              PySequence_Fast_GET_SIZE(seq.ptr()), " results where the schema has ",
              rets.size());
  for (size_t i = 0; i < rets.size(); ++i) one(PySequence_Fast_GET_ITEM(seq.ptr(), i), rets[i]);
}

std::string qualified(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.name + "." + (n.overload_name.empty() ? std::string("default") : n.overload_name);
}

void run_kernel(KernelState* st, const c10::OperatorHandle& op, torch::jit::Stack* stack);

struct OpKernel final : public c10::OperatorKernel {
  explicit OpKernel(KernelState* s) : st(s) {}
  KernelState* st;

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet,
                  torch::jit::Stack* stack) {
    run_kernel(st, op, stack);
  }
};

// The PrivateUse1 fallback (every op without a kernel of its own: out= and in-place
// variants, views, torchtpu's own ops): the same as OpKernel, with the state found by the
// op's schema and made at its first call (make_runner(qualified name) -> runner).
std::unordered_map<const void*, KernelState*>* g_fallback_states = nullptr;
py::object* g_make_runner = nullptr;
torch::Library* g_fallback_lib = nullptr;

struct FallbackKernel final : public c10::OperatorKernel {
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet,
                  torch::jit::Stack* stack) {
    const void* k = &op.schema();
    KernelState* st = nullptr;
    py::gil_scoped_acquire gil;  // (the map is only touched with the GIL held)
    {
      auto it = g_fallback_states->find(k);
      if (it != g_fallback_states->end()) st = it->second;
    }
    if (st == nullptr) {
      std::string name = qualified(op);
      st = kernel_state(name);
      if (st->runner.is_none()) st->runner = (*g_make_runner)(name);
      (*g_fallback_states)[k] = st;
    }
    run_kernel(st, op, stack);
  }
};

bool register_fallback(py::object make_runner) {
  if (g_fallback_lib != nullptr) return false;
  if (s_defer == nullptr) {
    s_defer = PyUnicode_InternFromString("defer");
    s_debug_sync = PyUnicode_InternFromString("debug_sync");
  }
  g_make_runner = new py::object(make_runner);
  g_fallback_states = new std::unordered_map<const void*, KernelState*>();
  g_fallback_lib = new torch::Library(torch::Library::IMPL, "_",
                                      c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  g_fallback_lib->fallback(torch::CppFunction::makeFromBoxedFunctor(
      std::make_unique<FallbackKernel>()));
  return true;
}

void run_kernel(KernelState* st, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  {
    const auto& schema = op.schema();
    const auto& sargs = schema.arguments();
    size_t n = sargs.size();
    auto arguments = torch::jit::pop(*stack, n);
    py::gil_scoped_acquire gil;
    if (!st->ready) schema_facts(st, schema);
    // As PyTorch's Python kernels see a call: an argument equal to its default is left
    // out (a trailing positional one, or a keyword-only one) and the plan fills in the
    // default object itself; here it is that object at once.
    size_t pos_end = st->kwarg_only_start;
    auto is_default = [&](size_t i) {
      const auto& d = sargs[i].default_value();
      return d.has_value() && !(*d != arguments[i]);
    };
    while (pos_end > 0 && is_default(pos_end - 1)) --pos_end;
    py::object defaults = st->hotp == nullptr ? py::object() : st->hotp->defaults;
    py::list vals(n);
    std::vector<char> omitted(n, 0);
    for (size_t i = 0; i < n; ++i) {
      omitted[i] = i >= pos_end && (i < st->kwarg_only_start || is_default(i));
      py::object v;
      if (omitted[i] && defaults) {
        v = py::reinterpret_borrow<py::object>(PyList_GET_ITEM(defaults.ptr(), i));
      } else {
        v = to_py(st->kinds[i], arguments[i]);
      }
      PyList_SET_ITEM(vals.ptr(), i, v.release().ptr());
    }
    ++g_counts[C_OPS_DISPATCHED];
    int mode = st->hotp == nullptr ? 0 : hot_mode();
    py::object missed = py::none();
    if (mode != 0) {
      py::object r = st->hotp->call_vals(vals, mode == 2);
      PyObject* rp = r.ptr();
      if (!(PyTuple_Check(rp) && PyTuple_GET_SIZE(rp) == 3 &&
            PyTuple_GET_ITEM(rp, 0) == G->miss.ptr())) {
        push_result(op, stack, std::move(r));
        return;
      }
      missed = std::move(r);  // (MISS, vals, hot): the runner goes on from there
    }
    py::tuple args(pos_end);
    py::dict kwargs;
    for (size_t i = 0; i < n; ++i) {
      if (i < pos_end) {
        args[i] = vals[i];
      } else if (!omitted[i]) {
        kwargs[py::str(sargs[i].name())] = vals[i];
      }
    }
    push_result(op, stack, st->runner(args, kwargs, missed));
  }
}

// Register the C++ kernel for each op name ("add.Tensor") with its Python runner.  The
// Python kernels stay registered underneath (PyTorch keeps the earlier kernel of an
// (op, key) and calls the latest): replacing rather than destroying them is safe while
// one of them is running, which is where the module gets loaded.  The library and the
// states are never destroyed: at exit the dispatcher may outlive the interpreter.
void register_kernels(std::vector<std::string> names, std::vector<std::string> keys,
                      py::list runners) {
  TORCH_CHECK(names.size() == keys.size() &&
                  names.size() == static_cast<size_t>(py::len(runners)),
              "register_kernels: ", names.size(), " names, ", keys.size(), " keys, ",
              py::len(runners), " runners");
  if (g_kernel_lib == nullptr) {
    g_kernel_lib = new torch::Library(torch::Library::IMPL, "aten",
                                      c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  }
  if (s_defer == nullptr) {
    s_defer = PyUnicode_InternFromString("defer");
    s_debug_sync = PyUnicode_InternFromString("debug_sync");
  }
  // PyTorch warns (once per process) that a kernel replaces an earlier one: expected here
  struct Quiet : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  for (size_t i = 0; i < names.size(); ++i) {
    KernelState* st = kernel_state(keys[i]);
    st->runner = runners[i];
    g_kernel_lib->impl(names[i].c_str(),
                       torch::CppFunction::makeFromBoxedFunctor(std::make_unique<OpKernel>(st)));
  }
}

// The switches the kernels read on every call.
void set_kernel_switches(py::object config, py::list enabled, py::list native) {
  if (g_config == nullptr) {
    g_config = new py::object();
    g_hot_switches = new py::object();
  }
  *g_config = config;
  *g_hot_switches = py::make_tuple(enabled, native);
}

// The HotPlan the kernel of op name runs (None: none).  Returns whether a C++ kernel is
// registered for that name.
bool set_kernel_hot(const std::string& name, py::object plan) {
  KernelState* st = kernel_state(name);
  st->hot = plan;
  st->hotp = plan.is_none() ? nullptr : &plan.cast<HotPlan&>();
  return !st->runner.is_none();
}

// torchtpu.compile.graph.GraphExecutable.__call__'s input loop (graph._gather says what
// it does; a change there must be made here too), for a compiled graph's every call:
// (key entries, arrays, StorageData list, storages, device index or None, lazy), or None
// where the call needs the Python loop: a value it raises an error for (a tensor of
// another device, tensors of two tpu devices), a neg/conj view, a storage whose array is
// neither a JAX array nor a pending DeferAndFuse value the call may read.
py::object graph_gather(py::sequence args, bool stitch, py::object async_marker,
                        py::object cpu_key) {
  if (G == nullptr) return py::none();
  static PyObject *s_t = PyUnicode_InternFromString("t"),
                  *s_v = PyUnicode_InternFromString("v"),
                  *s_seg = PyUnicode_InternFromString("seg"),
                  *s_node = PyUnicode_InternFromString("node");
  py::list key, arrays, sdatas, storages;
  std::unordered_map<PyObject*, Py_ssize_t> slot_of;
  int64_t index = -1;
  bool lazy = false;
  py::object seq = steal(PySequence_Fast(args.ptr(), "graph inputs"));
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* x = items[i];
    if (!THPVariable_Check(x)) {
      key.append(steal(PyTuple_Pack(2, s_v, x)));
      continue;
    }
    const at::Tensor& t = THPVariable_Unpack(x);
    if (t.device().is_cpu()) {
      key.append(cpu_key);
      continue;
    }
    if (!t.has_storage() || t.device().type() != c10::DeviceType::PrivateUse1)
      return py::none();
    int64_t idx = t.device().index();
    if (index < 0) {
      index = idx;
    } else if (idx != index) {
      return py::none();
    }
    py::object st = steal(THPStorage_Wrap(t.storage()));
    PyObject* sd_raw = PyObject_GetAttr(st.ptr(), s_tpu);
    if (sd_raw == nullptr) {
      PyErr_Clear();
      return py::none();
    }
    py::object sd = steal(sd_raw);
    Py_ssize_t j;
    auto it = slot_of.find(sd.ptr());
    if (it != slot_of.end()) {
      j = it->second;
    } else {
      j = PyList_GET_SIZE(arrays.ptr());
      py::object arr = get(sd.ptr(), g_sd[SD_ARR]);
      PyObject* cls = reinterpret_cast<PyObject*>(Py_TYPE(arr.ptr()));
      if (cls == G->array_cls.ptr()) {
        arrays.append(arr);
      } else if (cls == G->lazy_cls.ptr() && stitch) {
        py::object node = steal(PyObject_GetAttr(arr.ptr(), s_node));
        if (node.ptr() == async_marker.ptr()) return py::none();
        py::object value = steal(PyObject_GetAttr(arr.ptr(), s_value));
        if (value.is_none()) {
          py::object sg = steal(PyObject_GetAttr(arr.ptr(), s_seg));
          if (sg.is_none()) return py::none();
          arrays.append(arr);
        } else {
          arrays.append(value);
        }
        lazy = true;
      } else {
        return py::none();
      }
      slot_of.emplace(sd.ptr(), j);  // (sdatas keeps sd alive)
      sdatas.append(sd);
      storages.append(st);
    }
    if (t.is_neg() || t.is_conj()) return py::none();
    py::object sshape = get(sd.ptr(), g_sd[SD_SHAPE]);
    py::object sdtype = get(sd.ptr(), g_sd[SD_DTYPE]);
    PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
    auto sizes = t.sizes();
    int64_t off = t.storage_offset();
    bool whole = dtype == sdtype.ptr() && off == 0 && PyTuple_Check(sshape.ptr()) &&
                 PyTuple_GET_SIZE(sshape.ptr()) == static_cast<Py_ssize_t>(sizes.size());
    for (size_t d = 0; whole && d < sizes.size(); ++d) {
      PyObject* v = PyTuple_GET_ITEM(sshape.ptr(), d);
      whole = PyLong_Check(v) && PyLong_AsLongLong(v) == sizes[d];
    }
    whole = whole && t.is_contiguous();
    py::object shape = tuple_of(sizes);
    py::object spec;
    if (whole) {
      spec = steal(PyTuple_Pack(2, shape.ptr(), dtype));
    } else {
      py::object strides = tuple_of(t.strides());
      py::object offo = steal(PyLong_FromLongLong(off));
      spec = steal(PyTuple_Pack(6, shape.ptr(), dtype, strides.ptr(), offo.ptr(),
                                sshape.ptr(), sdtype.ptr()));
    }
    py::object jo = steal(PyLong_FromSsize_t(j));
    key.append(steal(PyTuple_Pack(3, s_t, jo.ptr(), spec.ptr())));
  }
  py::object idx = index < 0 ? py::none() : steal(PyLong_FromLongLong(index));
  return py::make_tuple(key, arrays, sdatas, storages, idx, py::bool_(lazy));
}

// The counts since the last call, as (metrics attribute, count) pairs; zeroes them.
py::list take_counts() {
  static const char* names[C_N] = {"ops_dispatched", "lowered_ops", "cache_hits",
                                   "hot_path_calls"};
  py::list out;
  for (int i = 0; i < C_N; ++i) {
    if (g_counts[i] != 0) out.append(py::make_tuple(names[i], g_counts[i]));
    g_counts[i] = 0;
  }
  return out;
}

}  // namespace hot

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("hot_setup", &hot::setup, "Hand the hot path the Python objects it works with.");
  py::class_<hot::HotPlan>(m, "HotPlan")
      .def(py::init<std::vector<int>, py::list, py::list, py::dict, py::object, py::object,
                    bool, bool, std::vector<int>, int, std::vector<int>, py::object>())
      .def("gather", &hot::HotPlan::gather, py::arg("vals"), py::arg("lazy") = false)
      .def("__call__", &hot::HotPlan::operator());
  m.def("register_kernels", &hot::register_kernels,
        "Register the C++ PrivateUse1 kernels of ATen ops (names like 'add.Tensor', keys "
        "'aten::add.Tensor') over their Python kernels; runners[i](args, kwargs, missed) "
        "runs op i when the hot path does not finish the call.");
  m.def("register_fallback", &hot::register_fallback,
        "Register the C++ PrivateUse1 fallback; make_runner(qualified name) gives an op's "
        "runner at its first call.  False if it is registered already.");
  m.def("set_kernel_switches", &hot::set_kernel_switches,
        "The eager CONFIG and the hot path's ENABLED/NATIVE lists the C++ kernels read.");
  m.def("set_kernel_hot", &hot::set_kernel_hot,
        "The HotPlan (or None) the C++ kernel of an op ('aten::add.Tensor') runs; whether "
        "a runner is known for it.");
  m.def("graph_gather", &hot::graph_gather,
        "A compiled graph call's inputs: (key entries, arrays, StorageData list, "
        "storages, index, lazy), or None for the Python loop (torchtpu.compile.graph).");
  m.def("take_counts", &hot::take_counts,
        "The C++ kernels' metric counts since the last call, [(attribute, count)]; zeroes "
        "them.");
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
