// SPDX-License-Identifier: Apache-2.0
// Rank 0's negotiation state (no threads, no I/O: the engine feeds it
// submissions and sends what poll() returns), and the response cache every
// rank keeps.
//
// A tensor is ready once every rank has submitted it or has joined (for a
// process set: every member; the other ranks take part as joined ranks do). Ready
// tensors are checked for agreement (mismatch -> an error response naming
// every rank's signature), then handed out in the order they became ready;
// consecutive allreduces with the same dtype, reduction and joined ranks are
// fused up to fusion_threshold_bytes. To give more tensors a chance to fuse,
// a ready small allreduce waits up to cycle_time_ms while other tensors are
// partly submitted; with nothing else in flight it goes out at once.
// Allreduces of kZeroCopyAllreduceBytes and more are never fused and never
// wait: fusing them would save one message latency but cost two copies of
// the tensor (into and out of the fusion buffer), and holding them back
// delays the overlap of communication with the rest of the backward pass.
// Other ops (never fused) do not wait either; whatever else is ready goes out
// with them, in the order it became ready.
//
// Thread safety: none; owned and used by the engine thread.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "collective/messages.h"
#include "pushpull/options.h"
#include "transport/transport.h"

namespace pushpull::collective {

using transport::Clock;

// Specs rank 0 has validated, numbered in the order of its responses, so
// every rank holds the same table and repeat submissions travel as an id.
class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity = 4096) : capacity_(capacity) {}
  uint32_t find(const Spec& s) const;  // kNoCacheId when not cached
  const Spec* get(uint32_t id) const;
  uint32_t assign(const Spec& s);           // rank 0; kNoCacheId when full
  void record(uint32_t id, const Spec& s);  // other ranks; ProtocolError when out of order

 private:
  size_t capacity_;
  std::vector<Spec> specs_;
  std::unordered_map<std::string, uint32_t> by_name_;
};

// From this size an allreduce runs alone, in place in the caller's buffer.
inline constexpr uint64_t kZeroCopyAllreduceBytes = uint64_t{1} << 20;

class Coordinator {
 public:
  Coordinator(int size, const CollectiveOptions& opts, ResponseCache& cache);

  // ProtocolError: an unknown cache id, a bad root, or a name submitted twice.
  // `since`: when the rank submitted it, if earlier than `now` (held on the
  // way by the negotiation tree, negotiation_tree.h); stall times count from it.
  void submit(int rank, Spec spec, Clock::time_point now,
              Clock::time_point since = Clock::time_point::max());
  void submit_cached(int rank, uint32_t id, Clock::time_point now,
                     Clock::time_point since = Clock::time_point::max());
  void join(int rank, Clock::time_point now);

  // The responses due at `now`, and stall reports to log.
  std::vector<Response> poll(Clock::time_point now, std::vector<StallReport>* stalls);
  // When poll() next has something to do (cycle end, stall timers).
  Clock::time_point next_deadline(Clock::time_point now) const;

 private:
  struct Pending {
    std::vector<std::optional<Spec>> specs;
    int have = 0;
    Clock::time_point first;
    Clock::time_point last_warn;
  };
  struct Item {
    Response response;
    Spec spec;  // kExecute: the agreed spec
    Clock::time_point ready_at;
  };
  void check(const std::string& name, Clock::time_point now);
  void check_all(Clock::time_point now);
  static const Spec* first_spec(const Pending& p);
  // Members of the op's set that joined instead of submitting it.
  std::vector<int> joined_members(const Pending& p, const Spec& spec) const;
  ResponseTensor tensor_of(const Spec& s);
  // A small allreduce: may be fused with the next ready ones, and may wait.
  bool fusible(const Item& item) const;
  Clock::duration seconds(double s) const;

  int size_;
  CollectiveOptions opts_;
  ResponseCache& cache_;
  std::map<std::string, Pending> pending_;
  std::vector<bool> joined_;
  int njoined_ = 0;
  int last_joined_ = -1;
  std::vector<Item> ready_;
};

}  // namespace pushpull::collective
