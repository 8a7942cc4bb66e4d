// SPDX-License-Identifier: Apache-2.0
#include "compress/two_bit.h"

#include <cstring>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::compress {

TwoBitCodec::TwoBitCodec(float threshold) : threshold_(threshold) {
  if (!(threshold > 0))
    throw InvalidArgument(
        fmt::format("2bit compression threshold must be positive, got {} (e.g. {{type: \"2bit\", "
                    "threshold: 0.5}})",
                    threshold));
}

void TwoBitCodec::compress(const float* grad, float* residual, uint32_t* out, size_t n) const {
  const float t = threshold_;
  for (size_t w = 0; w * 16 < n; ++w) {
    uint32_t word = 0;
    size_t end = (w + 1) * 16 < n ? (w + 1) * 16 : n;
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
    out[w] = word;
  }
}

namespace {
template <bool kAdd>
void decode(const uint32_t* in, float* out, size_t n, float t) {
  const float table[4] = {0.0f, t, -t, 0.0f};
  for (size_t i = 0; i < n; ++i) {
    float v = table[(in[i / 16] >> (2 * (i % 16))) & 3u];
    if constexpr (kAdd) {
      out[i] += v;
    } else {
      out[i] = v;
    }
  }
}
}  // namespace

void TwoBitCodec::decompress(const uint32_t* in, float* out, size_t n) const {
  decode<false>(in, out, n, threshold_);
}

void TwoBitCodec::decompress_add(const uint32_t* in, float* acc, size_t n) const {
  decode<true>(in, acc, n, threshold_);
}

}  // namespace pushpull::compress
