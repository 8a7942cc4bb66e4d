// SPDX-License-Identifier: Apache-2.0
#include "compress/kernels.h"

#include <cstdint>
#include <cstring>

#include "compress/words.h"
#include "pushpull/dtype.h"

// One binary, several instruction sets (as in base/kernels.cpp): GCC emits a
// clone per target and an ifunc resolver picks the best at load time.
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define PP_MULTIVERSION __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define PP_MULTIVERSION
#endif
#define PP_INLINE inline __attribute__((always_inline))

namespace pushpull::compress::kernels {

namespace {

// Values per block: whole words of both codecs, small enough for the stack.
constexpr size_t kBlock = 256;

// Packs the `Bits`-bit codes of `k` values (one per uint32_t, room for k
// rounded up to a whole word) 32 / Bits to a little-endian word, value j of a
// word at bits [Bits j, Bits (j + 1)); the tail of the last word is zero.
template <unsigned Bits>
PP_INLINE void pack_codes(uint32_t* code, size_t k, std::byte* out) {
  constexpr size_t kPerWord = 32 / Bits;
  for (size_t i = k; i < (k + kPerWord - 1) / kPerWord * kPerWord; ++i)
    code[i] = 0;
  for (size_t w = 0; w * kPerWord < k; ++w) {
    uint32_t word = 0;
    for (uint32_t j = 0; j < kPerWord; ++j)
      word |= code[w * kPerWord + j] << (Bits * j);
    store_word(out + 4 * w, word);
  }
}

// 2bit, one block of `k` <= kBlock values (k a multiple of 16 except at the
// end): codes computed lane by lane without branches (the selects become
// blends/masks), then packed 16 to a word by shifts and ORs.
PP_INLINE void two_bit_encode_block(const float* __restrict g, float* __restrict r, std::byte* out,
                                    size_t k, float t) {
  alignas(64) uint32_t code[kBlock];
  for (size_t i = 0; i < k; ++i) {
    const float x = r[i] + g[i];
    const bool pos = x >= t, neg = x <= -t;
    const float q = pos ? t : (neg ? -t : 0.0f);
    r[i] = x - q;  // x - t, x - (-t) == x + t, or x - 0 == x: the scalar's results
    code[i] = static_cast<uint32_t>(pos) | (static_cast<uint32_t>(neg) << 1);
  }
  pack_codes<2>(code, k, out);
}

// As two_bit_encode_block, encoding v and leaving in v what the encoding
// decodes to (0 + q, as decode writes it): a server's value for its pulls.
PP_INLINE void two_bit_encode_keep_block(float* __restrict v, float* __restrict r, std::byte* out,
                                         size_t k, float t) {
  alignas(64) uint32_t code[kBlock];
  for (size_t i = 0; i < k; ++i) {
    const float x = r[i] + v[i];
    const bool pos = x >= t, neg = x <= -t;
    const float q = pos ? t : (neg ? -t : 0.0f);
    r[i] = x - q;
    v[i] = 0.0f + q;
    code[i] = static_cast<uint32_t>(pos) | (static_cast<uint32_t>(neg) << 1);
  }
  pack_codes<2>(code, k, out);
}

template <bool Add>
PP_INLINE void two_bit_decode_block(const std::byte* in, float* __restrict acc, size_t k, float t) {
  const size_t whole = k / 16;
  for (size_t w = 0; w < whole; ++w) {
    const uint32_t word = load_word(in + 4 * w);
    float* a = acc + 16 * w;
    for (uint32_t j = 0; j < 16; ++j) {  // one vector of 16 lanes: shifts by 0, 2, .., 30
      const auto c = static_cast<int32_t>((word >> (2 * j)) & 3u);
      // (c & 1) - (c >> 1) is 0, 1, -1, 0 for codes 0-3 (3 is never sent);
      // times t that is exactly +0, t, -t, +0: the scalar table's values.
      const float v = static_cast<float>((c & 1) - (c >> 1)) * t;
      a[j] = (Add ? a[j] : 0.0f) + v;
    }
  }
  if (whole * 16 < k) {  // the last, partial word
    const uint32_t word = load_word(in + 4 * whole);
    for (size_t i = whole * 16; i < k; ++i) {
      const auto c = static_cast<int32_t>((word >> (2 * (i - whole * 16))) & 3u);
      const float v = static_cast<float>((c & 1) - (c >> 1)) * t;
      acc[i] = (Add ? acc[i] : 0.0f) + v;
    }
  }
}

PP_INLINE void one_bit_encode_block(const float* __restrict g, float* __restrict r, std::byte* out,
                                    size_t k, float t) {
  alignas(64) uint32_t bit[kBlock];
  for (size_t i = 0; i < k; ++i) {
    const float x = r[i] + g[i];
    const bool pos = x > t;
    r[i] = x - (pos ? 1.0f : -1.0f);  // x - 1 or x - (-1) == x + 1
    bit[i] = static_cast<uint32_t>(pos);
  }
  pack_codes<1>(bit, k, out);
}

PP_INLINE void one_bit_encode_keep_block(float* __restrict v, float* __restrict r, std::byte* out,
                                         size_t k, float t) {
  alignas(64) uint32_t bit[kBlock];
  for (size_t i = 0; i < k; ++i) {
    const float x = r[i] + v[i];
    const bool pos = x > t;
    const float q = pos ? 1.0f : -1.0f;
    r[i] = x - q;
    v[i] = q;  // 0 + ±1 is ±1
    bit[i] = static_cast<uint32_t>(pos);
  }
  pack_codes<1>(bit, k, out);
}

template <bool Add>
PP_INLINE void one_bit_decode_block(const std::byte* in, float* __restrict acc, size_t k) {
  const size_t whole = k / 32;
  for (size_t w = 0; w < whole; ++w) {
    const uint32_t word = load_word(in + 4 * w);
    float* a = acc + 32 * w;
    for (uint32_t j = 0; j < 32; ++j) {
      const auto bit = static_cast<int32_t>((word >> j) & 1u);
      a[j] = (Add ? a[j] : 0.0f) + static_cast<float>(2 * bit - 1);  // exactly +1 or -1
    }
  }
  if (whole * 32 < k) {
    const uint32_t word = load_word(in + 4 * whole);
    for (size_t i = whole * 32; i < k; ++i) {
      const bool one = (word >> (i - whole * 32)) & 1u;
      acc[i] = (Add ? acc[i] : 0.0f) + (one ? 1.0f : -1.0f);
    }
  }
}

// fp16, before the conversion: x = r + g clamped to float16's range (a NaN
// passes: both comparisons are false for it), r = r + g.
PP_MULTIVERSION void fp16_prepare_block(const float* __restrict g, float* __restrict r,
                                        float* __restrict x, size_t k) {
  constexpr float kHalfMax = 65504.0f;
  for (size_t i = 0; i < k; ++i) {
    const float v = r[i] + g[i];
    const float lo = v < -kHalfMax ? -kHalfMax : v;
    x[i] = lo > kHalfMax ? kHalfMax : lo;
    r[i] = v;
  }
}

// After it: r -= what float16 carried; a NaN is sent once, not kept.
PP_MULTIVERSION void fp16_finish_block(float* __restrict r, const float* __restrict back,
                                       size_t k) {
  for (size_t i = 0; i < k; ++i) {
    const float v = r[i];
    r[i] = v != v ? 0.0f : v - back[i];
  }
}

// fp16_finish_block, and v = 0 + what float16 carried (as decode writes it).
PP_MULTIVERSION void fp16_finish_keep_block(float* __restrict r, const float* __restrict back,
                                            float* __restrict v, size_t k) {
  for (size_t i = 0; i < k; ++i) {
    const float x = r[i];
    r[i] = x != x ? 0.0f : x - back[i];
    v[i] = 0.0f + back[i];
  }
}

}  // namespace

PP_MULTIVERSION void two_bit_encode(const float* grad, float* residual, std::byte* out, size_t n,
                                    float threshold) {
  for (size_t at = 0; at < n; at += kBlock)
    two_bit_encode_block(grad + at, residual + at, out + at / 4, n - at < kBlock ? n - at : kBlock,
                         threshold);
}

PP_MULTIVERSION void two_bit_decode_add(const std::byte* in, float* acc, size_t n,
                                        float threshold) {
  for (size_t at = 0; at < n; at += kBlock)
    two_bit_decode_block<true>(in + at / 4, acc + at, n - at < kBlock ? n - at : kBlock, threshold);
}

PP_MULTIVERSION void two_bit_decode(const std::byte* in, float* out, size_t n, float threshold) {
  for (size_t at = 0; at < n; at += kBlock)
    two_bit_decode_block<false>(in + at / 4, out + at, n - at < kBlock ? n - at : kBlock,
                                threshold);
}

PP_MULTIVERSION void one_bit_encode(const float* grad, float* residual, std::byte* out, size_t n,
                                    float threshold) {
  for (size_t at = 0; at < n; at += kBlock)
    one_bit_encode_block(grad + at, residual + at, out + at / 8, n - at < kBlock ? n - at : kBlock,
                         threshold);
}

PP_MULTIVERSION void one_bit_decode_add(const std::byte* in, float* acc, size_t n) {
  for (size_t at = 0; at < n; at += kBlock)
    one_bit_decode_block<true>(in + at / 8, acc + at, n - at < kBlock ? n - at : kBlock);
}

PP_MULTIVERSION void one_bit_decode(const std::byte* in, float* out, size_t n) {
  for (size_t at = 0; at < n; at += kBlock)
    one_bit_decode_block<false>(in + at / 8, out + at, n - at < kBlock ? n - at : kBlock);
}

void fp16_encode(const float* grad, float* residual, std::byte* out, size_t n) {
  constexpr size_t kHalfBlock = 1024;  // three arrays of it stay in L1
  alignas(64) float x[kHalfBlock], back[kHalfBlock];
  alignas(64) uint16_t h[kHalfBlock];
  for (size_t at = 0; at < n; at += kHalfBlock) {
    const size_t k = n - at < kHalfBlock ? n - at : kHalfBlock;
    fp16_prepare_block(grad + at, residual + at, x, k);
    float_to_half(x, h, k);  // F16C when the CPU has it
    half_to_float(h, back, k);
    fp16_finish_block(residual + at, back, k);
    std::memcpy(out + 2 * at, h, 2 * k);
  }
}

PP_MULTIVERSION void two_bit_encode_keep(float* values, float* residual, std::byte* out, size_t n,
                                         float threshold) {
  for (size_t at = 0; at < n; at += kBlock)
    two_bit_encode_keep_block(values + at, residual + at, out + at / 4,
                              n - at < kBlock ? n - at : kBlock, threshold);
}

PP_MULTIVERSION void one_bit_encode_keep(float* values, float* residual, std::byte* out, size_t n,
                                         float threshold) {
  for (size_t at = 0; at < n; at += kBlock)
    one_bit_encode_keep_block(values + at, residual + at, out + at / 8,
                              n - at < kBlock ? n - at : kBlock, threshold);
}

void fp16_encode_keep(float* values, float* residual, std::byte* out, size_t n) {
  constexpr size_t kHalfBlock = 1024;
  alignas(64) float x[kHalfBlock], back[kHalfBlock];
  alignas(64) uint16_t h[kHalfBlock];
  for (size_t at = 0; at < n; at += kHalfBlock) {
    const size_t k = n - at < kHalfBlock ? n - at : kHalfBlock;
    fp16_prepare_block(values + at, residual + at, x, k);
    float_to_half(x, h, k);
    half_to_float(h, back, k);
    fp16_finish_keep_block(residual + at, back, values + at, k);
    std::memcpy(out + 2 * at, h, 2 * k);
  }
}

}  // namespace pushpull::compress::kernels
