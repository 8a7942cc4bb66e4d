// SPDX-License-Identifier: Apache-2.0
#include "collective/hierarchical_view.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace pushpull::collective {

using transport::Completion;
using transport::run_posted;
using transport::Schedule;
using transport::Transport;

SubgroupTransport::SubgroupTransport(Transport& base, std::vector<int> members, bool streams)
    : base_(base), members_(std::move(members)) {
  for (size_t i = 0; i < members_.size(); ++i) {
    if (members_[i] < 0 || members_[i] >= base.size())
      throw InvalidArgument(fmt::format("collective: subgroup [{}] names rank {} of a group of {}",
                                        fmt::join(members_, ", "), members_[i], base.size()));
    if (members_[i] == base.rank()) rank_ = static_cast<int>(i);
  }
  if (rank_ < 0)
    throw InvalidArgument(fmt::format("collective: subgroup [{}] does not hold this rank {}",
                                      fmt::join(members_, ", "), base.rank()));
  // The base's path only when every pair of the subgroup has it (a
  // transport may have it for some peers only, e.g. not for those on
  // shared memory).
  direct_ = streams;
  for (size_t i = 0; direct_ && i < members_.size(); ++i)
    if (static_cast<int>(i) != rank_ && !base.runs_direct_to(members_[i])) direct_ = false;
}

SubgroupTransport::~SubgroupTransport() = default;

int SubgroupTransport::base_rank(int peer) const {
  if (peer < 0 || peer >= size())
    throw Internal(fmt::format("collective: sub-rank {} outside a subgroup of {}", peer, size()));
  return members_[static_cast<size_t>(peer)];
}

void SubgroupTransport::post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                                  Completion done) {
  base_.post_send(base_rank(peer), tag, data, bytes, std::move(done));
}

void SubgroupTransport::post_recv(int peer, uint64_t tag, void* dst, size_t bytes,
                                  Completion done) {
  base_.post_recv(base_rank(peer), tag, dst, bytes, std::move(done));
}

void SubgroupTransport::run(const Schedule& s) {
  if (!direct_) return run_posted(*this, s);
  Schedule b = s;
  for (auto& x : b.sends)
    x.peer = base_rank(x.peer);
  for (auto& x : b.recvs)
    x.peer = base_rank(x.peer);
  base_.run(b);
}

}  // namespace pushpull::collective
