// SPDX-License-Identifier: Apache-2.0
// The node id in Header::sender: scheduler 1, server r 8+2r, worker r 9+2r
// (ps-lite's numbering); a server or worker that has no rank yet is 2 or 3,
// nobody 0. The MessageTransport writes the id of a connection's authenticated peer
// into every message it delivers (see transport.h), so receivers can trust it.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <utility>

#include "pushpull/options.h"

namespace pushpull::transport {

inline constexpr uint32_t node_id(Role role, int32_t rank) {
  switch (role) {
    case Role::kScheduler:
      return 1;
    case Role::kServer:
      return rank < 0 ? 2 : 8 + 2 * static_cast<uint32_t>(rank);
    case Role::kWorker:
      return rank < 0 ? 3 : 9 + 2 * static_cast<uint32_t>(rank);
    default:
      return 0;
  }
}

// Inverse of node_id: {kNone, -1} for ids that name no node.
inline constexpr std::pair<Role, int32_t> node_of_id(uint32_t id) {
  if (id == 1) return {Role::kScheduler, 0};
  if (id == 2) return {Role::kServer, -1};
  if (id == 3) return {Role::kWorker, -1};
  if (id >= 8)
    return {id % 2 == 0 ? Role::kServer : Role::kWorker, static_cast<int32_t>((id - 8) / 2)};
  return {Role::kNone, -1};
}

}  // namespace pushpull::transport
