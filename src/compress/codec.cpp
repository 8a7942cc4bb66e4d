// SPDX-License-Identifier: Apache-2.0
#include "compress/codec.h"

#include <algorithm>

#include "compress/fp16.h"
#include "compress/one_bit.h"
#include "compress/two_bit.h"

namespace pushpull::compress {

void Codec::decompress(const std::byte* in, float* out, size_t n) const {
  std::fill(out, out + n, 0.0f);
  decompress_add(in, out, n);
}

void Codec::compress_keep(float* values, float* residual, std::byte* out, size_t n) const {
  compress(values, residual, out, n);
  decompress(out, values, n);
}

std::unique_ptr<Codec> make_codec(const Settings& s) {
  switch (s.type) {
    case Type::kNone:
      return nullptr;
    case Type::k2Bit:
      return std::make_unique<TwoBitCodec>(s.threshold);
    case Type::k1Bit:
      return std::make_unique<OneBitCodec>(s.threshold);
    case Type::kFp16:
      return std::make_unique<Fp16Codec>();
  }
  return nullptr;
}

}  // namespace pushpull::compress
