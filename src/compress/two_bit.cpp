// SPDX-License-Identifier: Apache-2.0
#include "compress/two_bit.h"

#include <fmt/format.h>

#include "compress/kernels.h"
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
  kernels::two_bit_encode(grad, residual, out, n, threshold_);
}

void TwoBitCodec::decompress_add(const std::byte* in, float* acc, size_t n) const {
  kernels::two_bit_decode_add(in, acc, n, threshold_);
}

void TwoBitCodec::decompress(const std::byte* in, float* out, size_t n) const {
  kernels::two_bit_decode(in, out, n, threshold_);
}

void TwoBitCodec::compress_keep(float* values, float* residual, std::byte* out, size_t n) const {
  kernels::two_bit_encode_keep(values, residual, out, n, threshold_);
}

}  // namespace pushpull::compress
