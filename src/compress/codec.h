// SPDX-License-Identifier: Apache-2.0
// A gradient codec with error feedback: what one compression type does to a
// float32 array. Each caller keeps a float32 residual per array (per key and
// device); compress adds the gradient to it, encodes what is sent and leaves
// what was not sent in the residual, so nothing is lost, only delayed.
//
// Encoded bytes are little-endian and need no alignment (they may sit behind
// a header in a network buffer). Decoding never reads more than
// compressed_bytes(n) bytes; the caller checks that many are there.
//
// Thread safety: codecs are immutable; callers serialise use of a residual.
#pragma once

#include <cstddef>
#include <memory>

#include "compress/settings.h"

namespace pushpull::compress {

class Codec {
 public:
  virtual ~Codec() = default;
  virtual Type type() const = 0;
  // Bytes the encoded form of n values takes.
  virtual size_t compressed_bytes(size_t n) const = 0;
  // residual += grad; writes the encoded values (compressed_bytes(n) bytes)
  // to out; residual keeps what the encoding did not carry.
  virtual void compress(const float* grad, float* residual, std::byte* out, size_t n) const = 0;
  // acc[i] += decoded value i (what a server does with each worker's push).
  virtual void decompress_add(const std::byte* in, float* acc, size_t n) const = 0;
  // out[i] = 0 + decoded value i: the same bits as decompress_add into
  // zeros (a -0 reads as +0), without reading `out` first.
  virtual void decompress(const std::byte* in, float* out, size_t n) const;
  // compress(values, residual, out, n), then values[i] = what out decodes
  // to (as decompress writes it), in one pass where the codec can.
  virtual void compress_keep(float* values, float* residual, std::byte* out, size_t n) const;
};

// The codec of `s`, or null for Type::kNone. Settings come from
// parse_settings (checked); a 2bit threshold <= 0 is still an InvalidArgument.
std::unique_ptr<Codec> make_codec(const Settings& s);

}  // namespace pushpull::compress
