// SPDX-License-Identifier: Apache-2.0
// Element types and 16-bit float conversion.
//
// Thread safety: everything here is pure or reads immutable state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace pushpull {

// Stable numeric values: they travel in message headers and saved files.
enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kInt8 = 6,
  kUInt8 = 7,
};
inline constexpr int kNumDTypes = 8;

// Bytes per element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kInt8:
      return 1;
    case DType::kUInt8:
      return 1;
  }
  return 0;
}

// "float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8".
std::string_view dtype_name(DType t);
// Inverse of dtype_name (also accepts "fp16", "bf16", "half", "float", "double").
std::optional<DType> parse_dtype(std::string_view name);
// True for a raw value that names a DType (for decoding untrusted headers).
constexpr bool is_valid_dtype(uint8_t raw) {
  return raw < kNumDTypes;
}
constexpr bool is_floating(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16 ||
         t == DType::kFloat64;
}
constexpr bool is_half(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16;
}

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::kFloat64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct dtype_of<int8_t> {
  static constexpr DType value = DType::kInt8;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::kUInt8;
};

// ---- 16-bit floats -------------------------------------------------------
// IEEE binary16 and bfloat16 are stored as raw uint16_t bit patterns.
// Scalar conversions round to nearest even; NaN stays NaN, overflow becomes inf.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
inline float bfloat16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t float_to_bfloat16(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

// Bulk conversions. The float16 ones use the CPU's F16C instructions when it
// has them (checked once at run time) and a portable loop otherwise.
void half_to_float(const uint16_t* src, float* dst, size_t n);
void float_to_half(const float* src, uint16_t* dst, size_t n);
void bfloat16_to_float(const uint16_t* src, float* dst, size_t n);
void float_to_bfloat16(const float* src, uint16_t* dst, size_t n);
// True when the bulk float16 conversions use F16C on this machine.
bool cpu_has_f16c();

}  // namespace pushpull
