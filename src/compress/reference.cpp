// SPDX-License-Identifier: Apache-2.0
#include "compress/reference.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "compress/words.h"
#include "pushpull/dtype.h"

namespace pushpull::compress::reference {

void two_bit_encode(const float* grad, float* residual, std::byte* out, size_t n, float t) {
  for (size_t w = 0; w * 16 < n; ++w) {
    uint32_t word = 0;
    const size_t end = (w + 1) * 16 < n ? (w + 1) * 16 : n;
    for (size_t i = w * 16; i < end; ++i) {
      float r = residual[i] + grad[i];
      uint32_t code = 0;
      if (r >= t) {
        code = 1;
        r -= t;
      } else if (r <= -t) {
        code = 2;
        r += t;
      }
      residual[i] = r;
      word |= code << (2 * (i - w * 16));
    }
    store_word(out + 4 * w, word);
  }
}

void two_bit_decode_add(const std::byte* in, float* acc, size_t n, float t) {
  const float table[4] = {0.0f, t, -t, 0.0f};
  for (size_t w = 0; w * 16 < n; ++w) {
    const uint32_t word = load_word(in + 4 * w);
    const size_t end = (w + 1) * 16 < n ? (w + 1) * 16 : n;
    for (size_t i = w * 16; i < end; ++i)
      acc[i] += table[(word >> (2 * (i - w * 16))) & 3u];
  }
}

void one_bit_encode(const float* grad, float* residual, std::byte* out, size_t n, float t) {
  for (size_t w = 0; w * 32 < n; ++w) {
    uint32_t word = 0;
    const size_t end = (w + 1) * 32 < n ? (w + 1) * 32 : n;
    for (size_t i = w * 32; i < end; ++i) {
      float r = residual[i] + grad[i];
      if (r > t) {
        word |= 1u << (i - w * 32);
        r -= 1.0f;
      } else {
        r += 1.0f;  // this value is sent as -1
      }
      residual[i] = r;
    }
    store_word(out + 4 * w, word);
  }
}

void one_bit_decode_add(const std::byte* in, float* acc, size_t n) {
  for (size_t w = 0; w * 32 < n; ++w) {
    const uint32_t word = load_word(in + 4 * w);
    const size_t end = (w + 1) * 32 < n ? (w + 1) * 32 : n;
    for (size_t i = w * 32; i < end; ++i)
      acc[i] += ((word >> (i - w * 32)) & 1u) ? 1.0f : -1.0f;
  }
}

void fp16_encode(const float* grad, float* residual, std::byte* out, size_t n) {
  constexpr float kHalfMax = 65504.0f;
  for (size_t i = 0; i < n; ++i) {
    float v = residual[i] + grad[i];
    const float x = v != v ? v : std::clamp(v, -kHalfMax, kHalfMax);
    const uint16_t h = float_to_half(x);
    v = v != v ? 0.0f : v - half_to_float(h);  // a NaN is sent once, not kept
    residual[i] = v;
    std::memcpy(out + 2 * i, &h, 2);
  }
}

}  // namespace pushpull::compress::reference
