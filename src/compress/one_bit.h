// SPDX-License-Identifier: Apache-2.0
// 1-bit gradient compression with error feedback (MXNet 1.x's "1bit" type).
//
// To compress a gradient g with residual r and threshold t:
//   r += g;  if r > t: emit +1, r -= 1;  else emit -1, r += 1
// (the values are always ±1; t only moves the split). One bit per value
// (1 = +1, 0 = -1), 32 values per little-endian 32-bit word, value i in bit
// i%32 of word i/32; the last word's unused bits are 0. 32x smaller than
// float32.
//
// Encoding and decoding run the branch-free kernels of compress/kernels.h.
//
// Thread safety: immutable.
#pragma once

#include "compress/codec.h"

namespace pushpull::compress {

class OneBitCodec final : public Codec {
 public:
  // Any finite threshold (InvalidArgument otherwise).
  explicit OneBitCodec(float threshold);
  float threshold() const { return threshold_; }

  Type type() const override { return Type::k1Bit; }
  static size_t bytes_for(size_t n) { return (n + 31) / 32 * 4; }
  size_t compressed_bytes(size_t n) const override { return bytes_for(n); }
  void compress(const float* grad, float* residual, std::byte* out, size_t n) const override;
  void decompress_add(const std::byte* in, float* acc, size_t n) const override;
  void decompress(const std::byte* in, float* out, size_t n) const override;
  void compress_keep(float* values, float* residual, std::byte* out, size_t n) const override;

 private:
  float threshold_;
};

}  // namespace pushpull::compress
