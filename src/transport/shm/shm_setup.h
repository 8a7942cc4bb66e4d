// SPDX-License-Identifier: Apache-2.0
// Same-host shared memory on an authenticated connection: the setup
// messages and the frames that move payloads through the rings.
//
// Setup (after the hello; the connector offers, transport/shm/message_transport_shm.cpp).
// Each ring is its maker's proof of the same host (transport/host_identity.h:
// its record names it and what it holds; verify() makes every refusal):
//   connector -> acceptor  kShmOffer   {record of ring C}
//       an acceptor that cannot verify it (another host, no such file, not
//       this user's, ...) declines; else it maps C read-only, creates ring A
//   acceptor -> connector  kShmAnswer  {accepted, reason, record of A}
//       the acceptor may send through A right after this frame; the
//       connector unlinks C (mapped by the acceptor), verifies and maps A
//   connector -> acceptor  kShmConfirm (no payload)
//       the connector sends through C after this frame; the acceptor
//       unlinks A
// A connector that cannot verify or map A closes the connection (the
// acceptor may already send through it). A declined offer (another host,
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

// The offer is the connector's ring's record (encode / decode in
// transport/host_identity.h).
struct ShmAnswer {
  bool accepted = false;
  std::string reason;  // why not (empty when accepted)
  HostRecord ring;     // the acceptor's ring (when accepted)
};

std::vector<std::byte> encode(const ShmAnswer& m);
// Bounds-checked; a malformed record (when accepted) or trailing bytes are
// malformed.
Status decode(std::span<const std::byte> in, ShmAnswer* out);

}  // namespace pushpull::transport
