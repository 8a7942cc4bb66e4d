// SPDX-License-Identifier: Apache-2.0
#include "compress/fp16.h"

#include <algorithm>
#include <cstring>

#include "pushpull/dtype.h"

namespace pushpull::compress {

namespace {
constexpr float kHalfMax = 65504.0f;
}

void Fp16Codec::compress(const float* grad, float* residual, std::byte* out, size_t n) const {
  for (size_t i = 0; i < n; ++i) {
    const float x = residual[i] + grad[i];
    // Beyond float16's range the excess stays in the residual (no infinity
    // is sent, and none poisons the residual). NaN passes through as NaN.
    const float clamped = std::clamp(x, -kHalfMax, kHalfMax);
    const uint16_t h = float_to_half(x != x ? x : clamped);
    residual[i] = x != x ? 0.0f : x - half_to_float(h);  // a NaN is sent once, not kept
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void Fp16Codec::decompress_add(const std::byte* in, float* acc, size_t n) const {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    acc[i] += half_to_float(h);
  }
}

}  // namespace pushpull::compress
