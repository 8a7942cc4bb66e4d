// SPDX-License-Identifier: Apache-2.0
// The scale simulation's network and clock (scale_sim.h): events in time
// order, one control thread per node whose busy time messages reserve in the
// order they are sent, per-node counts of connections, messages and bytes.
// Private to tests/sim/scale_*.cpp.
//
// Thread safety: none (one thread). Ownership: Net owns its events.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

#include "base/clock.h"
#include "sim/scale_sim.h"

namespace pushpull::sim::scale {

struct Count {
  uint64_t messages = 0;  // sent + received
  uint64_t bytes = 0;     // sent + received
  uint64_t busy_us = 0;   // control-thread time spent
  int connections = 0;
};

class Net {
 public:
  Net(int nodes, const Costs& costs);

  uint64_t now() const { return now_; }
  // The clock the real detectors read; it follows now().
  const ManualClock& clock() const { return clock_; }
  void at(uint64_t t, std::function<void()> fn);
  // Runs events up to `until` (or until none is left); false when the
  // queue ran dry before.
  bool run(uint64_t until);
  uint64_t events() const { return events_; }

  // A message of `bytes` (header included). `fn` runs at the receiver once
  // its thread processed it. Nothing happens when either end is stopped or
  // dead (the receiver's kernel would hold it: a stopped peer never answers).
  void send(int from, int to, uint64_t bytes, std::function<void()> fn);
  // When a message sent now would be processed by `to`, reserving both
  // threads' time and counting it, without an event (the caller knows the
  // receiver's state cannot change by it: a verdict to a rank that decides
  // by itself first). The receiver's time is reserved from the arrival on,
  // which may idle its thread until then: only for the end of a run.
  // `start`: when the sender has it ready (default: now).
  uint64_t send_counted(int from, int to, uint64_t bytes, uint64_t start = UINT64_MAX);
  // A connection from -> to: the kernel's round trip, then the hello's
  // challenge, hello and ack (their real encoded sizes). `done` runs at the
  // connector when the ack is processed, `accepted` at the acceptor when it
  // took the hello. `stream`: a collectives data stream follows on the
  // connection (one more connection, 2 messages; `done` after it).
  void connect(int from, int to, std::function<void()> done, std::function<void()> accepted = {},
               bool stream = false);
  // `sent` and `received` messages of `bytes` each at `node`, in one lump
  // of its thread's time (heartbeats of a symmetric topology: see
  // scale_collective.cpp).
  void lump(int node, uint64_t sent, uint64_t received, uint64_t bytes);

  void stop(int node) { down_[static_cast<size_t>(node)] = true; }
  bool down(int node) const { return down_[static_cast<size_t>(node)]; }
  const Count& count(int node) const { return count_[static_cast<size_t>(node)]; }
  const std::vector<Count>& counts() const { return count_; }
  const Costs& costs() const { return costs_; }

 private:
  uint64_t reserve(int node, uint64_t from_t, uint64_t us);
  struct Event {
    uint64_t t, order;
    std::function<void()> fn;
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : order > o.order; }
  };
  Costs costs_;
  uint64_t now_ = 0, order_ = 0, events_ = 0;
  ManualClock clock_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> queue_;
  std::vector<uint64_t> busy_;  // per node: its thread is busy until then
  std::vector<bool> down_;
  std::vector<Count> count_;
  uint64_t challenge_bytes_ = 0, hello_bytes_ = 0, ack_bytes_ = 0;
};

// What `field` grew by between two snapshots, over nodes [first, last)
// (mean and max) and at `hub`, divided by `per`.
Spread spread(const std::vector<Count>& before, const std::vector<Count>& after,
              const std::function<double(const Count&)>& field, int first, int last, int hub,
              double per = 1);

}  // namespace pushpull::sim::scale
