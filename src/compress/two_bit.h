// SPDX-License-Identifier: Apache-2.0
// 2-bit gradient compression with error feedback (MXNet's "2bit" type).
//
// Each worker keeps a float32 residual per key. To compress a gradient g:
//   r += g;  if r >= t: emit +t, r -= t;  elif r <= -t: emit -t, r += t;  else emit 0
// so what is not sent is carried to the next push instead of lost. Each value
// takes 2 bits (00 = 0, 01 = +t, 10 = -t), 16 values per little-endian
// 32-bit word, value i in bits 2*(i%16)..2*(i%16)+1 of word i/16.
//
// Thread safety: the codec is immutable; callers serialise use of a residual.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pushpull::compress {

class TwoBitCodec {
 public:
  // threshold must be > 0 (InvalidArgument otherwise).
  explicit TwoBitCodec(float threshold);
  float threshold() const { return threshold_; }

  // Bytes the compressed form of n values takes.
  static size_t compressed_bytes(size_t n) { return (n + 15) / 16 * 4; }

  // Adds grad to residual, emits the quantised values into out
  // (compressed_bytes(n) bytes) and leaves the unsent part in residual.
  void compress(const float* grad, float* residual, uint32_t* out, size_t n) const;
  // out[i] = decoded value i (0, +t or -t).
  void decompress(const uint32_t* in, float* out, size_t n) const;
  // acc[i] += decoded value i (what a server does with each worker's push).
  void decompress_add(const uint32_t* in, float* acc, size_t n) const;

 private:
  float threshold_;
};

}  // namespace pushpull::compress
