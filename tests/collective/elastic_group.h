// SPDX-License-Identifier: Apache-2.0
// Test helper: an elastic group of threads over the in-process transport.
// Each member thread asks the hub for the communicator of the next round;
// a round forms once every live member asked (like the launcher's server,
// elastic_rendezvous.h), with the previous round's members first in their
// old rank order and newcomers after them. leave() is a member dying: it
// no longer counts for the next round (its thread closes its communicator,
// which fails its peers' operations with PeerFailure).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "pushpull/collective.h"
#include "transport/inproc/inprocess_transport.h"

namespace pushpull::collective::testing {

using transport::InProcessFabric;
using transport::Transport;

class ElasticHub {
 public:
  explicit ElasticHub(int members) : live_(members) {}

  // Blocks until the next round formed; this member's communicator of it.
  std::unique_ptr<Communicator> join(int id) {
    std::unique_lock lock(mu_);
    asked_.push_back(id);
    const uint64_t want = round_ + 1;
    maybe_form();
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return round_ >= want; }))
      throw Timeout("elastic hub: no round formed within 60 s");
    CommunicatorOptions o;
    o.peer_timeout = Millis(20000);
    o.wait_timeout = Millis(60000);
    return std::make_unique<Communicator>(std::move(endpoints_.at(id)), o);
  }
  void leave() {
    std::lock_guard lock(mu_);
    --live_;
    maybe_form();
  }
  void add_member() {
    std::lock_guard lock(mu_);
    ++live_;
  }
  uint64_t round() const {
    std::lock_guard lock(mu_);
    return round_;
  }

 private:
  void maybe_form() {
    if (static_cast<int>(asked_.size()) < live_ || asked_.empty()) return;
    std::vector<int> order;
    for (int id : previous_)
      if (std::find(asked_.begin(), asked_.end(), id) != asked_.end()) order.push_back(id);
    for (int id : asked_)
      if (std::find(order.begin(), order.end(), id) == order.end()) order.push_back(id);
    InProcessFabric fabric(static_cast<int>(order.size()));
    for (size_t r = 0; r < order.size(); ++r)
      endpoints_[order[r]] = fabric.endpoint(static_cast<int>(r));
    previous_ = order;
    asked_.clear();
    ++round_;
    cv_.notify_all();
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int live_;
  std::vector<int> asked_, previous_;
  std::map<int, std::unique_ptr<Transport>> endpoints_;
  uint64_t round_ = 0;
};

}  // namespace pushpull::collective::testing
