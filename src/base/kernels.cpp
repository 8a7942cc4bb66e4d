// SPDX-License-Identifier: Apache-2.0
#include "pushpull/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "pushpull/error.h"

// One binary, several instruction sets: GCC emits a clone per target and an
// ifunc resolver picks the best at load time.
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define PP_MULTIVERSION __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define PP_MULTIVERSION
#endif
#define PP_INLINE inline __attribute__((always_inline))

namespace pushpull {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "invalid";
}

std::optional<ReduceOp> parse_reduce_op(std::string_view n) {
  if (n == "sum") return ReduceOp::kSum;
  if (n == "prod" || n == "product") return ReduceOp::kProd;
  if (n == "min") return ReduceOp::kMin;
  if (n == "max") return ReduceOp::kMax;
  return std::nullopt;
}

namespace {

template <ReduceOp Op, typename T>
PP_INLINE T combine(T a, T b) {
  if constexpr (Op == ReduceOp::kSum) return static_cast<T>(a + b);
  if constexpr (Op == ReduceOp::kProd) return static_cast<T>(a * b);
  if constexpr (Op == ReduceOp::kMin) return b < a ? b : a;
  if constexpr (Op == ReduceOp::kMax) return a < b ? b : a;
}

template <ReduceOp Op, typename T>
PP_INLINE void loop3(T* __restrict dst, const T* a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = combine<Op>(a[i], b[i]);
}

// Non-template entry points (target_clones needs plain functions); each
// instantiates the inlined loop for its instruction set.
#define PP_KERNEL(OP, T, NAME)                                                                \
  PP_MULTIVERSION void NAME(T* __restrict dst, const T* a, const T* __restrict b, size_t n) { \
    loop3<ReduceOp::OP>(dst, a, b, n);                                                        \
  }
#define PP_KERNELS_FOR(T, SUFFIX)    \
  PP_KERNEL(kSum, T, sum_##SUFFIX)   \
  PP_KERNEL(kProd, T, prod_##SUFFIX) \
  PP_KERNEL(kMin, T, min_##SUFFIX)   \
  PP_KERNEL(kMax, T, max_##SUFFIX)
PP_KERNELS_FOR(float, f32)
PP_KERNELS_FOR(double, f64)
PP_KERNELS_FOR(int32_t, i32)
PP_KERNELS_FOR(int64_t, i64)
PP_KERNELS_FOR(int8_t, i8)
PP_KERNELS_FOR(uint8_t, u8)
#undef PP_KERNELS_FOR
#undef PP_KERNEL

template <typename T>
using Kernel = void (*)(T*, const T*, const T*, size_t);

template <typename T>
struct KernelTable;
#define PP_TABLE(T, SUFFIX)             \
  template <>                           \
  struct KernelTable<T> {               \
    static Kernel<T> get(ReduceOp op) { \
      switch (op) {                     \
        case ReduceOp::kSum:            \
          return sum_##SUFFIX;          \
        case ReduceOp::kProd:           \
          return prod_##SUFFIX;         \
        case ReduceOp::kMin:            \
          return min_##SUFFIX;          \
        case ReduceOp::kMax:            \
          return max_##SUFFIX;          \
      }                                 \
      return sum_##SUFFIX;              \
    }                                   \
  };
PP_TABLE(float, f32)
PP_TABLE(double, f64)
PP_TABLE(int32_t, i32)
PP_TABLE(int64_t, i64)
PP_TABLE(int8_t, i8)
PP_TABLE(uint8_t, u8)
#undef PP_TABLE

template <typename T>
void reduce_typed(ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  KernelTable<T>::get(op)(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b),
                          n);
}

// 16-bit floats: widen blocks to float32 on the stack, combine, narrow back.
void reduce_half(ReduceOp op, DType t, void* dst, const void* a, const void* b, size_t n) {
  constexpr size_t kBlock = 2048;
  alignas(64) float fa[kBlock];
  alignas(64) float fb[kBlock];
  auto widen = t == DType::kFloat16
                   ? static_cast<void (*)(const uint16_t*, float*, size_t)>(&half_to_float)
                   : static_cast<void (*)(const uint16_t*, float*, size_t)>(&bfloat16_to_float);
  auto narrow = t == DType::kFloat16
                    ? static_cast<void (*)(const float*, uint16_t*, size_t)>(&float_to_half)
                    : static_cast<void (*)(const float*, uint16_t*, size_t)>(&float_to_bfloat16);
  auto kernel = KernelTable<float>::get(op);
  auto* d = static_cast<uint16_t*>(dst);
  auto* pa = static_cast<const uint16_t*>(a);
  auto* pb = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; i += kBlock) {
    size_t m = std::min(kBlock, n - i);
    widen(pa + i, fa, m);
    widen(pb + i, fb, m);
    kernel(fa, fa, fb, m);
    narrow(fa, d + i, m);
  }
}

PP_MULTIVERSION void scale_f32(float* d, float alpha, size_t n) {
  for (size_t i = 0; i < n; ++i)
    d[i] *= alpha;
}
PP_MULTIVERSION void divide_f32(float* d, float divisor, size_t n) {
  for (size_t i = 0; i < n; ++i)
    d[i] /= divisor;
}
PP_MULTIVERSION void divide_f64(double* d, double divisor, size_t n) {
  for (size_t i = 0; i < n; ++i)
    d[i] /= divisor;
}
template <typename T>
void divide_int(T* d, double divisor, size_t n) {
  for (size_t i = 0; i < n; ++i)
    d[i] = static_cast<T>(static_cast<double>(d[i]) / divisor);
}

// k when alpha is 1/k for an integer k >= 2 (an average's factor), else 0.
// Dividing by k rounds correctly; multiplying by 1/k, itself rounded, is an
// ulp off for a third of the x of an average over 3 ranks (x * (1/3) vs
// x / 3), and 9 * (1/3) truncates to 2 where 9 / 3 is 3.
double average_divisor(double alpha) {
  if (!(alpha > 0.0) || alpha > 0.5) return 0.0;
  double k = std::round(1.0 / alpha);
  return k < 2.0 || k > 1e9 || 1.0 / k != alpha ? 0.0 : k;
}

PP_MULTIVERSION void scale_f64(double* d, double alpha, size_t n) {
  for (size_t i = 0; i < n; ++i)
    d[i] *= alpha;
}
template <typename T>
void scale_int(T* d, double alpha, size_t n) {
  for (size_t i = 0; i < n; ++i)
    d[i] = static_cast<T>(static_cast<double>(d[i]) * alpha);
}

// Runs an element-wise in-place operation on n elements of `dtype`: `f32`
// on float32, `f64` on float64, `on_int` (called with a pointer to each
// integer type) on integers; 16-bit floats widen to float32 in blocks on the
// stack, run `f32` and narrow back. One dispatch for scale and divide.
template <typename F32, typename F64, typename Int>
void in_place(DType dtype, void* dst, size_t n, F32 f32, F64 f64, Int on_int) {
  switch (dtype) {
    case DType::kFloat32:
      return f32(static_cast<float*>(dst), n);
    case DType::kFloat64:
      return f64(static_cast<double*>(dst), n);
    case DType::kInt32:
      return on_int(static_cast<int32_t*>(dst), n);
    case DType::kInt64:
      return on_int(static_cast<int64_t*>(dst), n);
    case DType::kInt8:
      return on_int(static_cast<int8_t*>(dst), n);
    case DType::kUInt8:
      return on_int(static_cast<uint8_t*>(dst), n);
    case DType::kFloat16:
    case DType::kBFloat16: {
      constexpr size_t kBlock = 2048;
      alignas(64) float f[kBlock];
      auto* d = static_cast<uint16_t*>(dst);
      const bool fp16 = dtype == DType::kFloat16;
      for (size_t i = 0; i < n; i += kBlock) {
        const size_t m = std::min(kBlock, n - i);
        fp16 ? half_to_float(d + i, f, m) : bfloat16_to_float(d + i, f, m);
        f32(f, m);
        fp16 ? float_to_half(f, d + i, m) : float_to_bfloat16(f, d + i, m);
      }
      return;
    }
  }
}

void divide(DType dtype, void* dst, double k, size_t n) {
  in_place(
      dtype, dst, n, [&](float* d, size_t m) { divide_f32(d, static_cast<float>(k), m); },
      [&](double* d, size_t m) { divide_f64(d, k, m); },
      [&](auto* d, size_t m) { divide_int(d, k, m); });
}

template <typename T>
double read_as_double(const void* p, size_t i) {
  return static_cast<double>(static_cast<const T*>(p)[i]);
}

}  // namespace

void reduce3(ReduceOp op, DType dtype, void* dst, const void* a, const void* b, size_t n) {
  if (n == 0) return;
  switch (dtype) {
    case DType::kFloat32:
      return reduce_typed<float>(op, dst, a, b, n);
    case DType::kFloat64:
      return reduce_typed<double>(op, dst, a, b, n);
    case DType::kInt32:
      return reduce_typed<int32_t>(op, dst, a, b, n);
    case DType::kInt64:
      return reduce_typed<int64_t>(op, dst, a, b, n);
    case DType::kInt8:
      return reduce_typed<int8_t>(op, dst, a, b, n);
    case DType::kUInt8:
      return reduce_typed<uint8_t>(op, dst, a, b, n);
    case DType::kFloat16:
    case DType::kBFloat16:
      return reduce_half(op, dtype, dst, a, b, n);
  }
}

void reduce(ReduceOp op, DType dtype, void* dst, const void* src, size_t n) {
  reduce3(op, dtype, dst, dst, src, n);
}

void scale(DType dtype, void* dst, double alpha, size_t n) {
  if (n == 0 || alpha == 1.0) return;
  if (double k = average_divisor(alpha); k != 0.0) return divide(dtype, dst, k, n);
  in_place(
      dtype, dst, n, [&](float* d, size_t m) { scale_f32(d, static_cast<float>(alpha), m); },
      [&](double* d, size_t m) { scale_f64(d, alpha, m); },
      [&](auto* d, size_t m) { scale_int(d, alpha, m); });
}

void copy(DType dtype, void* dst, const void* src, size_t n) {
  if (n && dst != src) std::memcpy(dst, src, n * dtype_size(dtype));
}

void convert(DType dt, void* dst, DType st, const void* src, size_t n) {
  if (dt == st) return copy(dt, dst, src, n);
  if (st == DType::kFloat32 && dt == DType::kFloat16)
    return float_to_half(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
  if (st == DType::kFloat16 && dt == DType::kFloat32)
    return half_to_float(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
  if (st == DType::kFloat32 && dt == DType::kBFloat16)
    return float_to_bfloat16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
  if (st == DType::kBFloat16 && dt == DType::kFloat32)
    return bfloat16_to_float(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
  // Cold path: any other pair goes through double.
  for (size_t i = 0; i < n; ++i) {
    double v = 0;
    switch (st) {
      case DType::kFloat32:
        v = read_as_double<float>(src, i);
        break;
      case DType::kFloat64:
        v = read_as_double<double>(src, i);
        break;
      case DType::kInt32:
        v = read_as_double<int32_t>(src, i);
        break;
      case DType::kInt64:
        v = read_as_double<int64_t>(src, i);
        break;
      case DType::kInt8:
        v = read_as_double<int8_t>(src, i);
        break;
      case DType::kUInt8:
        v = read_as_double<uint8_t>(src, i);
        break;
      case DType::kFloat16:
        v = half_to_float(static_cast<const uint16_t*>(src)[i]);
        break;
      case DType::kBFloat16:
        v = bfloat16_to_float(static_cast<const uint16_t*>(src)[i]);
        break;
    }
    switch (dt) {
      case DType::kFloat32:
        static_cast<float*>(dst)[i] = static_cast<float>(v);
        break;
      case DType::kFloat64:
        static_cast<double*>(dst)[i] = v;
        break;
      case DType::kInt32:
        static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(v);
        break;
      case DType::kInt64:
        static_cast<int64_t*>(dst)[i] = static_cast<int64_t>(v);
        break;
      case DType::kInt8:
        static_cast<int8_t*>(dst)[i] = static_cast<int8_t>(v);
        break;
      case DType::kUInt8:
        static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(v);
        break;
      case DType::kFloat16:
        static_cast<uint16_t*>(dst)[i] = float_to_half(static_cast<float>(v));
        break;
      case DType::kBFloat16:
        static_cast<uint16_t*>(dst)[i] = float_to_bfloat16(static_cast<float>(v));
        break;
    }
  }
}

namespace {
template <typename T>
void fill_value(void* dst, T v, size_t n) {
  std::fill_n(static_cast<T*>(dst), n, v);
}
template <typename T>
T identity_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return T(0);
    case ReduceOp::kProd:
      return T(1);
    case ReduceOp::kMin:
      return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                  : std::numeric_limits<T>::max();
    case ReduceOp::kMax:
      return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                  : std::numeric_limits<T>::lowest();
  }
  return T(0);
}
}  // namespace

void fill_identity(ReduceOp op, DType dtype, void* dst, size_t n) {
  switch (dtype) {
    case DType::kFloat32:
      return fill_value(dst, identity_of<float>(op), n);
    case DType::kFloat64:
      return fill_value(dst, identity_of<double>(op), n);
    case DType::kInt32:
      return fill_value(dst, identity_of<int32_t>(op), n);
    case DType::kInt64:
      return fill_value(dst, identity_of<int64_t>(op), n);
    case DType::kInt8:
      return fill_value(dst, identity_of<int8_t>(op), n);
    case DType::kUInt8:
      return fill_value(dst, identity_of<uint8_t>(op), n);
    case DType::kFloat16:
      return fill_value(dst, float_to_half(identity_of<float>(op)), n);
    case DType::kBFloat16:
      return fill_value(dst, float_to_bfloat16(identity_of<float>(op)), n);
  }
}

}  // namespace pushpull
