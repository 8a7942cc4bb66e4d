// SPDX-License-Identifier: Apache-2.0
// The repeat over the negotiation tree (scale_collective.h): after the
// cached announcement went straight to rank 0, every rank announces it again
// through its real TreeAggregator (collective/negotiation_tree.h), each
// message in its real encoding over the tree's edges, rank 0's real
// Coordinator answers, and each rank forwards the response to its children
// as the engine does (engine.cpp on_tree_message).
#include "sim/scale_collective.h"

namespace pushpull::sim::scale::detail {
namespace {
collective::Clock::time_point tp_of(uint64_t us) {
  return collective::Clock::time_point(std::chrono::microseconds(us));
}
}  // namespace

void CollectiveWorld::tree_round() {
  tree_start_ = net_.now();
  const auto tp = tp_of(net_.now());
  aggs_.resize(static_cast<size_t>(n_));
  for (int r = 1; r < n_; ++r)
    aggs_[static_cast<size_t>(r)] =
        std::make_unique<collective::TreeAggregator>(r, n_, CollectiveOptions{}, cache_);
  const collective::Spec* spec = cache_.get(cache_id_);
  if (!spec) return fail_run("the repeat is not in the response cache");
  for (int r = n_ - 1; r >= 1; --r) {
    aggs_[static_cast<size_t>(r)]->submit(*spec, tp);
    tree_flush(r);
  }
  coordinator_.submit_cached(0, cache_id_, tp);
  tree_poll();
}

void CollectiveWorld::tree_flush(int r) {
  collective::Upward up = aggs_[static_cast<size_t>(r)]->take(tp_of(net_.now()));
  if (up.empty()) return;
  auto bytes = std::make_shared<const std::string>(collective::encode(up));
  const int p = collective::tree_parent(r);
  if (p == 0) {
    ++tree_hub_messages_;
    tree_hub_bytes_ += static_cast<double>(kHeader + bytes->size());
  }
  net_.send(r, p, kHeader + bytes->size(), [this, r, p, bytes] {
    collective::Upward got;
    if (!collective::decode_upward(std::as_bytes(std::span(*bytes)), n_, &got))
      return fail_run("a tree announcement does not decode");
    const auto now = tp_of(net_.now());
    if (p == 0) {
      collective::deliver(coordinator_, cache_, r, n_, got, now);
      return tree_poll();
    }
    aggs_[static_cast<size_t>(p)]->receive(r, got, now);
    tree_flush(p);
  });
}

void CollectiveWorld::tree_poll() {
  std::vector<collective::StallReport> stalls;
  auto rs = coordinator_.poll(tp_of(net_.now()), &stalls);
  if (rs.empty()) return;  // more subtrees to come
  if (rs.size() != 1 || rs[0].tensors.size() != 1 || rs[0].tensors[0].has_spec)
    return fail_run("the coordinator did not answer the tree's repeat with one cached allreduce");
  tree_down(0, std::make_shared<const std::string>(collective::encode(rs)));
}

void CollectiveWorld::tree_down(int r, const std::shared_ptr<const std::string>& bytes) {
  for (int c : collective::tree_children(r, n_)) {
    if (r == 0) {
      ++tree_hub_messages_;
      tree_hub_bytes_ += static_cast<double>(kHeader + bytes->size());
    }
    net_.send(r, c, kHeader + bytes->size(), [this, c, bytes] {
      auto got = collective::decode_responses(*bytes, n_);
      if (got.size() != 1) return fail_run("a tree response does not decode");
      aggs_[static_cast<size_t>(c)]->passed_down(got);
      tree_down(c, bytes);
    });
  }
  if (++tree_got_ == n_) {
    tree_end_ = net_.now();
    second_done_ = true;
  }
}

}  // namespace pushpull::sim::scale::detail
