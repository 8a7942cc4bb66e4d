// SPDX-License-Identifier: Apache-2.0
// Test helper: the same algorithm cases over every transport. A Fabrics
// object runs fn(rank, transport) on n threads over the in-process transport
// over TcpTransports on loopback (with their direct streams, the fast path
// the engine takes) or over ShmTransports. Groups are connected once per world size and reused
// by later runs of the same object (connecting is the slow part); the object
// owns them and closes them when destroyed.
#pragma once

#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <random>

#include <fmt/format.h>

#include "harness.h"
#include "tcp_group.h"
#include "transport/inproc/inprocess_transport.h"
#include "transport/shm/shm_transport.h"

namespace pushpull::collective::testing {

using transport::InProcessFabric;
using transport::ShmOptions;
using transport::ShmTransport;
using transport::Transport;

enum class Kind { kInProcess, kTcp, kShm };

inline std::string kind_name(Kind k) {
  return k == Kind::kInProcess ? "InProcess" : k == Kind::kTcp ? "Tcp" : "Shm";
}

// n ShmTransports as threads of this process (their segments under a fresh
// random prefix; each constructor waits for the others, so one thread each).
// `prefix`: the segments' names ("" = a fresh random one).
inline std::vector<std::unique_ptr<Transport>> connect_shm_group(int n, ShmOptions o = {},
                                                                 std::string prefix = "") {
  std::random_device rd;
  if (prefix.empty()) prefix = fmt::format("pushpull-test-{:x}{:x}", rd(), rd());
  std::vector<std::unique_ptr<Transport>> ts(static_cast<size_t>(n));
  on_threads(n, [&](int r) {
    ts[static_cast<size_t>(r)] = std::make_unique<ShmTransport>(r, n, prefix, o);
  });
  return ts;
}

// n connected transports of `kind`, rank r at index r. In-process endpoints
// keep what they need of their fabric; TCP ranks meet on loopback with
// their direct streams; shared-memory ranks get small rings (64 KiB) unless
// `shm` says otherwise, so messages larger than a ring stream through it.
inline std::vector<std::unique_ptr<Transport>> connect_group(Kind kind, int n) {
  std::vector<std::unique_ptr<Transport>> group;
  if (kind == Kind::kInProcess) {
    auto fabric = std::make_shared<InProcessFabric>(n);
    for (int r = 0; r < n; ++r)
      group.push_back(fabric->endpoint(r));
  } else if (kind == Kind::kTcp) {
    for (auto& t : connect_tcp_group(n))
      group.push_back(std::move(t));
  } else {
    ShmOptions o;
    o.ring_bytes = 64 << 10;
    group = connect_shm_group(n, o);
  }
  return group;
}

class Fabrics {
 public:
  explicit Fabrics(Kind kind) : kind_(kind) {}

  void run(int n, const std::function<void(int, Transport&)>& fn) {
    std::vector<Transport*> eps;
    std::vector<std::unique_ptr<Transport>> owned;
    if (kind_ == Kind::kInProcess) {
      owned = connect_group(kind_, n);  // a fresh fabric per run: nothing left in flight
      for (auto& t : owned)
        eps.push_back(t.get());
    } else {
      auto& group = groups_[n];
      if (group.empty()) group = connect_group(kind_, n);
      for (auto& t : group)
        eps.push_back(t.get());
    }
    std::exception_ptr first;
    std::mutex mu;
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          fn(r, *eps[static_cast<size_t>(r)]);
        } catch (...) {
          std::lock_guard lock(mu);
          if (!first) first = std::current_exception();
        }
      });
    }
    for (auto& t : threads)
      t.join();
    if (first) {
      groups_.erase(n);  // a failed run may leave messages in flight: never reuse it
      std::rethrow_exception(first);
    }
  }

 private:
  Kind kind_;
  std::map<int, std::vector<std::unique_ptr<Transport>>> groups_;
};

}  // namespace pushpull::collective::testing
