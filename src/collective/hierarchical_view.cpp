// SPDX-License-Identifier: Apache-2.0
#include "collective/hierarchical_view.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace pushpull::collective {

// The base's direct streams with sub-ranks translated to base ranks.
class SubgroupTransport::Streams final : public DirectStreams {
 public:
  Streams(const SubgroupTransport& view, DirectStreams& base) : view_(view), base_(base) {}
  int rank() const override { return view_.rank(); }
  int stream_fd(int peer) const override { return base_.stream_fd(view_.base_rank(peer)); }
  net::TlsLink* stream_tls(int peer) const override {
    return base_.stream_tls(view_.base_rank(peer));
  }
  std::unique_lock<std::mutex> lock_streams() override { return base_.lock_streams(); }
  bool is_closed() const override { return base_.is_closed(); }
  Status stream_error(int peer, const std::string& why, ErrorCode code) override {
    return base_.stream_error(view_.base_rank(peer), why, code);
  }
  WorkerThread& writer_thread() override { return base_.writer_thread(); }
  WorkerThread& reader_thread() override { return base_.reader_thread(); }

 private:
  const SubgroupTransport& view_;
  DirectStreams& base_;
};

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
  // Streams only when every pair of the subgroup has one (a transport may
  // have them for some peers only, e.g. not for those on shared memory).
  DirectStreams* s = streams ? base.direct_streams() : nullptr;
  for (size_t i = 0; s && i < members_.size(); ++i)
    if (static_cast<int>(i) != rank_ && s->stream_fd(members_[i]) < 0) s = nullptr;
  if (s) streams_ = std::make_unique<Streams>(*this, *s);
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

DirectStreams* SubgroupTransport::direct_streams() {
  return streams_.get();
}

}  // namespace pushpull::collective
