// SPDX-License-Identifier: Apache-2.0
#include "compress/fp16.h"

#include <algorithm>
#include <cstring>

#include "compress/kernels.h"
#include "pushpull/dtype.h"

namespace pushpull::compress {

namespace {
constexpr size_t kBlock = 1024;  // on the stack; the bulk converters vectorise
}  // namespace

void Fp16Codec::compress(const float* grad, float* residual, std::byte* out, size_t n) const {
  kernels::fp16_encode(grad, residual, out, n);
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

void Fp16Codec::decompress(const std::byte* in, float* out, size_t n) const {
  alignas(64) uint16_t h[kBlock];
  alignas(64) float v[kBlock];
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t k = std::min(kBlock, n - at);
    std::memcpy(h, in + 2 * at, 2 * k);
    half_to_float(h, v, k);
    for (size_t i = 0; i < k; ++i)
      out[at + i] = 0.0f + v[i];  // as decompress_add into zeros: -0 reads as +0
  }
}

void Fp16Codec::compress_keep(float* values, float* residual, std::byte* out, size_t n) const {
  kernels::fp16_encode_keep(values, residual, out, n);
}

}  // namespace pushpull::compress
