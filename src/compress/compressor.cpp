// SPDX-License-Identifier: Apache-2.0
#include "compress/compressor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace pushpull::compress {

Compressor::Compressor(Settings s) : settings_(s), codec_(make_codec(s)) {
  if (!codec_) throw InvalidArgument("a compressor needs a compression type other than 'none'");
}

Compressor::Residual& Compressor::residual_of(uint64_t key, int device, size_t numel) {
  std::lock_guard lock(mu_);
  auto& slot = residuals_[{key, device}];
  if (!slot) {
    slot = std::make_unique<Residual>();
    slot->values.assign(numel, 0.0f);
  }
  if (slot->values.size() != numel)
    throw InvalidArgument(
        fmt::format("compression residual of key id {} has {} values; this push has {}", key,
                    slot->values.size(), numel));
  return *slot;
}

void Compressor::encode_raw(uint64_t key, int device, size_t numel, size_t begin, const float* grad,
                            size_t count, std::byte* out) {
  if (begin > numel || count > numel - begin)
    throw InvalidArgument(
        fmt::format("compress: range ({}, {}) outside {} values", begin, count, numel));
  Residual& r = residual_of(key, device, numel);
  std::lock_guard lock(r.mu);
  codec_->compress(grad, r.values.data() + begin, out, count);
}

void Compressor::encode(uint64_t key, int device, size_t numel, size_t begin, const float* grad,
                        size_t count, std::byte* out) {
  write_header(settings_, out);
  encode_raw(key, device, numel, begin, grad, count, out + kHeaderBytes);
}

std::vector<float> Compressor::residual(uint64_t key, int device) const {
  std::lock_guard lock(mu_);
  auto it = residuals_.find({key, device});
  if (it == residuals_.end()) return {};
  std::lock_guard rlock(it->second->mu);
  return it->second->values;
}

void write_header(const Settings& s, std::byte* out) {
  out[0] = static_cast<std::byte>(s.type);
  out[1] = static_cast<std::byte>(kWireVersion);
  out[2] = out[3] = std::byte{0};
  std::memcpy(out + 4, &s.threshold, 4);
}

Status parse_wire(std::span<const std::byte> in, size_t n, std::unique_ptr<Codec>* codec) {
  if (in.size() < kHeaderBytes)
    return Status(ErrorCode::kProtocolError,
                  fmt::format("compressed part of {} bytes has no header", in.size()));
  const auto type = static_cast<uint8_t>(in[0]);
  const auto version = static_cast<uint8_t>(in[1]);
  if (version != kWireVersion || in[2] != std::byte{0} || in[3] != std::byte{0})
    return Status(
        ErrorCode::kProtocolError,
        fmt::format("compressed part has header version {} (expected {})", version, kWireVersion));
  Settings s;
  if (type == 0 || type > static_cast<uint8_t>(Type::kFp16))
    return Status(ErrorCode::kProtocolError,
                  fmt::format("compressed part has unknown compression type {}", type));
  s.type = static_cast<Type>(type);
  std::memcpy(&s.threshold, in.data() + 4, 4);
  if (s.type == Type::kFp16) s.threshold = kDefaultThreshold;  // carried, not used
  try {
    *codec = make_codec(s);  // checks the threshold (2bit > 0, 1bit finite)
  } catch (const std::exception& e) {
    return Status(ErrorCode::kProtocolError, fmt::format("compressed part: {}", e.what()));
  }
  const size_t need = kHeaderBytes + (*codec)->compressed_bytes(n);
  if (in.size() != need)
    return Status(ErrorCode::kProtocolError,
                  fmt::format("compressed ({}) part of {} values has {} bytes, expected {}",
                              type_name(s.type), n, in.size(), need));
  return Status::ok();
}

std::optional<Settings> wire_settings(std::span<const std::byte> in, size_t n) {
  std::unique_ptr<Codec> codec;
  if (!parse_wire(in, n, &codec).is_ok()) return std::nullopt;
  Settings s;
  s.type = codec->type();
  std::memcpy(&s.threshold, in.data() + 4, 4);
  if (s.type == Type::kFp16) s.threshold = kDefaultThreshold;
  return s;
}

Status decode_add(std::span<const std::byte> in, float* acc, size_t n) {
  std::unique_ptr<Codec> codec;
  if (Status st = parse_wire(in, n, &codec); !st.is_ok()) return st;
  codec->decompress_add(in.data() + kHeaderBytes, acc, n);
  return Status::ok();
}

Status decode_in_place(std::byte* buf, size_t wire_bytes, size_t n) {
  std::unique_ptr<Codec> codec;
  if (wire_bytes > n * sizeof(float))
    return Status(
        ErrorCode::kProtocolError,
        fmt::format("compressed part of {} bytes is larger than its {} values", wire_bytes, n));
  if (Status st = parse_wire({buf, wire_bytes}, n, &codec); !st.is_ok()) return st;
  // Back to front, a block at a time: block b's values are written over
  // bytes [4 b B, 4 (b + 1) B), at or past where the encoded bytes of blocks
  // before it end (8 + compressed_bytes(b B) <= 4 b B for b >= 1: at most 2
  // bytes a value), and its own encoded bytes are copied out first.
  constexpr size_t kBlock = 4096;  // a multiple of 32: whole words of every codec
  alignas(64) std::byte tmp[kBlock * 2];
  const std::byte* enc = buf + kHeaderBytes;
  auto* out = reinterpret_cast<float*>(buf);
  size_t at = (n == 0 ? 0 : (n - 1) / kBlock * kBlock);
  for (;;) {
    const size_t k = std::min(kBlock, n - at);
    const size_t from = codec->compressed_bytes(at), len = codec->compressed_bytes(k);
    std::memcpy(tmp, enc + from, len);
    codec->decompress(tmp, out + at, k);
    if (at == 0) break;
    at -= kBlock;
  }
  return Status::ok();
}

}  // namespace pushpull::compress
