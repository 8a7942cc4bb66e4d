// SPDX-License-Identifier: Apache-2.0
// Every decoder of the PS and cluster messages (transport/wire.h underneath): round
// trips, and truncated, garbage, huge-count or overflowing input is rejected
// with a ProtocolError status (never a throw, never a read past the input:
// run under the ASan build to check the latter).
#include <gtest/gtest.h>

#include <limits>

#include <fmt/format.h>
#include <random>

#include "cluster/protocol.h"
#include "ps/protocol.h"
#include "transport/wire.h"

namespace pushpull {
namespace {

std::vector<std::byte> random_bytes(std::mt19937& rng, size_t max) {
  std::vector<std::byte> b(rng() % (max + 1));
  for (auto& x : b)
    x = static_cast<std::byte>(rng());
  return b;
}

// Feeds every prefix of `good` and many random inputs to `decode`.
template <typename Decode>
void reject_prefixes_and_garbage(const std::vector<std::byte>& good, Decode decode) {
  for (size_t n = 0; n < good.size(); ++n) {
    Status s = decode(std::span<const std::byte>(good.data(), n));
    if (!s.is_ok()) {
      EXPECT_EQ(s.code(), ErrorCode::kProtocolError) << s.to_string();
    }
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 5000; ++i) {
    auto b = random_bytes(rng, 64);
    Status s = decode(b);
    if (!s.is_ok()) {
      EXPECT_EQ(s.code(), ErrorCode::kProtocolError) << s.to_string();
    }
  }
}

TEST(PsInit, RoundTripsAndRejectsTruncatedNames) {
  std::vector<std::byte> value(12, std::byte{7});
  auto b = ps::encode_init("weight", value);
  std::string name;
  std::span<const std::byte> v;
  ASSERT_TRUE(ps::decode_init(b, &name, &v).is_ok());
  EXPECT_EQ(name, "weight");
  EXPECT_EQ(v.size(), 12u);
  // A name length larger than the payload.
  auto lying = b;
  lying[0] = std::byte{0xff};
  EXPECT_EQ(ps::decode_init(lying, &name, &v).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(ps::decode_init({}, &name, &v).code(), ErrorCode::kProtocolError);
  reject_prefixes_and_garbage(b, [](std::span<const std::byte> in) {
    std::string n;
    std::span<const std::byte> val;
    Status s = ps::decode_init(in, &n, &val);
    if (s.is_ok()) {
      EXPECT_LE(n.size() + 2 + val.size(), in.size());
    }
    return s;
  });
}

TEST(PsRanges, RoundTripAndRejectNegativeOrOverflowing) {
  std::vector<ps::Range> ranges{{0, 3}, {10, 2}};
  auto b = ps::encode_ranges(ranges);
  std::vector<ps::Range> out;
  ASSERT_TRUE(ps::decode_ranges(b, &out).is_ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].begin, 10);
  EXPECT_EQ(out[1].count, 2);

  const int64_t max = std::numeric_limits<int64_t>::max();
  for (auto bad : {ps::Range{1, max}, ps::Range{-1, 1}, ps::Range{0, -5}, ps::Range{max, 1}}) {
    EXPECT_EQ(ps::decode_ranges(ps::encode_ranges({bad}), &out).code(), ErrorCode::kProtocolError)
        << bad.begin << " " << bad.count;
  }
  b.pop_back();
  EXPECT_EQ(ps::decode_ranges(b, &out).code(), ErrorCode::kProtocolError);
  reject_prefixes_and_garbage(ps::encode_ranges(ranges), [](std::span<const std::byte> in) {
    std::vector<ps::Range> r;
    return ps::decode_ranges(in, &r);
  });
}

cluster::NodeAddress addr(Role role, int rank) {
  return {role, rank, "10.0.0." + std::to_string(rank + 1), 9000 + rank};
}

TEST(ClusterProtocol, RoundTrips) {
  cluster::NodeAddress me;
  int32_t pref = 0;
  ASSERT_TRUE(
      cluster::decode_register(cluster::encode_register(addr(Role::kWorker, 3), 3), &me, &pref)
          .is_ok());
  EXPECT_EQ(me.host, "10.0.0.4");
  EXPECT_EQ(pref, 3);

  cluster::AddressBook book;
  book.scheduler = addr(Role::kScheduler, 0);
  book.servers = {addr(Role::kServer, 0)};
  book.workers = {addr(Role::kWorker, 0), addr(Role::kWorker, 1)};
  cluster::AddressBook got;
  int32_t rank = -1;
  ASSERT_TRUE(cluster::decode_book(cluster::encode_book(1, book), &rank, &got).is_ok());
  EXPECT_EQ(rank, 1);
  ASSERT_EQ(got.workers.size(), 2u);
  EXPECT_EQ(got.workers[1].port, 9001);
  EXPECT_EQ(got.workers[1].mesh_port, 0);

  // A worker's collectives mesh port travels in its registration and in the
  // book (collective/bootstrap.cpp forms the mesh from it).
  cluster::NodeAddress w = addr(Role::kWorker, 2);
  w.mesh_port = 41000;
  ASSERT_TRUE(cluster::decode_register(cluster::encode_register(w, -1), &me, &pref).is_ok());
  EXPECT_EQ(me.mesh_port, 41000);
  book.workers[1].mesh_port = 41001;
  ASSERT_TRUE(cluster::decode_book(cluster::encode_book(1, book), &rank, &got).is_ok());
  EXPECT_EQ(got.workers[1].mesh_port, 41001);
  EXPECT_EQ(got.workers[0].mesh_port, 0);
  for (int bad : {-1, 65536}) {
    w.mesh_port = bad;
    EXPECT_EQ(cluster::decode_register(cluster::encode_register(w, -1), &me, &pref).code(),
              ErrorCode::kProtocolError);
  }

  std::string reason;
  ASSERT_TRUE(
      cluster::decode_dead(cluster::encode_dead(addr(Role::kServer, 0), "gone"), &me, &reason)
          .is_ok());
  EXPECT_EQ(reason, "gone");
}

// The book names each host once: 4,096 workers on 512 hosts cost 8 bytes
// each plus the host table, and ranks and roles come from the positions.
TEST(ClusterProtocol, TheBookIsCompact) {
  cluster::AddressBook book;
  book.scheduler = addr(Role::kScheduler, 0);
  for (int s = 0; s < 2; ++s)
    book.servers.push_back({Role::kServer, s, "10.1.0.1", 9000 + s});
  for (int w = 0; w < 4096; ++w)
    book.workers.push_back({Role::kWorker, w, fmt::format("10.2.{}.{}", w / 8 / 256, w / 8 % 256),
                            10000 + w % 8, 20000 + w % 8});
  auto bytes = cluster::encode_book(7, book);
  EXPECT_LT(bytes.size(), 513 * (4 + 12) + 4098 * 8 + 64u);
  cluster::AddressBook got;
  int32_t rank = -1;
  ASSERT_TRUE(cluster::decode_book(bytes, &rank, &got).is_ok());
  EXPECT_EQ(rank, 7);
  ASSERT_EQ(got.workers.size(), 4096u);
  EXPECT_EQ(got.workers[4095].host, "10.2.1.255");
  EXPECT_EQ(got.workers[4095].rank, 4095);
  EXPECT_EQ(got.workers[4095].role, Role::kWorker);
  EXPECT_EQ(got.workers[4095].mesh_port, 20007);
  EXPECT_EQ(got.servers[1].port, 9001);
  // The scheduler encodes once and patches the receiver's rank.
  cluster::set_book_rank(bytes, 3);
  ASSERT_TRUE(cluster::decode_book(bytes, &rank, &got).is_ok());
  EXPECT_EQ(rank, 3);
}

TEST(ClusterProtocol, BookWithAHugeCountIsRejectedBeforeAllocating) {
  transport::Writer w;
  w.u<int32_t>(0);
  w.u<uint8_t>(1).u<int32_t>(0).str("h").u<int32_t>(1).u<int32_t>(0);  // scheduler
  w.u<uint32_t>(0);                                                    // host table
  w.u<uint32_t>(999999);  // servers: far more than follow
  cluster::AddressBook book;
  int32_t rank;
  EXPECT_EQ(cluster::decode_book(w.data(), &rank, &book).code(), ErrorCode::kProtocolError);
  EXPECT_TRUE(book.servers.empty());
}

TEST(ClusterProtocol, TruncatedAndGarbageInputIsRejected) {
  cluster::AddressBook book;
  book.scheduler = addr(Role::kScheduler, 0);
  book.servers = {addr(Role::kServer, 0)};
  book.workers = {addr(Role::kWorker, 0)};
  reject_prefixes_and_garbage(cluster::encode_book(0, book), [](std::span<const std::byte> in) {
    cluster::AddressBook b;
    int32_t r;
    return cluster::decode_book(in, &r, &b);
  });
  reject_prefixes_and_garbage(cluster::encode_register(addr(Role::kServer, 1), -1),
                              [](std::span<const std::byte> in) {
                                cluster::NodeAddress a;
                                int32_t p;
                                return cluster::decode_register(in, &a, &p);
                              });
  reject_prefixes_and_garbage(cluster::encode_dead(addr(Role::kWorker, 2), "crashed"),
                              [](std::span<const std::byte> in) {
                                cluster::NodeAddress a;
                                std::string why;
                                return cluster::decode_dead(in, &a, &why);
                              });
}

}  // namespace
}  // namespace pushpull
