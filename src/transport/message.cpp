// SPDX-License-Identifier: Apache-2.0
#include "transport/message.h"

#include <fmt/format.h>

#include "transport/wire.h"

namespace pushpull::transport {

void encode_header(const Header& h, std::span<std::byte, kHeaderBytes> out) {
  SpanWriter w(out);
  w.u<uint32_t>(h.magic)
      .u<uint16_t>(h.version)
      .u<uint16_t>(h.type)
      .u<uint32_t>(h.flags)
      .u<uint32_t>(h.sender)
      .u<uint64_t>(h.request_id)
      .u<uint64_t>(h.key)
      .u<uint32_t>(h.dtype)
      .u<uint32_t>(h.net_flags)
      .u<uint64_t>(h.offset)
      .u<uint64_t>(h.length)
      .u<uint64_t>(h.payload_bytes);
}

Status decode_header(std::span<const std::byte, kHeaderBytes> in, uint64_t max_payload, Header* out,
                     uint16_t expected_version) {
  Reader r(in);
  Header h;
  h.magic = r.u<uint32_t>();
  if (h.magic != kMagic)
    return {ErrorCode::kProtocolError,
            fmt::format("bad magic 0x{:08x} (expected 0x{:08x}): the peer is not a pushpull node "
                        "or the stream is corrupt",
                        h.magic, kMagic)};
  h.version = r.u<uint16_t>();
  if (h.version != expected_version)
    return {ErrorCode::kProtocolError,
            fmt::format("protocol version {} but this node speaks version {}: run the same "
                        "pushpull release on every node",
                        h.version, expected_version)};
  h.type = r.u<uint16_t>();
  h.flags = r.u<uint32_t>();
  h.sender = r.u<uint32_t>();
  h.request_id = r.u<uint64_t>();
  h.key = r.u<uint64_t>();
  h.dtype = r.u<uint32_t>();
  h.net_flags = r.u<uint32_t>();
  if ((h.net_flags & ~kNetFlagsKnown) != 0)
    return {ErrorCode::kProtocolError,
            fmt::format("unknown net flags 0x{:x} in the message header", h.net_flags)};
  h.offset = r.u<uint64_t>();
  h.length = r.u<uint64_t>();
  h.payload_bytes = r.u<uint64_t>();
  if (!r.done()) return {ErrorCode::kProtocolError, "malformed message header"};
  if (h.payload_bytes > max_payload)
    return {ErrorCode::kProtocolError,
            fmt::format("message of type {} announces {} payload bytes, above the limit of {} "
                        "(PUSHPULL_MAX_MESSAGE_BYTES)",
                        h.type, h.payload_bytes, max_payload)};
  *out = h;
  return {};
}

}  // namespace pushpull::transport
