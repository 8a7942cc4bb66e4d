// SPDX-License-Identifier: Apache-2.0
// The collectives' partial mesh (tcp_transport.h): start-up connects only the
// algorithms' partners (O(log n) per rank), the algorithms run on those
// links alone, every other pair connects on first use from either side, and
// a lazy connection to a rank that is gone is a PeerFailure naming it.
// Ranks are threads on loopback, each on its own 127.0.0.x "host".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "collective/algorithms.h"
#include "harness.h"
#include "tcp_group.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::collective {

using transport::Clock;
using transport::irecv;
using transport::isend;
using transport::kMaxLocalMesh;
using transport::mesh_partners;
using transport::Request;
using transport::TcpTransport;

namespace {

using namespace std::chrono_literals;
using pushpull::collective::testing::outcome;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void close_all(std::vector<std::unique_ptr<TcpTransport>>& ts) {
  for (auto& t : ts)
    if (t) t->close(Status(ErrorCode::kInternal, "test over"));
}

TEST(MeshPartners, SymmetricAndLogarithmic) {
  for (int n : {1, 2, 3, 5, 6, 7, 8, 9, 12, 20, 33, 64, 100, 1024}) {
    // One host with more ranks than kMaxLocalMesh: the algorithms' partners only.
    std::vector<std::string> hosts(static_cast<size_t>(n), "h");
    std::vector<std::set<int>> of(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      auto p = mesh_partners(r, hosts);
      of[static_cast<size_t>(r)] = {p.begin(), p.end()};
      EXPECT_FALSE(of[static_cast<size_t>(r)].count(r));
      if (n > 1) {
        EXPECT_TRUE(of[static_cast<size_t>(r)].count((r + 1) % n)) << n << " " << r;
        EXPECT_TRUE(of[static_cast<size_t>(r)].count((r + n - 1) % n)) << n << " " << r;
      }
      if (n > kMaxLocalMesh) {
        const int log2n = static_cast<int>(std::ceil(std::log2(n)));
        EXPECT_LE(static_cast<int>(p.size()), 3 * log2n + 1) << n << " " << r;
      }
    }
    for (int r = 0; r < n; ++r)
      for (int q : of[static_cast<size_t>(r)])
        EXPECT_TRUE(of[static_cast<size_t>(q)].count(r)) << n << ": " << r << " -> " << q;
  }
  // A small host's ranks are all connected; another host's are not.
  std::vector<std::string> two(8, std::string("a"));
  two.resize(40, std::string("b"));
  auto p = mesh_partners(0, two);
  for (int r = 1; r < 8; ++r)
    EXPECT_TRUE(std::count(p.begin(), p.end(), r)) << r;
  EXPECT_FALSE(std::count(p.begin(), p.end(), 9));
}

// Every subgroup of the hierarchical allreduce (a host's ranks, the ranks of
// one local index across hosts) is either fully connected or every member
// misses a pair, so its members agree on the streams; uniform layouts have
// both subgroups fully connected.
TEST(MeshPartners, HierarchicalSubgroupsAreCliques) {
  for (auto [hosts_n, local] : {std::pair{4, 2}, {8, 4}, {3, 20}, {16, 8}, {2, 17}}) {
    const int n = hosts_n * local;
    std::vector<std::string> hosts;
    for (int r = 0; r < n; ++r)
      hosts.push_back(fmt::format("h{}", r / local));
    std::vector<std::set<int>> of(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      auto p = mesh_partners(r, hosts);
      of[static_cast<size_t>(r)] = {p.begin(), p.end()};
    }
    for (int r = 0; r < n; ++r) {
      for (int q = 0; q < n; ++q) {
        if (q == r || (q / local != r / local && q % local != r % local)) continue;
        EXPECT_TRUE(of[static_cast<size_t>(r)].count(q))
            << hosts_n << "x" << local << ": " << r << " -> " << q;
      }
    }
  }
  // One host, or one rank per host (a forced hierarchy: one subgroup of
  // everyone): fully connected, or every rank misses someone.
  for (int n = 2; n <= 200; ++n) {
    int complete = 0;
    std::vector<std::string> hosts;
    for (int r = 0; r < n; ++r)
      hosts.push_back(fmt::format("h{}", r));
    for (int r = 0; r < n; ++r)
      complete += static_cast<int>(mesh_partners(r, hosts).size()) == n - 1 ? 1 : 0;
    EXPECT_TRUE(complete == 0 || complete == n) << n << ": " << complete;
  }
}

// The ring, halving-doubling, broadcast from every root and the barrier over
// 20 ranks open no connection beyond the start-up ones.
TEST(Mesh, TheAlgorithmsUseOnlyTheStartupLinks) {
  const int n = 20;
  const auto hosts = testing::distinct_loopback_hosts(n);
  auto ts = testing::connect_tcp_group_on(hosts);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ts[static_cast<size_t>(r)]->connected_peers(),
              static_cast<int>(mesh_partners(r, hosts).size()))
        << r;
    EXPECT_LT(ts[static_cast<size_t>(r)]->connected_peers(), n - 1) << r;
  }
  std::vector<int> before;
  for (auto& t : ts)
    before.push_back(t->connected_peers());
  std::vector<std::vector<float>> big(n), small(n);
  std::vector<std::vector<uint8_t>> bcast(n);
  testing::on_threads(n, [&](int r) {
    std::vector<char> scratch;
    AlgoContext ctx{*ts[static_cast<size_t>(r)]};
    ctx.scratch = &scratch;
    ctx.ring_segment_bytes = 32 << 10;
    ctx.small_allreduce_bytes = 4096;
    auto& b = big[static_cast<size_t>(r)];
    b.assign(50000, static_cast<float>(r));
    ctx.op_id = 1;
    ring_allreduce(ctx, b.data(), b.size(), DType::kFloat32, ReduceOp::kSum);
    auto& s = small[static_cast<size_t>(r)];
    s.assign(64, static_cast<float>(r + 1));
    ctx.op_id = 2;
    halving_doubling_allreduce(ctx, s.data(), s.size(), DType::kFloat32, ReduceOp::kSum);
    auto& c = bcast[static_cast<size_t>(r)];
    for (int root = 0; root < n; ++root) {
      c.assign(3000, static_cast<uint8_t>(r == root ? root + 7 : 0));
      ctx.op_id = 10 + static_cast<uint64_t>(root);
      broadcast(ctx, c.data(), c.size(), root);
      ASSERT_EQ(c[2999], static_cast<uint8_t>(root + 7)) << "root " << root << " rank " << r;
    }
    ctx.op_id = 100;
    barrier(ctx);
  });
  const float ring_sum = static_cast<float>(n * (n - 1) / 2), hd_sum = ring_sum + n;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(big[static_cast<size_t>(r)][49999], ring_sum) << r;
    EXPECT_EQ(small[static_cast<size_t>(r)][63], hd_sum) << r;
    EXPECT_EQ(ts[static_cast<size_t>(r)]->connected_peers(), before[static_cast<size_t>(r)])
        << "rank " << r << " opened a connection the algorithms should not need";
  }
  close_all(ts);
}

// Every pair exchanges a message, both ways at once: the pairs that were not
// connected connect on first use, whichever side posts first.
TEST(Mesh, OtherPairsConnectOnFirstUse) {
  const int n = 12;
  auto ts = testing::connect_tcp_group_on(testing::distinct_loopback_hosts(n));
  std::vector<std::vector<uint64_t>> got(n, std::vector<uint64_t>(n, 0));
  testing::on_threads(n, [&](int r) {
    std::vector<uint64_t> mine(n);
    std::vector<Request> reqs;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      mine[static_cast<size_t>(q)] = static_cast<uint64_t>(1000 * r + q);
      // Lower ranks send first, higher ones receive first: both orders of use.
      if (r < q) reqs.push_back(isend(*ts[static_cast<size_t>(r)], q, 5, &mine[q], 8));
      reqs.push_back(irecv(*ts[static_cast<size_t>(r)], q, 5, &got[r][q], 8));
      if (r > q) reqs.push_back(isend(*ts[static_cast<size_t>(r)], q, 5, &mine[q], 8));
    }
    for (auto& req : reqs)
      req.wait(Clock::now() + 20s, "all pairs");
  });
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      if (q != r) {
        EXPECT_EQ(got[r][q], static_cast<uint64_t>(1000 * q + r)) << r << " " << q;
      }
    }
    EXPECT_EQ(ts[static_cast<size_t>(r)]->connected_peers(), n - 1) << r;
  }
  close_all(ts);
}

// Rank 3 of 12 is gone. Rank 6 (higher, not a partner: it dials) and rank 0
// (lower, not a partner: it asks rank 3 to dial) both fail naming rank 3
// within the lazy deadline (the connect timeout, 2 s here).
TEST(Mesh, ALazyConnectionToAGoneRankIsAPeerFailureNamingIt) {
  const int n = 12;
  const auto hosts = testing::distinct_loopback_hosts(n);
  for (int r : {0, 6}) {
    auto p = mesh_partners(r, hosts);
    ASSERT_EQ(std::count(p.begin(), p.end(), 3), 0) << r;
  }
  auto ts = testing::connect_tcp_group_on(hosts, 2000ms);
  ts[3]->close(Status(ErrorCode::kInternal, "gone"));
  uint64_t v = 1, w = 0;
  Request from_higher = isend(*ts[6], 3, 9, &v, sizeof v);
  Request from_lower = irecv(*ts[0], 3, 9, &w, sizeof w);
  for (const Request* r : {&from_higher, &from_lower}) {
    Status st = outcome(*r);
    EXPECT_EQ(st.code(), ErrorCode::kPeerFailure) << st.to_string();
    EXPECT_TRUE(contains(st.message(), "rank 3 (host 127.0.0.4:")) << st.message();
  }
  // The other pairs still work.
  uint64_t x = 5, y = 0;
  Request rv = irecv(*ts[1], 7, 11, &y, sizeof y);
  Request sd = isend(*ts[7], 1, 11, &x, sizeof x);
  EXPECT_TRUE(outcome(rv).is_ok());
  EXPECT_TRUE(outcome(sd).is_ok());
  EXPECT_EQ(y, 5u);
  close_all(ts);
}

}  // namespace
}  // namespace pushpull::collective
