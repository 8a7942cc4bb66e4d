// SPDX-License-Identifier: Apache-2.0
#include "pushpull/dtype.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PUSHPULL_X86 1
#endif

namespace pushpull {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
  }
  return "invalid";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto t = static_cast<DType>(i);
    if (dtype_name(t) == name) return t;
  }
  if (name == "float" || name == "fp32") return DType::kFloat32;
  if (name == "half" || name == "fp16") return DType::kFloat16;
  if (name == "bf16") return DType::kBFloat16;
  if (name == "double" || name == "fp64") return DType::kFloat64;
  return std::nullopt;
}

// Portable IEEE half conversion (round to nearest even), after the classic
// bit-manipulation approach: rebias the exponent, handle subnormals/inf/NaN.
float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (abs < 0x38800000u) {                                      // result is subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < half of min subnormal
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14 - (exp - 127) + 13 - 1 ... bring to 10-bit subnormal
    uint32_t half_mant = mant >> (shift);
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // round mantissa to 10 bits
  uint32_t h = ((rounded >> 13) - ((127 - 15) << 10));
  return static_cast<uint16_t>(sign | h);
}

bool cpu_has_f16c() {
#if defined(PUSHPULL_X86) && defined(__clang__) && __clang_major__ < 15
  return false;  // clang 14 (the fuzz build's) has no "f16c" for __builtin_cpu_supports
#elif defined(PUSHPULL_X86)
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
#else
  return false;
#endif
}

#ifdef PUSHPULL_X86
__attribute__((target("avx,f16c"))) static void half_to_float_f16c(const uint16_t* src, float* dst,
                                                                   size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i)
    dst[i] = half_to_float(src[i]);
}
__attribute__((target("avx,f16c"))) static void float_to_half_f16c(const float* src, uint16_t* dst,
                                                                   size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_loadu_ps(src + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i)
    dst[i] = float_to_half(src[i]);
}
#endif

void half_to_float(const uint16_t* src, float* dst, size_t n) {
#ifdef PUSHPULL_X86
  if (cpu_has_f16c()) return half_to_float_f16c(src, dst, n);
#endif
  for (size_t i = 0; i < n; ++i)
    dst[i] = half_to_float(src[i]);
}

void float_to_half(const float* src, uint16_t* dst, size_t n) {
#ifdef PUSHPULL_X86
  if (cpu_has_f16c()) return float_to_half_f16c(src, dst, n);
#endif
  for (size_t i = 0; i < n; ++i)
    dst[i] = float_to_half(src[i]);
}

// Branch-free loops (a select instead of the NaN branch) so the compiler
// vectorises them; compiled for AVX2 and AVX-512 too, picked at load time.
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define PP_BF16_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define PP_BF16_CLONES
#endif

PP_BF16_CLONES void bfloat16_to_float(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(&dst[i], &bits, 4);
  }
}

PP_BF16_CLONES void float_to_bfloat16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &src[i], 4);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  // nearest even
    uint32_t nan = (bits >> 16) | 0x40u;                              // stays NaN
    dst[i] = static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

}  // namespace pushpull
