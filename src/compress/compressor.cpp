// SPDX-License-Identifier: Apache-2.0
#include "compress/compressor.h"

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
  out[0] = static_cast<std::byte>(settings_.type);
  out[1] = static_cast<std::byte>(kWireVersion);
  out[2] = out[3] = std::byte{0};
  std::memcpy(out + 4, &settings_.threshold, 4);
  encode_raw(key, device, numel, begin, grad, count, out + kHeaderBytes);
}

std::vector<float> Compressor::residual(uint64_t key, int device) const {
  std::lock_guard lock(mu_);
  auto it = residuals_.find({key, device});
  if (it == residuals_.end()) return {};
  std::lock_guard rlock(it->second->mu);
  return it->second->values;
}

Status decode_add(std::span<const std::byte> in, float* acc, size_t n) {
  if (in.size() < kHeaderBytes)
    return Status(ErrorCode::kProtocolError,
                  fmt::format("compressed push of {} bytes has no header", in.size()));
  const auto type = static_cast<uint8_t>(in[0]);
  const auto version = static_cast<uint8_t>(in[1]);
  if (version != kWireVersion || in[2] != std::byte{0} || in[3] != std::byte{0})
    return Status(
        ErrorCode::kProtocolError,
        fmt::format("compressed push has header version {} (expected {})", version, kWireVersion));
  Settings s;
  if (type == 0 || type > static_cast<uint8_t>(Type::kFp16))
    return Status(ErrorCode::kProtocolError,
                  fmt::format("compressed push has unknown compression type {}", type));
  s.type = static_cast<Type>(type);
  std::memcpy(&s.threshold, in.data() + 4, 4);
  std::unique_ptr<Codec> codec;
  try {
    codec = make_codec(s);  // checks the threshold (2bit > 0, 1bit finite)
  } catch (const std::exception& e) {
    return Status(ErrorCode::kProtocolError, fmt::format("compressed push: {}", e.what()));
  }
  const size_t need = kHeaderBytes + codec->compressed_bytes(n);
  if (in.size() != need)
    return Status(ErrorCode::kProtocolError,
                  fmt::format("compressed ({}) push of {} values has {} bytes, expected {}",
                              type_name(s.type), n, in.size(), need));
  codec->decompress_add(in.data() + kHeaderBytes, acc, n);
  return Status::ok();
}

}  // namespace pushpull::compress
