// Arrays: a non-owning view (ArrayView) and an owning array (Array).
//
// ArrayView is a plain value (pointer, dtype, shape, device): copying it never
// copies data, and it does not keep the memory alive. The caller guarantees
// the memory outlives every use of the view (for asynchronous calls: until the
// call's handle completes).
//
// Array owns a 64-byte-aligned host buffer. Move-only.
//
// Thread safety: none beyond that of the underlying memory.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "pushpull/device.h"
#include "pushpull/dtype.h"

namespace pushpull {

// A shape of at most kMaxDims dimensions, stored inline (no allocation).
// The constructors throw InvalidArgument for too many dimensions, a negative
// dimension, or dimensions whose product overflows int64.
class Shape {
 public:
  static constexpr int kMaxDims = 8;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(ndim_)}; }
  // Product of the dimensions (1 for a scalar of rank 0). Throws
  // InvalidArgument when a dimension is negative or the product overflows
  // int64 (only reachable by writing dims through operator[]: the
  // constructors already reject such shapes).
  int64_t numel() const;
  // The same without throwing: false on a negative dimension or overflow.
  [[nodiscard]] static bool checked_numel(std::span<const int64_t> dims, int64_t* out);
  // "(2, 3)".
  std::string to_string() const;
  friend bool operator==(const Shape& a, const Shape& b);

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

struct ArrayView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Shape shape;
  Device device;

  ArrayView() = default;
  ArrayView(void* d, DType t, Shape s, Device dev = Device::cpu())
      : data(d), dtype(t), shape(s), device(dev) {}
  template <typename T>
  ArrayView(T* d, Shape s, Device dev = Device::cpu())
      : data(d), dtype(dtype_of<T>::value), shape(s), device(dev) {}

  int64_t numel() const { return shape.numel(); }
  // numel() * dtype_size(dtype); throws InvalidArgument on overflow.
  size_t nbytes() const;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // "float32(2, 3) on cpu(0)".
  std::string describe() const;
};

class Array {
 public:
  Array() = default;
  // Zero-filled array.
  Array(Shape shape, DType dtype, Device device = Device::cpu());
  static Array zeros(Shape shape, DType dtype, Device device = Device::cpu()) {
    return Array(shape, dtype, device);
  }
  // A copy of `src`'s contents.
  static Array copy_of(const ArrayView& src);
  // A float32 array filled with `value`, converted to `dtype`.
  static Array full(Shape shape, double value, DType dtype = DType::kFloat32,
                    Device device = Device::cpu());

  Array(Array&&) noexcept = default;
  Array& operator=(Array&&) noexcept = default;
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;

  ArrayView view() const { return ArrayView(data_.get(), dtype_, shape_, device_); }
  operator ArrayView() const { return view(); }
  void* data() const { return data_.get(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data());
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  Device device() const { return device_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return view().nbytes(); }
  bool empty() const { return data_ == nullptr; }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeDeleter> data_;
  DType dtype_ = DType::kFloat32;
  Shape shape_;
  Device device_;
};

// Reads element i of any dtype as double / writes it (converting). For tests,
// examples and cold paths only: the hot paths use the kernels.
double get_element(const ArrayView& a, int64_t i);
void set_element(const ArrayView& a, int64_t i, double value);

}  // namespace pushpull
