// SPDX-License-Identifier: Apache-2.0
#include "compress/two_bit.h"

#include <fmt/format.h>

#include "compress/words.h"
#include "pushpull/error.h"

namespace pushpull::compress {

TwoBitCodec::TwoBitCodec(float threshold) : threshold_(threshold) {
  if (!(threshold > 0) || threshold > 3.0e38f)
    throw InvalidArgument(
        fmt::format("2bit compression threshold must be positive, got {} (e.g. {{type: \"2bit\", "
                    "threshold: \"0.5\"}})",
                    threshold));
}

void TwoBitCodec::compress(const float* grad, float* residual, std::byte* out, size_t n) const {
  const float t = threshold_;
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

void TwoBitCodec::decompress_add(const std::byte* in, float* acc, size_t n) const {
  const float table[4] = {0.0f, threshold_, -threshold_, 0.0f};
  for (size_t w = 0; w * 16 < n; ++w) {
    const uint32_t word = load_word(in + 4 * w);
    const size_t end = (w + 1) * 16 < n ? (w + 1) * 16 : n;
    for (size_t i = w * 16; i < end; ++i)
      acc[i] += table[(word >> (2 * (i - w * 16))) & 3u];
  }
}

}  // namespace pushpull::compress
