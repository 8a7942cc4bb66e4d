// SPDX-License-Identifier: Apache-2.0
#include "compress/fp16.h"

#include <algorithm>
#include <cstring>

#include "pushpull/dtype.h"

namespace pushpull::compress {

namespace {
constexpr float kHalfMax = 65504.0f;
constexpr size_t kBlock = 1024;  // on the stack; the bulk converters vectorise
}  // namespace

void Fp16Codec::compress(const float* grad, float* residual, std::byte* out, size_t n) const {
  alignas(64) float x[kBlock], back[kBlock];
  alignas(64) uint16_t h[kBlock];
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t k = std::min(kBlock, n - at);
    for (size_t i = 0; i < k; ++i) {
      const float v = residual[at + i] + grad[at + i];
      // Beyond float16's range the excess stays in the residual (no infinity
      // is sent or kept); NaN passes through as NaN.
      x[i] = v != v ? v : std::clamp(v, -kHalfMax, kHalfMax);
      residual[at + i] = v;
    }
    float_to_half(x, h, k);
    half_to_float(h, back, k);
    for (size_t i = 0; i < k; ++i) {
      const float v = residual[at + i];
      residual[at + i] = v != v ? 0.0f : v - back[i];  // a NaN is sent once, not kept
    }
    std::memcpy(out + 2 * at, h, 2 * k);
  }
}

void Fp16Codec::decompress_add(const std::byte* in, float* acc, size_t n) const {
  alignas(64) uint16_t h[kBlock];
  alignas(64) float v[kBlock];
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t k = std::min(kBlock, n - at);
    std::memcpy(h, in + 2 * at, 2 * k);
    half_to_float(h, v, k);
    for (size_t i = 0; i < k; ++i)
      acc[at + i] += v[i];
  }
}

}  // namespace pushpull::compress
