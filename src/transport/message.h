// SPDX-License-Identifier: Apache-2.0
// Wire format of every pushpull message: a fixed 64-byte little-endian header
// followed by `payload_bytes` bytes of payload.
//
//   offset size field
//        0    4 magic          "PPSH" (0x48535050 read as little-endian u32)
//        4    2 version        kProtocolVersion
//        6    2 type           message type (ranges below)
//        8    4 flags          per-type bits
//       12    4 sender         node id of the sender (see cluster/node.h)
//       16    8 request_id     matches replies to requests / ops of a collective
//       24    8 key            parameter key or segment index
//       32    4 dtype          pushpull::DType as an integer, or 0
//       36    4 net_flags      the net layer's own bits (kNetFlag*); unknown bits
//                              are a protocol error
//       40    8 offset         byte offset of the payload inside the key's value
//       48    8 length         total byte length of the key's value
//       56    8 payload_bytes  bytes following this header
//
// Fields are encoded byte by byte (never by copying a struct), so the format
// is the same on every host. decode_header() validates magic, version and the
// payload length against a cap before the receiver allocates anything.
//
// Message type ranges: each layer owns one range and registers handlers for
// it on the MessageTransport; a message whose type has no handler is a protocol
// error that closes that connection only.
//   [0, 16)     net: the hello handshake, shared memory, data-stream frames
//   [16, 64)    cluster: registration, address book, barriers, heartbeats
//   [64, 128)   ps: push, pull, init, commands
//   [128, 192)  collective: ring segments, negotiation
//   [192, 256)  free for tests and future layers
//
// Thread safety: plain values and pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "pushpull/error.h"

namespace pushpull::transport {

inline constexpr uint32_t kMagic = 0x48535050;  // bytes "PPSH"
// 2: mutual hello (transport/hello.h); 3: shared-memory payloads (transport/shm/shm_setup.h);
// 4: the hello's kind (a message connection or a data stream, bound by the proofs);
// 5: the shared-memory setup carries host records (transport/host_identity.h).
inline constexpr uint16_t kProtocolVersion = 5;
inline constexpr size_t kHeaderBytes = 64;

namespace msg {
// net's own types.
inline constexpr uint16_t kChallenge = 1;  // acceptor -> connector: nonce
inline constexpr uint16_t kHello = 2;      // connector -> acceptor: identity + proof
inline constexpr uint16_t kHelloAck = 3;   // acceptor -> connector: accepted or why not
// Same-host shared memory (transport/shm/shm_setup.h), after the hello.
inline constexpr uint16_t kShmOffer = 4;    // connector -> acceptor: my ring's record
inline constexpr uint16_t kShmAnswer = 5;   // acceptor -> connector: my ring's record / no
inline constexpr uint16_t kShmConfirm = 6;  // connector -> acceptor: mapped (no payload)
inline constexpr uint16_t kShmPiece = 7;    // `length` payload bytes at ring position `offset`
inline constexpr uint16_t kShmRelease = 8;  // the reader consumed the ring up to `offset`
// One message on a data stream (transport/tcp/message_transport.h, "Streams"): request_id is
// the sender's tag, payload_bytes what follows; only on streams.
inline constexpr uint16_t kStreamData = 9;
inline constexpr uint16_t kNetLast = 15;
inline constexpr uint16_t kClusterFirst = 16, kClusterLast = 63;
inline constexpr uint16_t kPsFirst = 64, kPsLast = 127;
inline constexpr uint16_t kCollectiveFirst = 128, kCollectiveLast = 191;
inline constexpr uint16_t kUserFirst = 192, kUserLast = 255;
}  // namespace msg

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint16_t type = 0;
  uint32_t flags = 0;
  uint32_t sender = 0;
  uint64_t request_id = 0;
  uint64_t key = 0;
  uint32_t dtype = 0;
  uint32_t net_flags = 0;  // kNetFlag*: set and checked by the MessageTransport only
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t payload_bytes = 0;

  bool operator==(const Header&) const = default;
};

// net_flags: the payload does not follow on TCP; it comes through the
// connection's shared-memory ring in kShmPiece frames (transport/shm/shm_setup.h).
inline constexpr uint32_t kNetFlagShmPayload = 1;
inline constexpr uint32_t kNetFlagsKnown = kNetFlagShmPayload;

using HeaderBytes = std::array<std::byte, kHeaderBytes>;

// Writes `h` into `out` (little-endian, reserved bytes zero).
void encode_header(const Header& h, std::span<std::byte, kHeaderBytes> out);
inline HeaderBytes encode_header(const Header& h) {
  HeaderBytes b;
  encode_header(h, b);
  return b;
}

// Parses and validates 64 bytes: magic, version == `expected_version`,
// no unknown net_flags bits, payload_bytes <= `max_payload`. On failure returns a
// ProtocolError status saying which field was wrong and leaves *out unspecified.
Status decode_header(std::span<const std::byte, kHeaderBytes> in, uint64_t max_payload, Header* out,
                     uint16_t expected_version = kProtocolVersion);

}  // namespace pushpull::transport
