// SPDX-License-Identifier: Apache-2.0
// 2-bit gradient compression with error feedback (MXNet's "2bit" type).
//
// To compress a gradient g with residual r and threshold t:
//   r += g;  if r >= t: emit +t, r -= t;  elif r <= -t: emit -t, r += t;  else emit 0
// Each value takes 2 bits (00 = 0, 01 = +t, 10 = -t), 16 values per
// little-endian 32-bit word, value i in bits 2*(i%16)..2*(i%16)+1 of word
// i/16; the last word's unused bits are 0. 16x smaller than float32.
//
// Encoding and decoding run the branch-free kernels of compress/kernels.h.
//
// Thread safety: immutable.
#pragma once

#include "compress/codec.h"

namespace pushpull::compress {

class TwoBitCodec final : public Codec {
 public:
  // threshold must be > 0 (InvalidArgument otherwise).
  explicit TwoBitCodec(float threshold);
  float threshold() const { return threshold_; }

  Type type() const override { return Type::k2Bit; }
  static size_t bytes_for(size_t n) { return (n + 15) / 16 * 4; }
  size_t compressed_bytes(size_t n) const override { return bytes_for(n); }
  void compress(const float* grad, float* residual, std::byte* out, size_t n) const override;
  void decompress_add(const std::byte* in, float* acc, size_t n) const override;
  void decompress(const std::byte* in, float* out, size_t n) const override;
  void compress_keep(float* values, float* residual, std::byte* out, size_t n) const override;

 private:
  float threshold_;
};

}  // namespace pushpull::compress
