// SPDX-License-Identifier: Apache-2.0
// Mixed placement (ps/server_shares.h): the weights each layout gets, and the
// slices those weights cut.
#include "ps/server_shares.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "ps/placement.h"
#include "pushpull/error.h"

namespace pushpull::ps {
namespace {

using cluster::AddressBook;
using cluster::NodeAddress;
using pushpull::Role;

AddressBook book(const std::vector<std::string>& workers, const std::vector<std::string>& servers) {
  AddressBook b;
  for (size_t i = 0; i < workers.size(); ++i)
    b.workers.push_back({Role::kWorker, static_cast<int32_t>(i), workers[i], 9000});
  for (size_t i = 0; i < servers.size(); ++i)
    b.servers.push_back({Role::kServer, static_cast<int32_t>(i), servers[i], 9100});
  return b;
}

// A worker host's link and a spare host's carry the same bytes per direction
// with BytePS's fraction: a M + 2(1-a)(n-1)M/n == n a M / k.
TEST(ServerShares, SpareFractionBalancesBothKindsOfLink) {
  for (int n : {2, 4, 8, 16})
    for (int k : {1, 2, 4, 8}) {
      const double a = spare_host_fraction(n, k);
      ASSERT_GT(a, 0);
      if (k >= n) {
        // The spare hosts take everything and their links are not the limit.
        EXPECT_EQ(a, 1);
        EXPECT_LE(double(n) / k, 1.0);
        continue;
      }
      ASSERT_LT(a, 1);
      const double worker_link = a + 2 * (1 - a) * (n - 1) / n;
      const double spare_link = n * a / k;
      EXPECT_NEAR(worker_link, spare_link, 1e-12) << n << " workers, " << k << " spare";
      // Its time is BytePS's bound, below the ring's and the dedicated servers'.
      const double bound = 2.0 * n * (n - 1) / (n * n + k * n - 2.0 * k);
      EXPECT_NEAR(spare_link, bound, 1e-12);
      EXPECT_LT(bound, 2.0 * (n - 1) / n + 1e-12);
      EXPECT_LE(bound, std::max(1.0, double(n) / k) + 1e-12);
    }
  EXPECT_EQ(spare_host_fraction(1, 2), 0);
  EXPECT_EQ(spare_host_fraction(4, 0), 0);
}

TEST(ServerShares, EqualUnlessBothKindsOfServerHost) {
  // All dedicated, all co-located, one host: equal shares (an empty vector).
  EXPECT_TRUE(server_weights("auto", book({"a", "b"}, {"s", "t"})).empty());
  EXPECT_TRUE(server_weights("auto", book({"a", "b"}, {"a", "b"})).empty());
  EXPECT_TRUE(server_weights("auto", book({"h", "h"}, {"h", "h", "h"})).empty());
  EXPECT_TRUE(server_weights("equal", book({"a", "b"}, {"s", "a", "b"})).empty());
}

TEST(ServerShares, AutoGivesSpareHostsBytePSsShare) {
  // 4 worker hosts, 2 spare hosts; the spare servers first, as the launcher
  // and the benchmarks order them, but the order does not matter.
  auto w = server_weights("auto", book({"a", "b", "c", "d"}, {"a", "s", "b", "t", "c", "d"}));
  ASSERT_EQ(w.size(), 6u);
  const double a = spare_host_fraction(4, 2);
  EXPECT_NEAR(w[1], a / 2, 1e-12);
  EXPECT_NEAR(w[3], a / 2, 1e-12);
  for (size_t i : {0u, 2u, 4u, 5u})
    EXPECT_NEAR(w[i], (1 - a) / 4, 1e-12);
  EXPECT_NEAR(std::accumulate(w.begin(), w.end(), 0.0), 1.0, 1e-12);
  // Two servers on one spare host split its share.
  auto two = server_weights("auto", book({"a", "b"}, {"s", "s", "a", "b"}));
  ASSERT_EQ(two.size(), 4u);
  EXPECT_NEAR(two[0], spare_host_fraction(2, 1) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(two[0], two[1]);
}

TEST(ServerShares, ExplicitWeightsAreCheckedAndUsed) {
  auto b = book({"a", "b"}, {"a", "b", "s"});
  EXPECT_EQ(server_weights("2,1,1", b), (std::vector<double>{2, 1, 1}));
  EXPECT_EQ(server_weights("0.5,0.25,1e-1", b), (std::vector<double>{0.5, 0.25, 0.1}));
  for (const char* bad :
       {"1,1", "1,1,1,1", "1,,1", "1,0,1", "1,-1,1", "1,x,1", "1,1,1,", "nan,1,1", "inf,1,1", ""})
    EXPECT_THROW(server_weights(bad, b), InvalidArgument) << "'" << bad << "'";
}

// Each server's links get buffers by the square root of its share relative
// to an equal one: with 8 workers and 4 spare hosts a spare host's flows
// carry 3.5x the bytes of a worker host's server's (0.159 vs 0.045 of every
// value), and get sqrt(3.5) = 1.87x the buffer (ps/server_shares.h: why the
// root).
TEST(ServerShares, LinkScalesFollowTheShares) {
  std::vector<std::string> workers, servers{"s1", "s2", "s3", "s4"};
  for (int i = 0; i < 8; ++i) {
    workers.push_back(fmt::format("w{}", i));
    servers.push_back(fmt::format("w{}", i));
  }
  auto scale = link_scales(server_weights("auto", book(workers, servers)));
  ASSERT_EQ(scale.size(), 12u);
  const double a = spare_host_fraction(8, 4);
  for (size_t i = 0; i < 12; ++i)
    EXPECT_NEAR(scale[i], std::sqrt(12 * (i < 4 ? a / 4 : (1 - a) / 8)), 1e-9) << i;
  EXPECT_NEAR(scale[0] / scale[4], std::sqrt(3.5), 1e-9);
  // Equal shares change nothing; explicit lists scale by weight, within 1/8..8.
  EXPECT_TRUE(link_scales({}).empty());
  EXPECT_EQ(link_scales({2, 2}), (std::vector<double>{1, 1}));
  EXPECT_EQ(link_scales({2, 0.5, 0.5, 1}),
            (std::vector<double>{std::sqrt(2.0), std::sqrt(0.5), std::sqrt(0.5), 1}));
  auto lopsided = link_scales({1e6, 1, 1});
  ASSERT_EQ(lopsided.size(), 3u);
  EXPECT_NEAR(lopsided[0], std::sqrt(3e6 / (1e6 + 2)), 1e-12);
  EXPECT_EQ(lopsided[1], 0.125) << "clamped: a tiny window would stall that flow";
  EXPECT_EQ(lopsided[2], 0.125);
}

// Weighted slices tile the value in order, in proportion to the weights, and
// every worker cuts the same ones.
TEST(ServerShares, WeightedSlicesTileTheValue) {
  const std::vector<double> w{3, 1, 0, 2};
  for (int64_t numel : {int64_t{65536}, int64_t{65537}, int64_t{1000003}, int64_t{1} << 26}) {
    auto slices = place(5, numel, 4, 65536, w);
    int64_t at = 0;
    for (const Slice& s : slices) {
      EXPECT_EQ(s.begin, at);
      EXPECT_GT(s.count, 0);
      EXPECT_NE(s.server, 2) << "a zero weight gets no slice";
      EXPECT_NEAR(double(s.count) / double(numel), w[size_t(s.server)] / 6,
                  1.0 / double(numel) + 1e-12);
      at += s.count;
    }
    EXPECT_EQ(at, numel);
    auto again = place(5, numel, 4, 65536, w);
    ASSERT_EQ(again.size(), slices.size());
    for (size_t i = 0; i < slices.size(); ++i)
      EXPECT_EQ(again[i].begin, slices[i].begin);
  }
  // Small values stay whole on their server whatever the weights.
  auto small = place(5, 100, 4, 65536, w);
  ASSERT_EQ(small.size(), 1u);
  EXPECT_EQ(small[0].server, server_of(5, 4));
  // Equal weights cut what no weights cut.
  auto equal = place(5, 1000003, 4, 65536, {1, 1, 1, 1});
  auto plain = place(5, 1000003, 4, 65536);
  ASSERT_EQ(equal.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_NEAR(double(equal[i].count), double(plain[i].count), 1.0);
}

}  // namespace
}  // namespace pushpull::ps
