#include "pushpull/array.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "pushpull/checked.h"
#include "pushpull/error.h"

namespace pushpull {

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  if (dims.size() > static_cast<size_t>(kMaxDims))
    throw InvalidArgument(
        fmt::format("shape has {} dimensions; at most {} are supported", dims.size(), kMaxDims));
  for (int64_t d : dims) {
    if (d < 0) throw InvalidArgument(fmt::format("shape dimension {} is negative", d));
  }
  int64_t n;
  if (!checked_numel(dims, &n))
    throw InvalidArgument(
        fmt::format("shape of {} dimensions has more elements than int64 can "
                    "count",
                    dims.size()));
  ndim_ = static_cast<int>(dims.size());
  std::copy(dims.begin(), dims.end(), dims_.begin());
}

bool Shape::checked_numel(std::span<const int64_t> dims, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : dims)
    if (d < 0 || !checked_mul(n, d, &n)) return false;
  *out = n;
  return true;
}

int64_t Shape::numel() const {
  int64_t n;
  if (!checked_numel(dims(), &n))
    throw InvalidArgument(
        fmt::format("shape {} has a negative dimension or more elements than "
                    "int64 can count",
                    to_string()));
  return n;
}

std::string Shape::to_string() const {
  std::string s = "(";
  for (int i = 0; i < ndim_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + ")";
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.ndim_ != b.ndim_) return false;
  for (int i = 0; i < a.ndim_; ++i)
    if (a.dims_[i] != b.dims_[i]) return false;
  return true;
}

size_t ArrayView::nbytes() const {
  size_t n;
  if (!checked_bytes(numel(), dtype_size(dtype), &n))
    throw InvalidArgument(fmt::format("{}{} has more bytes than size_t can count",
                                      dtype_name(dtype), shape.to_string()));
  return n;
}

std::string ArrayView::describe() const {
  return fmt::format("{}{} on {}", dtype_name(dtype), shape.to_string(), device.to_string());
}

void Array::FreeDeleter::operator()(void* p) const {
  std::free(p);
}

Array::Array(Shape shape, DType dtype, Device device)
    : dtype_(dtype), shape_(shape), device_(device) {
  if (!device.is_cpu())
    throw InvalidArgument(
        fmt::format("cannot allocate on {}: only CPU memory is supported yet", device.to_string()));
  size_t bytes = nbytes();
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw IoError(fmt::format("out of memory allocating {} bytes", rounded));
  std::memset(p, 0, rounded);
  data_.reset(p);
}

Array Array::copy_of(const ArrayView& src) {
  Array a(src.shape, src.dtype);
  if (src.nbytes()) std::memcpy(a.data(), src.data, src.nbytes());
  return a;
}

Array Array::full(Shape shape, double value, DType dtype, Device device) {
  Array a(shape, dtype, device);
  for (int64_t i = 0; i < a.numel(); ++i)
    set_element(a.view(), i, value);
  return a;
}

double get_element(const ArrayView& a, int64_t i) {
  switch (a.dtype) {
    case DType::kFloat32:
      return a.as<float>()[i];
    case DType::kFloat16:
      return half_to_float(a.as<uint16_t>()[i]);
    case DType::kBFloat16:
      return bfloat16_to_float(a.as<uint16_t>()[i]);
    case DType::kFloat64:
      return a.as<double>()[i];
    case DType::kInt32:
      return a.as<int32_t>()[i];
    case DType::kInt64:
      return static_cast<double>(a.as<int64_t>()[i]);
    case DType::kInt8:
      return a.as<int8_t>()[i];
    case DType::kUInt8:
      return a.as<uint8_t>()[i];
  }
  return 0;
}

void set_element(const ArrayView& a, int64_t i, double v) {
  switch (a.dtype) {
    case DType::kFloat32:
      a.as<float>()[i] = static_cast<float>(v);
      break;
    case DType::kFloat16:
      a.as<uint16_t>()[i] = float_to_half(static_cast<float>(v));
      break;
    case DType::kBFloat16:
      a.as<uint16_t>()[i] = float_to_bfloat16(static_cast<float>(v));
      break;
    case DType::kFloat64:
      a.as<double>()[i] = v;
      break;
    case DType::kInt32:
      a.as<int32_t>()[i] = static_cast<int32_t>(v);
      break;
    case DType::kInt64:
      a.as<int64_t>()[i] = static_cast<int64_t>(v);
      break;
    case DType::kInt8:
      a.as<int8_t>()[i] = static_cast<int8_t>(v);
      break;
    case DType::kUInt8:
      a.as<uint8_t>()[i] = static_cast<uint8_t>(v);
      break;
  }
}

}  // namespace pushpull
