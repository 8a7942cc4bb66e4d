// SPDX-License-Identifier: Apache-2.0
// Same-host shared memory on an authenticated connection: the setup
// messages and the frames that move payloads through the rings.
//
// Setup (after the hello; the connector offers, transport/shm/message_transport_shm.cpp):
//   connector -> acceptor  kShmOffer   {name of ring C, ring bytes, host identity}
//       an acceptor on another host (transport/host_identity.h: another kernel
//       or network namespace) refuses; else it maps ring C read-only, reads
//       C's token, creates ring A
//   acceptor -> connector  kShmAnswer  {accepted, reason, token of C, name of A, ring bytes}
//       the acceptor may send through A right after this frame; the
//       connector checks the token (the acceptor mapped C: same host, same
//       user), unlinks C, maps A and reads A's token
//   connector -> acceptor  kShmConfirm {accepted, reason, token of A}
//       the connector sends through C after this frame; the acceptor checks
//       the token and unlinks A
// A wrong token is a lie and closes the connection, as does a connector
// that cannot map a ring the acceptor already uses (a resource failure: the
// acceptor proved it is on this host). A refused offer (another host,
// shared memory off, no /dev/shm) leaves the connection on TCP as before.
//
// Payloads (both frames are bare 64-byte headers, no payload on TCP):
//   a message header with net_flags kNetFlagShmPayload, then one or more
//   kShmPiece {offset = stream position, length} frames, each sent after
//   its bytes were copied into the sender's ring; the reader copies them out
//   at exactly that position, in order, until payload_bytes arrived. While a
//   payload is incomplete the TCP stream carries only kShmPiece and
//   kShmRelease frames.
//   kShmRelease {offset = stream position}: the reader consumed its peer's
//   ring up to there (sent once a quarter of the ring was consumed), so the
//   writer may reuse it. Releases go out between pieces too, so two
//   directions that both wait for ring space cannot deadlock.
// The ring's bytes are never trusted for anything but payload: positions
// and lengths travel on TCP and are checked against what was sent.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pushpull/error.h"
#include "transport/shm/shm_segment.h"

namespace pushpull::transport {

// The largest setup message (the receiver's cap on its payload).
inline constexpr size_t kMaxShmSetupBytes = 512;
inline constexpr size_t kMaxShmReason = 200;
inline constexpr size_t kMaxShmHostBytes = 200;

struct ShmOffer {
  std::string name;
  uint64_t ring_bytes = 0;
  // The connector's transport::host_key(shm dir): the key the collectives group
  // ranks by too.
  std::string host;
};

struct ShmAnswer {
  bool accepted = false;
  std::string reason;  // why not (empty when accepted)
  ShmToken token{};    // the offered ring's token
  std::string name;    // the acceptor's ring
  uint64_t ring_bytes = 0;
};

struct ShmConfirm {
  bool accepted = false;
  std::string reason;
  ShmToken token{};  // the acceptor's ring's token
};

std::vector<std::byte> encode(const ShmOffer& m);
std::vector<std::byte> encode(const ShmAnswer& m);
std::vector<std::byte> encode(const ShmConfirm& m);
// Bounds-checked; a name that ShmSegment::valid_name() refuses (when
// accepted) or trailing bytes are malformed.
Status decode(std::span<const std::byte> in, ShmOffer* out);
Status decode(std::span<const std::byte> in, ShmAnswer* out);
Status decode(std::span<const std::byte> in, ShmConfirm* out);

}  // namespace pushpull::transport
