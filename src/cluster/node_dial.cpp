// SPDX-License-Identifier: Apache-2.0
// The Node's start-up dialing of peers that may be gone (node.h): a
// restarted process joining a running job dials servers the placement may
// fail over meanwhile, and peers that may have been restarted themselves.
#include <chrono>

#include <fmt/format.h>

#include "cluster/node.h"
#include "pushpull/log.h"

namespace pushpull::cluster {

bool Node::dial_until_failed_over(const NodeAddress& t) {
  const auto until = std::chrono::steady_clock::now() + options_.net.connect_timeout;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (peers_.count({t.role, t.rank}) || shutdown_) return true;
      if (t.role == Role::kServer && placement_.is_dead(t.rank)) {
        PP_INFO("{} {}: {} was failed over while this node dialed it", role_name(role()), rank_,
                t.describe());
        return false;
      }
    }
    try {
      // Short attempts: a stopped server accepts (its kernel does) but never
      // answers the hello; between attempts the placement may have named it.
      transport::ConnId id = transport_->connect(t.host, t.port, Millis{1000});
      std::lock_guard lock(mu_);
      if (!peers_.count({t.role, t.rank})) peers_[{t.role, t.rank}] = id;
      cv_.notify_all();
      return true;
    } catch (const Error&) {
      if (std::chrono::steady_clock::now() >= until) throw;
    }
  }
}

// A restarted server keeps dialing a worker in short attempts until it
// answers or its replacement has dialed in (on_connect), up to
// connect_timeout; a replacement worker tries a failed-over server once.
void Node::dial_if_absent(const NodeAddress& t) {
  const bool server = role() == Role::kServer;
  const Millis brief = server ? Millis{1000} : Millis{300};
  const auto until = std::chrono::steady_clock::now() + options_.net.connect_timeout;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (peers_.count({t.role, t.rank}) || shutdown_) return;  // it dialed this node
    }
    try {
      transport::ConnId id = transport_->connect(t.host, t.port, brief);
      std::lock_guard lock(mu_);
      if (!peers_.count({t.role, t.rank})) peers_[{t.role, t.rank}] = id;
      cv_.notify_all();
      return;
    } catch (const Error& e) {
      if (server && std::chrono::steady_clock::now() < until) continue;
      PP_INFO("{} {}: cannot reach {} ({}); {}", role_name(role()), rank(), t.describe(), e.what(),
              server ? "waiting for its replacement to dial in"
                     : "if it is restarted, it dials this worker");
      return;
    }
  }
}

}  // namespace pushpull::cluster
