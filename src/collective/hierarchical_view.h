// SPDX-License-Identifier: Apache-2.0
// A sub-group of a Transport seen as a Transport of its own, so the flat
// algorithms (ring, halving-doubling) run unchanged among some ranks of a
// group: the ranks of one host, or the j-th rank of every host
// (hierarchical.h). Sub-rank i is members[i] of the base transport; peers
// and tags pass through (the algorithms' op_tag keeps operations apart, and
// messages with one (peer, tag) match in order, so phases of one operation
// that run one after the other on a pair of ranks cannot mix).
//
// With `streams`, run() hands a schedule (peers translated) to the base's
// run() when the base reaches every pair of the subgroup on a path of its
// own (Transport::runs_direct_to: the TCP mesh's direct streams); without,
// or when some pair has none, schedules run with post_send/post_recv, so
// that another thread may drive the streams meanwhile (the pipelined
// hierarchical allreduce gives the streams to the host's phases when the
// host's pairs have them, else to the cross-host phase, and runs the other
// beside it: hierarchical.cpp).
//
// Ownership: a view borrows the base and must not outlive it; close() and
// abort() act on the whole base transport (a failure is fatal to the group).
// Thread safety: as the base's (every method may be called concurrently).
#pragma once

#include <string>
#include <vector>

#include "transport/transport.h"

namespace pushpull::collective {

using transport::Completion;
using transport::Schedule;
using transport::Transport;

class SubgroupTransport final : public Transport {
 public:
  // `members`: base ranks, distinct, including the base's own rank.
  SubgroupTransport(Transport& base, std::vector<int> members, bool streams);
  ~SubgroupTransport() override;
  SubgroupTransport(const SubgroupTransport&) = delete;
  SubgroupTransport& operator=(const SubgroupTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  void post_send(int peer, uint64_t tag, const void* data, size_t bytes, Completion done) override;
  void post_recv(int peer, uint64_t tag, void* dst, size_t bytes, Completion done) override;
  void close(const Status& reason) override { base_.close(reason); }
  void abort(const Status& why) override { base_.abort(why); }
  void run(const Schedule& s) override;
  bool runs_direct_to(int peer) const override { return direct_ && peer != rank_; }
  // Whether run() takes the base's own path (see above).
  bool direct() const { return direct_; }

  // The base rank of sub-rank `peer`.
  int base_rank(int peer) const;
  const std::vector<int>& members() const { return members_; }

 private:
  Transport& base_;
  std::vector<int> members_;
  int rank_ = -1;
  bool direct_ = false;
};

}  // namespace pushpull::collective
