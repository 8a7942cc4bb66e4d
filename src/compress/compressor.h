// SPDX-License-Identifier: Apache-2.0
// What a store uses to compress pushes: the codec of one Settings plus the
// error-feedback residuals, one float32 array per (key, device), and the
// self-describing wire form of a compressed part.
//
// Wire form of one compressed part of n values (little-endian):
//   u8 type (settings.h Type)   u8 version (1)   u16 zero   f32 threshold
//   then the codec's compressed_bytes(n) bytes
// decode_add checks every field and the exact length before reading, so a
// receiver (a parameter server) can take it from an untrusted peer.
//
// Residuals start at zero, belong to this compressor (a new setting starts
// new ones) and are only ever touched under their own lock.
//
// Thread safety: every method may be called from any thread; encodes of one
// (key, device) are serialised, different ones run in parallel.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "compress/codec.h"
#include "pushpull/error.h"

namespace pushpull::compress {

inline constexpr size_t kHeaderBytes = 8;
inline constexpr uint8_t kWireVersion = 1;

class Compressor {
 public:
  // InvalidArgument when `s` is Type::kNone (nothing to compress) or invalid.
  explicit Compressor(Settings s);
  const Settings& settings() const { return settings_; }
  const Codec& codec() const { return *codec_; }

  // Bytes of the wire form of n values (header included).
  size_t encoded_bytes(size_t n) const { return kHeaderBytes + codec_->compressed_bytes(n); }

  // Encodes values [begin, begin + count) of the gradient of (key, device),
  // whose whole array has `numel` values, into `out` (encoded_bytes(count)
  // bytes). `grad` points at value `begin`. The residual of that range is
  // updated. InvalidArgument when numel differs from earlier calls of the key.
  void encode(uint64_t key, int device, size_t numel, size_t begin, const float* grad, size_t count,
              std::byte* out);

  // Encodes without a header into `out` (codec().compressed_bytes(count)
  // bytes): for engines that agree on the settings beforehand (a ring).
  void encode_raw(uint64_t key, int device, size_t numel, size_t begin, const float* grad,
                  size_t count, std::byte* out);

  // Copies of a key's residual (tests; empty when never encoded).
  std::vector<float> residual(uint64_t key, int device) const;

 private:
  struct Residual {
    std::mutex mu;
    std::vector<float> values;
  };
  Residual& residual_of(uint64_t key, int device, size_t numel);

  Settings settings_;
  std::unique_ptr<Codec> codec_;
  mutable std::mutex mu_;  // guards the map's structure
  std::map<std::pair<uint64_t, int>, std::unique_ptr<Residual>> residuals_;
};

// Writes the wire form's header of `s` (kHeaderBytes bytes) to out.
void write_header(const Settings& s, std::byte* out);

// Checks a wire form of n values (header fields, exact length) and makes its
// codec. ProtocolError naming what is wrong.
Status parse_wire(std::span<const std::byte> in, size_t n, std::unique_ptr<Codec>* codec);

// The settings a valid wire form of n values was encoded with, or nullopt.
std::optional<Settings> wire_settings(std::span<const std::byte> in, size_t n);

// Adds the n values encoded in `in` (wire form, header included) to acc.
// ProtocolError, with acc untouched, when the header is not one this build
// writes or the length is not exactly encoded_bytes(n).
Status decode_add(std::span<const std::byte> in, float* acc, size_t n);

// A compressed pull reply received where its n float32 values go: `buf`
// (n * 4 bytes, float-aligned) starts with the wire form's `wire_bytes`
// bytes; afterwards it holds the n decoded values (as Codec::decompress
// writes them), with no second buffer. Checked as decode_add checks, and
// `wire_bytes` must fit in n * 4; on an error the bytes are left as they
// were.
Status decode_in_place(std::byte* buf, size_t wire_bytes, size_t n);

}  // namespace pushpull::compress
