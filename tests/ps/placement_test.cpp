// SPDX-License-Identifier: Apache-2.0
#include "ps/placement.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace pushpull::ps {
namespace {

TEST(Placement, SmallValuesLiveWholeOnOneServer) {
  auto s = place(7, 6, 3, 1000000);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].begin, 0);
  EXPECT_EQ(s[0].count, 6);
  EXPECT_EQ(s[0].server, server_of(7, 3));
  // Deterministic and in range.
  EXPECT_EQ(place(7, 6, 3, 1000000)[0].server, s[0].server);
}

TEST(Placement, KeysSpreadOverServers) {
  std::map<int, int> per_server;
  for (uint64_t k = 0; k < 300; ++k)
    per_server[server_of(k, 3)]++;
  ASSERT_EQ(per_server.size(), 3u);
  for (auto [server, n] : per_server)
    EXPECT_GT(n, 70) << "server " << server;
}

TEST(Placement, ConsecutiveIntegerKeysAreBalancedExactly) {
  // 16 equal layers on 8 servers: 2 each, so every server link carries its share.
  for (int servers : {1, 2, 4, 8}) {
    std::map<int, int> per_server;
    for (uint64_t k = 0; k < 16; ++k)
      per_server[server_of(k, servers)]++;
    ASSERT_EQ(per_server.size(), static_cast<size_t>(servers));
    for (auto [server, n] : per_server)
      EXPECT_EQ(n, 16 / servers) << servers << " servers, server " << server;
  }
  std::map<int, int> strings;  // string keys still spread (by hash)
  for (int i = 0; i < 300; ++i)
    strings[server_of(string_key_id("layer" + std::to_string(i)), 3)]++;
  ASSERT_EQ(strings.size(), 3u);
  for (auto [server, n] : strings)
    EXPECT_GT(n, 70) << "server " << server;
}

TEST(Placement, ChunkCountGivesEverySliceEnoughPieces) {
  // 40 MiB of float32 over 4 servers: 10 MiB slices, 16 pieces of 640 KiB.
  auto four = place(1, 10 << 20, 4, 1000000);
  EXPECT_EQ(chunk_count(four, 1 << 20, 64 << 10, 16), (10 << 20) / 4 / 16);
  // Never above the configured chunk, never below the floor.
  EXPECT_EQ(chunk_count(place(1, 64 << 20, 1, 1000000), 1 << 20, 64 << 10, 16), 1 << 20);
  EXPECT_EQ(chunk_count(place(1, 1000, 1, 1000000), 1 << 20, 64 << 10, 16), 64 << 10);
  EXPECT_EQ(chunk_count(place(1, 0, 2, 1), 1 << 20, 0, 16), 1);
  auto c = chunk(four, chunk_count(four, 1 << 20, 64 << 10, 16));
  EXPECT_EQ(c.size(), 64u);
}

TEST(Placement, BigValuesAreSplitEvenlyOverAllServers) {
  auto s = place(1, 1440000, 3, 1000000);
  ASSERT_EQ(s.size(), 3u);
  int64_t next = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(s[i].server, i);
    EXPECT_EQ(s[i].begin, next);
    EXPECT_EQ(s[i].count, 480000);
    next += s[i].count;
  }
  auto odd = place(1, 1000001, 2, 1000000);
  ASSERT_EQ(odd.size(), 2u);
  EXPECT_EQ(odd[0].count + odd[1].count, 1000001);
  EXPECT_EQ(place(1, 999999, 2, 1000000).size(), 1u);  // just below the bound
  EXPECT_EQ(place(1, 5, 8, 2).size(), 5u);             // no empty slices
  EXPECT_EQ(place(1, 0, 2, 1).size(), 1u);
}

TEST(Placement, ChunksCoverEachSliceInOrder) {
  auto c = chunk(place(1, 1000, 2, 10), 120);
  int64_t next = 0;
  for (const auto& s : c) {
    EXPECT_EQ(s.begin, next);
    EXPECT_LE(s.count, 120);
    EXPECT_GT(s.count, 0);
    EXPECT_EQ(s.server, s.begin < 500 ? 0 : 1);
    next += s.count;
  }
  EXPECT_EQ(next, 1000);
  EXPECT_EQ(c.size(), 10u);  // 500 elements per server → 5 chunks of 100
  EXPECT_EQ(chunk(place(1, 5, 2, 10), 120).size(), 1u);
}

TEST(Placement, StringKeysNeverCollideWithIntegerKeys) {
  EXPECT_NE(string_key_id("weight"), string_key_id("bias"));
  EXPECT_EQ(string_key_id("weight"), string_key_id("weight"));
  EXPECT_GE(string_key_id("a"), 1ull << 63);
}

}  // namespace
}  // namespace pushpull::ps
