// SPDX-License-Identifier: Apache-2.0
#include "compress/one_bit.h"

#include <cmath>

#include <fmt/format.h>

#include "compress/words.h"
#include "pushpull/error.h"

namespace pushpull::compress {

OneBitCodec::OneBitCodec(float threshold) : threshold_(threshold) {
  if (!std::isfinite(threshold))
    throw InvalidArgument(
        fmt::format("1bit compression threshold must be a finite number, got {}", threshold));
}

void OneBitCodec::compress(const float* grad, float* residual, std::byte* out, size_t n) const {
  const float t = threshold_;
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

void OneBitCodec::decompress_add(const std::byte* in, float* acc, size_t n) const {
  for (size_t w = 0; w * 32 < n; ++w) {
    const uint32_t word = load_word(in + 4 * w);
    const size_t end = (w + 1) * 32 < n ? (w + 1) * 32 : n;
    for (size_t i = w * 32; i < end; ++i)
      acc[i] += ((word >> (i - w * 32)) & 1u) ? 1.0f : -1.0f;
  }
}

}  // namespace pushpull::compress
