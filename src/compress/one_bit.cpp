// SPDX-License-Identifier: Apache-2.0
#include "compress/one_bit.h"

#include <cmath>

#include <fmt/format.h>

#include "compress/kernels.h"
#include "pushpull/error.h"

namespace pushpull::compress {

OneBitCodec::OneBitCodec(float threshold) : threshold_(threshold) {
  if (!std::isfinite(threshold))
    throw InvalidArgument(
        fmt::format("1bit compression threshold must be a finite number, got {}", threshold));
}

void OneBitCodec::compress(const float* grad, float* residual, std::byte* out, size_t n) const {
  kernels::one_bit_encode(grad, residual, out, n, threshold_);
}

void OneBitCodec::decompress_add(const std::byte* in, float* acc, size_t n) const {
  kernels::one_bit_decode_add(in, acc, n);
}

void OneBitCodec::decompress(const std::byte* in, float* out, size_t n) const {
  kernels::one_bit_decode(in, out, n);
}

void OneBitCodec::compress_keep(float* values, float* residual, std::byte* out, size_t n) const {
  kernels::one_bit_encode_keep(values, residual, out, n, threshold_);
}

}  // namespace pushpull::compress
