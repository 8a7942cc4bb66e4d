// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_setup.h"

#include <fmt/format.h>

#include "transport/wire.h"

namespace pushpull::transport {
namespace {
Status malformed(const char* what) {
  return {ErrorCode::kProtocolError, fmt::format("malformed {} message", what)};
}
std::string cut(const std::string& s) {
  return s.size() > kMaxShmReason ? s.substr(0, kMaxShmReason) : s;
}
}  // namespace

std::vector<std::byte> encode(const ShmOffer& m) {
  Writer w;
  w.str<uint8_t>(m.name).u<uint64_t>(m.ring_bytes).str<uint8_t>(m.host);
  return w.take();
}
std::vector<std::byte> encode(const ShmAnswer& m) {
  Writer w;
  w.u<uint8_t>(m.accepted ? 1 : 0)
      .str<uint8_t>(cut(m.reason))
      .bytes(m.token)
      .str<uint8_t>(m.name)
      .u<uint64_t>(m.ring_bytes);
  return w.take();
}
std::vector<std::byte> encode(const ShmConfirm& m) {
  Writer w;
  w.u<uint8_t>(m.accepted ? 1 : 0).str<uint8_t>(cut(m.reason)).bytes(m.token);
  return w.take();
}

Status decode(std::span<const std::byte> in, ShmOffer* out) {
  Reader r(in);
  out->name = r.str<uint8_t>(kShmNameBytes);
  out->ring_bytes = r.u<uint64_t>();
  out->host = r.str<uint8_t>(kMaxShmHostBytes);
  if (!r.done() || !ShmSegment::valid_name(out->name)) return malformed("shared-memory offer");
  return {};
}
Status decode(std::span<const std::byte> in, ShmAnswer* out) {
  Reader r(in);
  const auto accepted = r.u<uint8_t>();
  out->reason = r.str<uint8_t>(kMaxShmReason);
  r.bytes(out->token);
  out->name = r.str<uint8_t>(kShmNameBytes);
  out->ring_bytes = r.u<uint64_t>();
  if (!r.done() || accepted > 1) return malformed("shared-memory answer");
  out->accepted = accepted == 1;
  if (out->accepted && !ShmSegment::valid_name(out->name)) return malformed("shared-memory answer");
  return {};
}
Status decode(std::span<const std::byte> in, ShmConfirm* out) {
  Reader r(in);
  const auto accepted = r.u<uint8_t>();
  out->reason = r.str<uint8_t>(kMaxShmReason);
  r.bytes(out->token);
  if (!r.done() || accepted > 1) return malformed("shared-memory confirmation");
  out->accepted = accepted == 1;
  return {};
}

}  // namespace pushpull::transport
