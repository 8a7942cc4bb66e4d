// SPDX-License-Identifier: Apache-2.0
// How failure messages name a node: "worker 2 (host 10.0.0.2:9000)", or
// "worker 2 (not registered; host unknown)" for a node the scheduler never
// heard from (its process exited before it registered).
// Thread safety: a pure function.
#pragma once

#include <string>

#include <fmt/format.h>

#include "cluster/protocol.h"

namespace pushpull::cluster {

inline std::string describe_node(const NodeAddress& who) {
  if (!who.host.empty() || who.port != 0) return who.describe();
  std::string name = who.rank < 0 ? std::string(role_name(who.role))
                                  : fmt::format("{} {}", role_name(who.role), who.rank);
  return name + " (not registered; host unknown)";
}

}  // namespace pushpull::cluster
