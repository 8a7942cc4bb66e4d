// SPDX-License-Identifier: Apache-2.0
// The negotiation tree without threads or I/O (negotiation_tree.h): its
// shape, the aggregators of a whole job wired by hand to rank 0's real
// Coordinator on a manual clock, and the child-to-parent codec.
#include "collective/negotiation_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>

#include "transport/tcp/tcp_transport.h"

namespace pushpull::collective {

using transport::Clock;
using transport::mesh_partners;

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n)
    ++k;
  return k;
}

TEST(NegotiationTree, ShapeIsABinomialTree) {
  EXPECT_EQ(tree_children(0, 13), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(tree_children(8, 13), (std::vector<int>{9, 10, 12}));
  EXPECT_EQ(tree_children(4, 13), (std::vector<int>{5, 6}));
  EXPECT_EQ(tree_parent(12), 8);
  EXPECT_EQ(tree_parent(0), -1);
  EXPECT_EQ(subtree_end(4, 13), 8);
  EXPECT_EQ(subtree_end(8, 13), 13);
  for (int n : {2, 3, 5, 8, 13, 64, 100, 1024, 4096}) {
    std::vector<int> seen(static_cast<size_t>(n), 0);
    for (int r = 0; r < n; ++r)
      for (int c : tree_children(r, n)) {
        ++seen[static_cast<size_t>(c)];
        EXPECT_EQ(tree_parent(c), r);
        EXPECT_EQ(subtree_end(c, n) <= subtree_end(r, n), true);
      }
    EXPECT_EQ(seen[0], 0);
    for (int r = 1; r < n; ++r)
      EXPECT_EQ(seen[static_cast<size_t>(r)], 1) << "rank " << r << " of " << n;
    EXPECT_EQ(static_cast<int>(tree_children(0, n).size()), ceil_log2(n)) << n;
    for (int r = 1; r < n; ++r) {  // depth
      int d = 0;
      for (int x = r; x != 0; x = tree_parent(x))
        ++d;
      EXPECT_LE(d, ceil_log2(n));
    }
  }
}

TEST(NegotiationTree, EdgesAreMeshPartnersSoNoConnectionIsAdded) {
  for (int n : {9, 16, 33, 100, 257}) {
    for (int per_host : {1, 4}) {
      std::vector<std::string> hosts;
      for (int r = 0; r < n; ++r)
        hosts.push_back("h" + std::to_string(r / per_host));
      for (int r = 1; r < n; ++r) {
        const int p = tree_parent(r);
        auto mine = mesh_partners(r, hosts), theirs = mesh_partners(p, hosts);
        EXPECT_TRUE(std::binary_search(mine.begin(), mine.end(), p)) << r << " of " << n;
        EXPECT_TRUE(std::binary_search(theirs.begin(), theirs.end(), r)) << r << " of " << n;
      }
    }
  }
}

// A job's negotiation without threads: rank 0's Coordinator, an aggregator
// on every other rank, one response cache (every rank's is identical), and
// the messages rank 0 receives counted.
struct World {
  int n;
  CollectiveOptions opts;
  ResponseCache cache;
  Coordinator coordinator;
  std::vector<std::unique_ptr<TreeAggregator>> aggs;
  int root_received = 0;
  std::vector<StallReport> stalls;
  Clock::time_point t0 = Clock::time_point(seconds(1000));

  World(int n_, CollectiveOptions o) : n(n_), opts(o), coordinator(n_, o, cache) {
    aggs.resize(static_cast<size_t>(n));
    for (int r = 1; r < n; ++r)
      aggs[static_cast<size_t>(r)] = std::make_unique<TreeAggregator>(r, n, opts, cache);
  }
  Clock::time_point at(double s) const {
    return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  void submit(int r, const Spec& s, double t = 0) {
    if (r == 0)
      coordinator.submit(0, s, at(t));
    else
      aggs[static_cast<size_t>(r)]->submit(s, at(t));
  }
  void join(int r, double t = 0) {
    if (r == 0)
      coordinator.join(0, at(t));
    else
      aggs[static_cast<size_t>(r)]->join(at(t));
  }
  // Every rank sends what it has; children (higher ranks) first, so one
  // pass carries everything to rank 0.
  void pump(double t = 0) {
    for (int r = n - 1; r >= 1; --r) {
      Upward up = aggs[static_cast<size_t>(r)]->take(at(t));
      if (up.empty()) continue;
      Upward wire = decode_upward(encode(up), n);  // through the real codec
      const int p = tree_parent(r);
      if (p == 0) {
        ++root_received;
        deliver(coordinator, cache, r, n, wire, at(t));
      } else {
        aggs[static_cast<size_t>(p)]->receive(r, wire, at(t));
      }
    }
  }
  std::vector<Response> poll(double t = 0) {
    pump(t);
    auto rs = coordinator.poll(at(t), &stalls);
    for (int r = 1; r < n; ++r)
      aggs[static_cast<size_t>(r)]->passed_down(rs);
    return rs;
  }
  // Every listed rank submits `s`, then rank 0 answers.
  std::vector<Response> round(const Spec& s, const std::vector<int>& ranks, double t = 0) {
    for (int r : ranks)
      submit(r, s, t);
    return poll(t);
  }
};

std::vector<int> all(int n) {
  std::vector<int> v;
  for (int r = 0; r < n; ++r)
    v.push_back(r);
  return v;
}

Spec spec(std::string name, int64_t len = 4, std::vector<int32_t> members = {}) {
  Spec s;
  s.name = std::move(name);
  s.shape = Shape{len};
  s.members = std::move(members);
  return s;
}

TEST(NegotiationTree, RepeatsReachRankZeroAsOneEntryPerChild) {
  World w(8, CollectiveOptions{});
  auto first = w.round(spec("a"), all(8));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].kind, Response::Kind::kExecute);
  EXPECT_EQ(w.root_received, 3);  // first submissions: one message per child too
  w.root_received = 0;
  // The repeat: rank 4 holds its subtree's id until 5, 6 and 7 submitted.
  for (int r : {0, 1, 2, 3, 4, 5, 6})
    w.submit(r, spec("a"));
  EXPECT_TRUE(w.poll().empty());
  EXPECT_EQ(w.root_received, 2);  // ranks 1 and 2 (with 3); 4 waits for 7
  EXPECT_EQ(w.aggs[4]->held(), 1u);
  EXPECT_EQ(w.aggs[6]->held(), 1u);
  w.submit(7, spec("a"));
  w.aggs[6]->receive(7, w.aggs[7]->take(w.at(0)), w.at(0));
  Upward from6 = w.aggs[6]->take(w.at(0));
  ASSERT_EQ(from6.cached.size(), 1u);
  EXPECT_TRUE(from6.cached[0].whole);
  EXPECT_TRUE(from6.cached[0].ranks.empty());
  w.aggs[4]->receive(6, from6, w.at(0));
  Upward from4 = w.aggs[4]->take(w.at(0));
  ASSERT_EQ(from4.cached.size(), 1u);
  EXPECT_TRUE(from4.specs.empty());
  EXPECT_TRUE(from4.cached[0].whole);
  deliver(w.coordinator, w.cache, 4, 8, from4, w.at(0));
  auto rs = w.poll();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kExecute);
  EXPECT_TRUE(rs[0].joined.empty());
  EXPECT_EQ(rs[0].tensors[0].name, "a");
  EXPECT_FALSE(rs[0].tensors[0].has_spec);  // from the cache
  for (int r = 1; r < 8; ++r)
    EXPECT_EQ(w.aggs[static_cast<size_t>(r)]->held(), 0u) << r;
}

TEST(NegotiationTree, JoinedRanksCountAsSubmittedUntilJoinDone) {
  World w(8, CollectiveOptions{});
  w.round(spec("a"), all(8));
  w.join(5);
  w.join(7);
  auto rs = w.round(spec("a"), {0, 1, 2, 3, 4, 6});
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kExecute);
  EXPECT_EQ(rs[0].joined, (std::vector<int32_t>{5, 7}));
  for (int r : {0, 1, 2, 3, 4, 6})
    w.join(r);
  rs = w.poll();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kJoinDone);
  // After the join completed nobody counts as joined: rank 7 is awaited.
  EXPECT_TRUE(w.round(spec("a"), {0, 1, 2, 3, 4, 5, 6}).empty());
  w.submit(7, spec("a"));
  rs = w.poll();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_TRUE(rs[0].joined.empty());
}

TEST(NegotiationTree, ProcessSetWaitsForItsMembersOnly) {
  World w(8, CollectiveOptions{});
  const std::vector<int32_t> members{0, 3, 5, 6};
  ASSERT_EQ(w.round(spec("s", 4, members), {0, 3, 5, 6}).size(), 1u);
  w.root_received = 0;
  for (int r : {0, 3, 5})
    w.submit(r, spec("s", 4, members));
  EXPECT_TRUE(w.poll().empty());  // 4 holds 5's until 6 submits
  EXPECT_EQ(w.root_received, 1);  // 2 sent 3's
  w.submit(6, spec("s", 4, members));
  auto rs = w.poll();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kExecute);
  EXPECT_EQ(rs[0].joined, (std::vector<int32_t>{1, 2, 4, 7}));  // non-members relay
  EXPECT_EQ(w.root_received, 2);                                // nothing from rank 1's subtree
}

TEST(NegotiationTree, StallReportNamesTheRanksMissingBelowAnAggregator) {
  CollectiveOptions o;
  o.stall_warning_seconds = 10;
  World w(8, o);
  w.round(spec("a"), all(8));
  for (int r : {0, 1, 2, 3, 4, 5})
    w.submit(r, spec("a"));
  EXPECT_TRUE(w.poll(0).empty());
  EXPECT_EQ(w.aggs[4]->next_deadline(w.at(0)), w.at(5));  // half the warning time
  EXPECT_TRUE(w.poll(5).empty());  // 4 gives up holding: 4 and 5 go up by rank
  EXPECT_TRUE(w.stalls.empty());   // not yet 10 s
  EXPECT_TRUE(w.poll(9.9).empty());
  EXPECT_TRUE(w.stalls.empty());
  EXPECT_TRUE(w.poll(10).empty());
  ASSERT_EQ(w.stalls.size(), 1u);
  EXPECT_EQ(w.stalls[0].tensor, "a");
  EXPECT_EQ(w.stalls[0].missing_ranks, (std::vector<int>{6, 7}));
  EXPECT_NEAR(w.stalls[0].waited_seconds, 10, 0.01);
  w.submit(7, spec("a"), 11);
  w.submit(6, spec("a"), 12);
  auto rs = w.poll(12);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kExecute);
}

TEST(NegotiationTree, StallShutdownFailsATensorHeldBelowRankZero) {
  CollectiveOptions o;
  o.stall_warning_seconds = 60;
  o.stall_shutdown_seconds = 4;
  World w(8, o);
  w.round(spec("a"), all(8));
  // Only ranks of 4's subtree submit: rank 0 hears of it from 4 alone.
  for (int r : {4, 5, 6})
    w.submit(r, spec("a"));
  EXPECT_TRUE(w.poll(0).empty());
  EXPECT_TRUE(w.poll(2).empty());  // held half the shutdown time, then up by rank
  auto rs = w.poll(4);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kError);
  EXPECT_EQ(rs[0].code, ErrorCode::kTimeout);
  EXPECT_NE(rs[0].message.find("[0, 1, 2, 3, 7]"), std::string::npos) << rs[0].message;
  EXPECT_EQ(w.aggs[4]->held(), 0u);  // the error cleared it on the way down
}

TEST(NegotiationTree, AConflictingSubmissionIsAnErrorAtOnce) {
  World w(8, CollectiveOptions{});
  w.round(spec("a"), all(8));
  for (int r : {0, 1, 2, 3, 4, 6, 7})
    w.submit(r, spec("a"));
  w.submit(5, spec("a", 5));  // another shape: uncached, under the same name
  auto rs = w.poll(0);        // no waiting for a timer
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kError);
  EXPECT_EQ(rs[0].code, ErrorCode::kInvalidArgument);
  EXPECT_NE(rs[0].message.find("rank 5: allreduce float32(5)"), std::string::npos) << rs[0].message;
  EXPECT_NE(rs[0].message.find("rank 7: allreduce float32(4)"), std::string::npos) << rs[0].message;
}

TEST(NegotiationTree, ABadChildIsAProtocolError) {
  World w(8, CollectiveOptions{});
  w.round(spec("a"), all(8));
  Upward bad;
  bad.joins = {3};
  EXPECT_THROW(w.aggs[4]->receive(6, bad, w.at(0)), ProtocolError);       // 3 is not below 6
  EXPECT_THROW(w.aggs[4]->receive(3, Upward{}, w.at(0)), ProtocolError);  // not a child
  EXPECT_THROW(deliver(w.coordinator, w.cache, 3, 8, Upward{}, w.at(0)), ProtocolError);
  Upward unknown;
  unknown.cached.push_back(UpCached{77, true, 0, {}});
  EXPECT_THROW(deliver(w.coordinator, w.cache, 4, 8, unknown, w.at(0)), ProtocolError);
  Upward outside;
  outside.specs.push_back(UpSpec{2, spec("b")});
  EXPECT_THROW(deliver(w.coordinator, w.cache, 4, 8, outside, w.at(0)), ProtocolError);
}

TEST(NegotiationTree, UpwardCodecRoundTripsAndRejectsBadInput) {
  Upward u;
  u.specs.push_back(UpSpec{5, spec("x", 3, {1, 5})});
  u.cached.push_back(UpCached{7, true, 0, {6}});
  u.cached.push_back(UpCached{9, false, 1234, {4, 5}});
  u.joins = {6};
  std::string bytes = encode(u);
  Upward back = decode_upward(bytes, 8);
  ASSERT_EQ(back.specs.size(), 1u);
  EXPECT_EQ(back.specs[0].rank, 5);
  EXPECT_EQ(back.specs[0].spec, u.specs[0].spec);
  ASSERT_EQ(back.cached.size(), 2u);
  EXPECT_EQ(back.cached[1].held_ms, 1234u);
  EXPECT_EQ(back.cached[1].ranks, (std::vector<int32_t>{4, 5}));
  EXPECT_FALSE(back.cached[1].whole);
  EXPECT_EQ(back.joins, std::vector<int32_t>{6});
  for (size_t cut = 0; cut < bytes.size(); ++cut)
    EXPECT_THROW(decode_upward(bytes.substr(0, cut), 8), ProtocolError) << cut;
  EXPECT_THROW(decode_upward(bytes + "x", 8), ProtocolError);
  EXPECT_THROW(decode_upward(bytes, 6), ProtocolError);  // rank 6 of 6
}

}  // namespace
}  // namespace pushpull::collective
