// SPDX-License-Identifier: Apache-2.0
// A group of Communicators as threads in one process.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "harness.h"
#include "pushpull/collective.h"
#include "transport/inproc/inprocess_transport.h"

namespace pushpull::collective::testing {

using transport::InProcessFabric;

inline CommunicatorOptions fast_options() {
  CommunicatorOptions o;
  o.peer_timeout = Millis(5000);
  o.wait_timeout = Millis(20000);
  o.collective.cycle_time_ms = 0.5;
  return o;
}

class Group {
 public:
  explicit Group(int n, CommunicatorOptions opts = fast_options()) : fabric_(n) {
    for (int r = 0; r < n; ++r)
      comms_.push_back(std::make_unique<Communicator>(fabric_.endpoint(r), opts));
  }
  Communicator& operator[](int r) { return *comms_[static_cast<size_t>(r)]; }
  int size() const { return static_cast<int>(comms_.size()); }

  // Runs fn(rank, comm) on one thread per rank; rethrows the first exception.
  void run(const std::function<void(int, Communicator&)>& fn) {
    testing::on_threads(size(), [&](int r) { fn(r, (*this)[r]); });
  }

 private:
  InProcessFabric fabric_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace pushpull::collective::testing
