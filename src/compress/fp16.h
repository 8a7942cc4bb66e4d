// SPDX-License-Identifier: Apache-2.0
// float16 gradient compression with error feedback ("fp16").
//
// To compress a gradient g with residual r:
//   x = r + g, clamped to float16's range (±65504);  h = float16(x)
//   emit h;  r = (r + g) - float(h)
// so the rounding error (and anything beyond float16's range) is carried to
// the next push. Values are little-endian IEEE half floats, 2 bytes each:
// 2x smaller than float32. Receivers add float(h) in float32.
//
// Thread safety: immutable.
#pragma once

#include "compress/codec.h"

namespace pushpull::compress {

class Fp16Codec final : public Codec {
 public:
  Type type() const override { return Type::kFp16; }
  static size_t bytes_for(size_t n) { return n * 2; }
  size_t compressed_bytes(size_t n) const override { return bytes_for(n); }
  void compress(const float* grad, float* residual, std::byte* out, size_t n) const override;
  void decompress_add(const std::byte* in, float* acc, size_t n) const override;
  void decompress(const std::byte* in, float* out, size_t n) const override;
  void compress_keep(float* values, float* residual, std::byte* out, size_t n) const override;
};

}  // namespace pushpull::compress
