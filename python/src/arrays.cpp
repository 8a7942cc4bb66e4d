// SPDX-License-Identifier: Apache-2.0
// The array bridge: numpy arrays, torch tensors and anything else exposing
// the buffer protocol, DLPack or __array_interface__ → pushpull::ArrayView,
// aliasing the object's memory (never a copy). See bindings.h for the contract.
//
// Order of the protocols: the buffer protocol first (numpy, memoryview,
// bytearray: it carries the read-only flag, which DLPack does not), then
// DLPack (torch tensors; no libtorch at build time), then
// __array_interface__ (other array libraries).
#include <Python.h>

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "bindings.h"
#include "pushpull/error.h"

namespace pushpull::python {
namespace {

// DLPack's stable ABI (dlpack.h v0.x, the "dltensor" capsule of torch >= 1.10).
// Declared here so the build needs neither dlpack.h nor libtorch.
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLROCM = 10, kDLCUDAManaged = 13;
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4;
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; nullptr = C-contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

constexpr const char* kSupported =
    "pushpull supports float32, float16, bfloat16, float64, int32, int64, int8 and uint8";

[[noreturn]] void invalid(std::string_view what, const std::string& problem) {
  throw InvalidArgument(fmt::format("{}: {}", what, problem));
}

std::string type_name(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__qualname__")).cast<std::string>();
}

// numpy's / torch's name for the object's dtype when it has one.
std::string dtype_text(py::handle obj, std::string_view fallback) {
  if (py::hasattr(obj, "dtype")) return py::str(obj.attr("dtype")).cast<std::string>();
  return std::string(fallback);
}

[[noreturn]] void unsupported_dtype(py::handle obj, std::string_view what,
                                    std::string_view fallback) {
  invalid(what, fmt::format("unsupported dtype {}; {}", dtype_text(obj, fallback), kSupported));
}

[[noreturn]] void not_contiguous(std::string_view what) {
  invalid(what,
          "the array is not contiguous (a transposed or sliced view?); pass a C-contiguous one, "
          "e.g. numpy.ascontiguousarray(a) or tensor.contiguous()");
}

[[noreturn]] void read_only(std::string_view what) {
  invalid(what,
          "the array is read-only but this call writes into it; pass a writable array (e.g. "
          "a.copy())");
}

Shape make_shape(py::handle obj, std::string_view what, int ndim, const int64_t* dims) {
  if (ndim > Shape::kMaxDims)
    invalid(what, fmt::format("{} has {} dimensions; pushpull arrays have at most {}",
                              type_name(obj), ndim, Shape::kMaxDims));
  return Shape(std::span<const int64_t>(dims, static_cast<size_t>(ndim)));
}

// C-contiguous for strides given in units of `unit` bytes (size-1 dimensions
// and empty arrays have any strides).
bool c_contiguous(const Shape& shape, const int64_t* strides, int64_t unit, int64_t itemsize) {
  if (strides == nullptr || shape.numel() == 0) return true;
  int64_t expected = itemsize / unit;
  for (int i = shape.ndim() - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

// ---- buffer protocol -----------------------------------------------------

std::optional<DType> dtype_from_format(const char* format, Py_ssize_t itemsize) {
  std::string_view f = format ? format : "B";
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.remove_prefix(1);
  if (f.size() != 1) return std::nullopt;
  switch (f[0]) {
    case 'f':
      return itemsize == 4 ? std::optional(DType::kFloat32) : std::nullopt;
    case 'd':
      return itemsize == 8 ? std::optional(DType::kFloat64) : std::nullopt;
    case 'e':
      return itemsize == 2 ? std::optional(DType::kFloat16) : std::nullopt;
    case 'b':
      return DType::kInt8;
    case 'B':
      return DType::kUInt8;
    case 'i':
    case 'l':
    case 'q':
      if (itemsize == 4) return DType::kInt32;
      if (itemsize == 8) return DType::kInt64;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

void release_buffer(void* p) {
  auto* buf = static_cast<Py_buffer*>(p);
  PyBuffer_Release(buf);
  delete buf;
}

Pinned pin_buffer(py::handle obj, bool writable, std::string_view what) {
  auto* buf = new Py_buffer{};
  if (PyObject_GetBuffer(obj.ptr(), buf, PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
    delete buf;
    py::error_already_set err;
    invalid(what, fmt::format("cannot read the {} as an array: {}", type_name(obj), err.what()));
  }
  // From here the capsule owns the buffer (released on every error path too).
  py::capsule owner(buf, &release_buffer);
  if (writable && buf->readonly) read_only(what);
  auto dtype = dtype_from_format(buf->format, buf->itemsize);
  if (!dtype) unsupported_dtype(obj, what, fmt::format("'{}'", buf->format ? buf->format : "B"));
  static_assert(sizeof(Py_ssize_t) == sizeof(int64_t));
  Shape shape = make_shape(obj, what, buf->ndim, reinterpret_cast<const int64_t*>(buf->shape));
  if (buf->ndim > 0 &&
      !c_contiguous(shape, reinterpret_cast<const int64_t*>(buf->strides), 1, buf->itemsize))
    not_contiguous(what);
  return Pinned{ArrayView(buf->buf, *dtype, shape), std::move(owner)};
}

// ---- DLPack ----------------------------------------------------------------

void check_dlpack_device(py::handle obj, std::string_view what) {
  py::tuple dev = obj.attr("__dlpack_device__")();
  const int type = dev[0].cast<int>();
  if (type == kDLCPU || type == kDLCUDAHost) return;
  if (type == kDLCUDA || type == kDLCUDAManaged || type == kDLROCM)
    invalid(what, fmt::format("the tensor is on GPU {}; CUDA tensors are not supported yet; call "
                              ".cpu()",
                              dev[1].cast<int>()));
  invalid(what, fmt::format("the tensor is on a device of DLPack type {}; only CPU memory is "
                            "supported; call .cpu()",
                            type));
}

void delete_managed(void* p) {
  auto* t = static_cast<DLManagedTensor*>(p);
  if (t->deleter) t->deleter(t);
}

std::optional<DType> dtype_from_dlpack(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == kDLFloat && t.bits == 32) return DType::kFloat32;
  if (t.code == kDLFloat && t.bits == 16) return DType::kFloat16;
  if (t.code == kDLFloat && t.bits == 64) return DType::kFloat64;
  if (t.code == kDLBfloat && t.bits == 16) return DType::kBFloat16;
  if (t.code == kDLInt && t.bits == 32) return DType::kInt32;
  if (t.code == kDLInt && t.bits == 64) return DType::kInt64;
  if (t.code == kDLInt && t.bits == 8) return DType::kInt8;
  if (t.code == kDLUInt && t.bits == 8) return DType::kUInt8;
  return std::nullopt;
}

Pinned pin_dlpack(py::handle obj, std::string_view what) {
  if (py::hasattr(obj, "__dlpack_device__")) check_dlpack_device(obj, what);
  py::object source = py::reinterpret_borrow<py::object>(obj);
  // torch refuses to export a tensor that requires grad; its detached alias
  // shares the memory (and the version counter), which is all we need.
  if (py::hasattr(obj, "requires_grad") && py::bool_(obj.attr("requires_grad")))
    source = obj.attr("detach")();
  // dtypes DLPack cannot express (torch.bool, complex) make __dlpack__ throw.
  if (py::hasattr(obj, "dtype")) {
    const std::string name = dtype_text(obj, "");
    if (name == "torch.bool" || name.find("complex") != std::string::npos)
      unsupported_dtype(obj, what, name);
  }
  py::object capsule;
  try {
    capsule = source.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    invalid(what, fmt::format("cannot export the {} through DLPack: {}", type_name(obj), e.what()));
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    invalid(what, fmt::format("{}.__dlpack__() did not return an unused 'dltensor' capsule",
                              type_name(obj)));
  }
  // Consume it (the producer's capsule destructor then leaves it alone) and
  // own it: the deleter runs when the last keep-alive reference goes.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  py::capsule owner(managed, &delete_managed);
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
    invalid(what,
            "the tensor is not in CPU memory; CUDA tensors are not supported yet; call .cpu()");
  auto dtype = dtype_from_dlpack(t.dtype);
  if (!dtype)
    unsupported_dtype(obj, what, fmt::format("DLPack code {} bits {}", t.dtype.code, t.dtype.bits));
  Shape shape = make_shape(obj, what, t.ndim, t.shape);
  const auto itemsize = static_cast<int64_t>(dtype_size(*dtype));
  if (!c_contiguous(shape, t.strides, itemsize, itemsize)) not_contiguous(what);
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  return Pinned{ArrayView(data, *dtype, shape), std::move(owner)};
}

// ---- __array_interface__ -----------------------------------------------------

std::optional<DType> dtype_from_typestr(std::string_view s) {
  if (s.size() < 3 || s[0] == '>') return std::nullopt;
  const std::string_view k = s.substr(1);
  if (k == "f4") return DType::kFloat32;
  if (k == "f2") return DType::kFloat16;
  if (k == "f8") return DType::kFloat64;
  if (k == "i4") return DType::kInt32;
  if (k == "i8") return DType::kInt64;
  if (k == "i1") return DType::kInt8;
  if (k == "u1") return DType::kUInt8;
  return std::nullopt;
}

Pinned pin_array_interface(py::handle obj, bool writable, std::string_view what) {
  py::dict ai = obj.attr("__array_interface__");
  const std::string typestr = ai["typestr"].cast<std::string>();
  auto dtype = dtype_from_typestr(typestr);
  if (!dtype) unsupported_dtype(obj, what, typestr);
  if (!ai.contains("data") || !py::isinstance<py::tuple>(ai["data"]))
    invalid(what, fmt::format("the {}'s __array_interface__ has no (pointer, read_only) data "
                              "tuple; pass a numpy array or torch tensor",
                              type_name(obj)));
  py::tuple data = ai["data"];
  if (writable && data[1].cast<bool>()) read_only(what);
  std::vector<int64_t> dims;
  for (py::handle d : py::tuple(ai["shape"]))
    dims.push_back(d.cast<int64_t>());
  Shape shape = make_shape(obj, what, static_cast<int>(dims.size()), dims.data());
  if (ai.contains("strides") && !ai["strides"].is_none()) {
    std::vector<int64_t> strides;
    for (py::handle d : py::tuple(ai["strides"]))
      strides.push_back(d.cast<int64_t>());
    const auto itemsize = static_cast<int64_t>(dtype_size(*dtype));
    if (!c_contiguous(shape, strides.data(), 1, itemsize)) not_contiguous(what);
  }
  auto* ptr = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  return Pinned{ArrayView(ptr, *dtype, shape), py::reinterpret_borrow<py::object>(obj)};
}

}  // namespace

Pinned pin(py::handle obj, bool writable, std::string_view what) {
  if (obj.is_none()) invalid(what, "expected a numpy array or torch tensor, got None");
  if (PyObject_CheckBuffer(obj.ptr())) return pin_buffer(obj, writable, what);
  if (py::hasattr(obj, "__dlpack__")) return pin_dlpack(obj, what);
  if (py::hasattr(obj, "__array_interface__")) return pin_array_interface(obj, writable, what);
  if (py::hasattr(obj, "__cuda_array_interface__"))
    invalid(what, "the array is in GPU memory; CUDA tensors are not supported yet; call .cpu()");
  invalid(what, fmt::format("expected a numpy array or torch tensor (buffer protocol, __dlpack__ "
                            "or __array_interface__), got {}",
                            type_name(obj)));
}

ArrayView to_view(py::handle obj, bool writable, std::string_view what) {
  return pin(obj, writable, what).view;
}

void bind_arrays(py::module_& m) {
  m.def(
      "_array_info",
      [](py::handle obj, bool writable) {
        Pinned p = pin(obj, writable, "array");
        py::tuple shape(p.view.shape.ndim());
        for (int i = 0; i < p.view.shape.ndim(); ++i)
          shape[i] = p.view.shape[i];
        return py::make_tuple(std::string(dtype_name(p.view.dtype)), shape,
                              reinterpret_cast<uintptr_t>(p.view.data));
      },
      py::arg("obj"), py::arg("writable") = false,
      "(dtype name, shape, data address) of the view pushpull takes of `obj` (for tests).");
}

}  // namespace pushpull::python
