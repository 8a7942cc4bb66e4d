// SPDX-License-Identifier: Apache-2.0
// The negotiation tree (issue 38): announcements travel up a binomial tree
// to rank 0 and responses down it, so rank 0 exchanges O(log n) control
// messages per operation instead of 2(n - 1).
//
// The tree: the parent of rank r > 0 is r with its lowest set bit cleared;
// r's subtree is the ranks [r, subtree_end(r)). Every edge joins two ranks
// 2^k apart, which the sparse mesh connects at start-up (mesh_partners in
// tcp_transport_mesh.cpp: ranks 2^k away), so the tree opens no connection.
//
// Each rank but rank 0 runs a TreeAggregator over its subtree: a submission
// of a cached spec (an id of the response cache, which every rank holds
// identically and every rank's ancestors hold first, because responses come
// down the tree) is held until every member of the spec's process set in the
// subtree has submitted it or joined, then goes up as one entry. Uncached
// specs and joins go up at once, unchanged (first submissions, rare). A
// tensor whose submissions conflict (another id or an uncached spec under
// its name, a duplicate, a rank outside its set), or that is still partial
// after half the stall warning time (half the stall shutdown time when that
// is shorter), goes up rank by rank from then on, with how long it was held,
// so rank 0's Coordinator sees exactly which ranks submitted and when: its
// stall reports name the missing ranks and its error responses are those of
// the direct path. Rank 0 expands entries into per-rank submissions
// (deliver). A response passing down clears the tensors it names.
//
// Thread safety: none; owned and used by the engine thread. No I/O.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "collective/coordinator.h"
#include "collective/messages.h"

namespace pushpull::collective {

using transport::Clock;

// From this many ranks the engine negotiates over the tree. Up to 8 ranks
// (kFullMeshUpTo: every pair connected) the direct path stays: rank 0's 2(n - 1)
// messages cost less than the tree's extra hops there, and A/B runs on this
// project's 2-core machines could not tell the two apart at 4 and 8 ranks
// (docs/collectives.md, "Negotiation tree").
inline constexpr int kNegotiationTreeFrom = 9;

int tree_parent(int rank);            // -1 for rank 0
int subtree_end(int rank, int size);  // one past the subtree's last rank
std::vector<int> tree_children(int rank, int size);

class TreeAggregator {
 public:
  // `cache` must outlive the aggregator (the engine's response cache).
  TreeAggregator(int rank, int size, const CollectiveOptions& opts, const ResponseCache& cache);

  // This rank's own submissions and join.
  void submit(const Spec& spec, Clock::time_point now);
  void join(Clock::time_point now);
  // A child's message. ProtocolError: not a child, a rank outside its
  // subtree, an unknown cache id.
  void receive(int child, const Upward& up, Clock::time_point now);
  // Responses on their way down (before this rank executes them).
  void passed_down(const std::vector<Response>& rs);
  // What to send to the parent now (empty(): nothing); flushes tensors held
  // too long.
  Upward take(Clock::time_point now);
  // When take() next has something to flush.
  Clock::time_point next_deadline(Clock::time_point now) const;
  size_t held() const { return held_.size(); }

 private:
  struct Held {
    uint32_t id = kNoCacheId;  // kNoCacheId: an uncached spec went up under this name
    std::vector<bool> have;    // by rank - rank_
    Clock::time_point first;
    bool passing = false;  // submissions go up rank by rank
  };
  using Iter = std::map<std::string, Held>::iterator;
  void add(int r, uint32_t id, Clock::time_point since, Clock::time_point now);
  void pass(int r, uint32_t id, Clock::time_point since, Clock::time_point now);
  void flush(Iter it, Clock::time_point now);
  void settle(Iter it);
  void mark_joined(int r);
  bool mine(int r) const { return r >= rank_ && r < end_; }

  int rank_, size_, end_;
  Clock::duration hold_;
  const ResponseCache& cache_;
  std::map<std::string, Held> held_;
  std::vector<bool> joined_;  // by rank - rank_
  Upward out_;
};

// Rank 0: child `child`'s message as per-rank submissions and joins.
// ProtocolError: a rank outside the child's subtree, an unknown cache id.
void deliver(Coordinator& coordinator, const ResponseCache& cache, int child, int size,
             const Upward& up, Clock::time_point now);

}  // namespace pushpull::collective
