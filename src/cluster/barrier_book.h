// SPDX-License-Identifier: Apache-2.0
// BarrierBook: the scheduler's barriers, counted by member (role, rank), not
// by connection, so that a worker lost and replaced mid-barrier neither
// completes a barrier early nor deadlocks it (docs/ps.md "Worker restart").
//
// Every member of a group is expected at every barrier, away workers
// included: a worker that died blocks the barrier until its replacement
// arrives or moves past it. What "moves past" means needs the barrier's
// place in the program, which a replacement (resuming after the last round
// the servers completed, not at the barrier where its predecessor was) cannot
// know by counting its calls. So a dist_sync worker tags each barrier with
// its *position*, the number of pushes it issued so far (every worker issues
// the same pushes between two barriers of a dist_sync job), and the
// barrier's number at that position (`seq`: `barrier(); barrier();`):
//
// - a replacement that calls a barrier at or before the last one completed
//   (its predecessor was in it) is answered at once;
// - a replacement's first push tells the scheduler its position (pass()):
//   it will not call a barrier at that position any more, so every barrier
//   waiting at that position or before completes without it.
//
// Untracked tags (dist_async, where workers push at their own pace; servers)
// count arrivals only: a replacement there skips barriers until its first
// push and then joins the one the others are in (DistStore::barrier).
//
// Sans-IO: it returns whom to answer; the scheduler sends. Thread safety:
// none (the scheduler calls it under its lock).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "pushpull/options.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::cluster {

struct BarrierTag {
  bool tracked = false;   // position and seq mean something
  uint64_t position = 0;  // pushes issued before the barrier
  uint64_t seq = 0;       // 1 for the first barrier at this position, 2 for the next...
  auto key() const { return std::make_pair(position, seq); }
};

class BarrierBook {
 public:
  using Member = std::pair<Role, int>;  // (role, rank)
  struct Answer {
    transport::ConnId conn;
    uint64_t count;  // the member's own barrier count, echoed back
  };

  // `m` (on `conn`, its `count`-th barrier call) arrives at a barrier of
  // `group` whose expected members are `members`. Returns whom to answer:
  // everyone waiting when this completes it, `m` alone when it was already
  // passed, nothing while others are missing.
  std::vector<Answer> arrive(uint8_t group, Member m, transport::ConnId conn, uint64_t count,
                             BarrierTag tag, const std::vector<Member>& members);
  // A replacement worker issued its first push at `position`: it is past
  // every barrier at that position or before. Settle every group again.
  void pass(int worker_rank, uint64_t position);
  // A member is gone (its replacement starts afresh): its arrivals and its
  // pass are forgotten.
  void lose(Member m);
  // Completes `group`'s barrier if its members (after a loss, a pass or a
  // placement) are now all there. Returns whom to answer.
  std::vector<Answer> settle(uint8_t group, const std::vector<Member>& members);
  // Groups with someone waiting (for settling after pass() or lose()).
  std::vector<uint8_t> waiting_groups() const;
  size_t waiting(uint8_t group) const;

 private:
  struct Arrival {
    transport::ConnId conn;
    uint64_t count;
    BarrierTag tag;
  };
  struct Group {
    std::map<Member, Arrival> waiting;
    std::optional<std::pair<uint64_t, uint64_t>> last_done;  // tracked barriers only
  };
  bool present(const Group& g, const Member& m, const BarrierTag& at) const;
  std::map<uint8_t, Group> groups_;
  std::map<int, uint64_t> passed_;  // worker rank -> position it moved past
};

}  // namespace pushpull::cluster
