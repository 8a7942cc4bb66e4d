#include "net/message.h"

#include <fmt/format.h>

namespace pushpull::net {
namespace {

template <typename T>
void put(std::byte* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i)
    p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
template <typename T>
T get(const std::byte* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<T>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

void encode_header(const Header& h, std::span<std::byte, kHeaderBytes> out) {
  std::byte* p = out.data();
  put<uint32_t>(p + 0, h.magic);
  put<uint16_t>(p + 4, h.version);
  put<uint16_t>(p + 6, h.type);
  put<uint32_t>(p + 8, h.flags);
  put<uint32_t>(p + 12, h.sender);
  put<uint64_t>(p + 16, h.request_id);
  put<uint64_t>(p + 24, h.key);
  put<uint32_t>(p + 32, h.dtype);
  put<uint32_t>(p + 36, 0);
  put<uint64_t>(p + 40, h.offset);
  put<uint64_t>(p + 48, h.length);
  put<uint64_t>(p + 56, h.payload_bytes);
}

Status decode_header(std::span<const std::byte, kHeaderBytes> in, uint64_t max_payload, Header* out,
                     uint16_t expected_version) {
  const std::byte* p = in.data();
  Header h;
  h.magic = get<uint32_t>(p + 0);
  if (h.magic != kMagic)
    return {ErrorCode::kProtocolError,
            fmt::format("bad magic 0x{:08x} (expected 0x{:08x}): the peer is not a pushpull node "
                        "or the stream is corrupt",
                        h.magic, kMagic)};
  h.version = get<uint16_t>(p + 4);
  if (h.version != expected_version)
    return {ErrorCode::kProtocolError,
            fmt::format("protocol version {} but this node speaks version {}: run the same "
                        "pushpull release on every node",
                        h.version, expected_version)};
  h.type = get<uint16_t>(p + 6);
  h.flags = get<uint32_t>(p + 8);
  h.sender = get<uint32_t>(p + 12);
  h.request_id = get<uint64_t>(p + 16);
  h.key = get<uint64_t>(p + 24);
  h.dtype = get<uint32_t>(p + 32);
  if (get<uint32_t>(p + 36) != 0)
    return {ErrorCode::kProtocolError, "reserved header bytes are not zero"};
  h.offset = get<uint64_t>(p + 40);
  h.length = get<uint64_t>(p + 48);
  h.payload_bytes = get<uint64_t>(p + 56);
  if (h.payload_bytes > max_payload)
    return {ErrorCode::kProtocolError,
            fmt::format("message of type {} announces {} payload bytes, above the limit of {} "
                        "(PUSHPULL_MAX_MESSAGE_BYTES)",
                        h.type, h.payload_bytes, max_payload)};
  *out = h;
  return {};
}

}  // namespace pushpull::net
