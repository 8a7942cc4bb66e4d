// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_setup.h"

#include "transport/wire.h"

namespace pushpull::transport {

static_assert(2 + kMaxShmReason + kHostRecordBytes <= kMaxShmSetupBytes);  // the longest answer

std::vector<std::byte> encode(const ShmAnswer& m) {
  Writer w;
  w.u<uint8_t>(m.accepted ? 1 : 0)
      .str<uint8_t>(m.reason.substr(0, kMaxShmReason))
      .bytes(m.accepted ? encode(m.ring) : std::vector<std::byte>{});
  return w.take();
}

Status decode(std::span<const std::byte> in, ShmAnswer* out) {
  Reader r(in);
  const auto accepted = r.u<uint8_t>();
  out->reason = r.str<uint8_t>(kMaxShmReason);
  out->accepted = accepted == 1;
  const auto ring = r.rest();
  if (!r.ok() || accepted > 1 || (out->accepted ? !decode(ring, &out->ring) : !ring.empty()))
    return {ErrorCode::kProtocolError, "malformed shared-memory answer message"};
  return {};
}

}  // namespace pushpull::transport
