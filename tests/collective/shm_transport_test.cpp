// SPDX-License-Identifier: Apache-2.0
// ShmTransport's own behaviour and failure paths (the algorithm cases run
// over it in algorithms_test): setup leaves no files, foreign segments are
// refused, a closed peer fails what is pending with it, bad sizes and floods
// are protocol errors, a missing peer times out.
#include "transport/shm/shm_transport.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "fabrics.h"

namespace pushpull::collective {

using transport::Clock;
using transport::irecv;
using transport::isend;
using transport::kShmHostRingBudget;
using transport::kShmMinDataRingBytes;
using transport::Request;
using transport::ring_bytes_for_ranks;
using transport::ShmOptions;
using transport::ShmTransport;

namespace {

using namespace std::chrono_literals;

std::string fresh_prefix() {
  std::random_device rd;
  return fmt::format("pushpull-shmtest-{:x}{:x}", rd(), rd());
}

bool any_file_with(const std::string& prefix) {
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return true;
  return false;
}

// The rings of a host stay within the budget whatever its ranks: 2 MiB up
// to 32 ranks (as before), then the budget's share in whole pages, never
// below the floor; every size the same on each rank (a pure function).
TEST(ShmTransport, RingsShrinkSoAHostsRingsFitTheBudget) {
  const size_t max_ring = size_t{2} << 20;
  EXPECT_EQ(ring_bytes_for_ranks(max_ring, 1), max_ring);
  for (size_t n : {2u, 8u, 32u})
    EXPECT_EQ(ring_bytes_for_ranks(max_ring, n), max_ring) << n;
  size_t previous = max_ring;
  for (size_t n = 2; n <= 4096; n += n < 64 ? 1 : 61) {
    const size_t ring = ring_bytes_for_ranks(max_ring, n);
    EXPECT_LE(ring, previous) << n;
    EXPECT_EQ(ring % 4096, 0u) << n;
    EXPECT_GE(ring, kShmMinDataRingBytes) << n;
    if (ring > kShmMinDataRingBytes) {
      EXPECT_LE(uint64_t{ring} * n * (n - 1), kShmHostRingBudget) << n;
    }
    previous = ring;
  }
  // 256 ranks on a host: 32 KiB rings, 2 GiB in all (4 GiB at 2 MiB each
  // per 32 ranks: 130 GiB, the OOM killer's, before).
  EXPECT_EQ(ring_bytes_for_ranks(max_ring, 256), size_t{32} << 10);
}

TEST(ShmTransport, MessagesOfEverySizeArriveInOrderPerTag) {
  ShmOptions o;
  o.ring_bytes = 8192;  // most messages below stream through the ring in pieces
  auto g = testing::connect_shm_group(2, o);
  std::vector<std::vector<char>> out;
  std::vector<Request> recvs;
  const size_t sizes[] = {0, 1, 15, 16, 17, 4096, 8191, 8192, 8193, 100000};
  for (size_t s : sizes)
    out.emplace_back(s);
  // Half the receives posted before the sends, half after (kept early).
  for (size_t i = 0; i < 5; ++i)
    recvs.push_back(irecv(*g[1], 0, 7, out[i].data(), out[i].size()));
  std::vector<std::vector<char>> in;
  std::vector<Request> sends;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    in.emplace_back(sizes[i]);
    for (size_t k = 0; k < sizes[i]; ++k)
      in[i][k] = static_cast<char>(k * 7 + i);
    sends.push_back(isend(*g[0], 1, 7, in[i].data(), in[i].size()));
  }
  for (size_t i = 5; i < std::size(sizes); ++i)
    recvs.push_back(irecv(*g[1], 0, 7, out[i].data(), out[i].size()));
  for (auto& r : recvs)
    r.wait(Clock::now() + 10s, "receive");
  for (auto& s : sends)
    s.wait(Clock::now() + 10s, "send");
  for (size_t i = 0; i < std::size(sizes); ++i)
    EXPECT_EQ(out[i], in[i]) << "message " << i;
}

TEST(ShmTransport, SetupLeavesNoFilesBehind) {
  const std::string prefix = fresh_prefix();
  auto g = testing::connect_shm_group(3, {}, prefix);
  EXPECT_FALSE(any_file_with(prefix));
}

TEST(ShmTransport, ASegmentOthersCanReadIsRefused) {
  const std::string prefix = fresh_prefix();
  const std::string peer = fmt::format("/dev/shm/{}.1", prefix);
  int fd = ::open(peer.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0);
  ::fchmod(fd, 0644);
  ::ftruncate(fd, 1 << 20);
  ::close(fd);
  ShmOptions o;
  o.connect_timeout = 2000ms;
  try {
    ShmTransport t(0, 2, prefix, o);
    ADD_FAILURE() << "accepted a world-readable segment";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("refusing"), std::string::npos) << e.what();
  }
  ::unlink(peer.c_str());
  EXPECT_FALSE(any_file_with(prefix)) << "rank 0's own segment must be removed on failure";
}

// PUSHPULL_SHM_ARENA_SLOT_BYTES set differently on two ranks of a host: the
// one that finds the other's segment says so at once, naming the setting,
// instead of waiting out the connect timeout for a segment of its own size.
TEST(ShmTransport, RanksWithDifferentArenaSlotsRefuseEachOtherNamingTheSetting) {
  const std::string prefix = fresh_prefix();
  std::vector<std::string> errors(2);
  std::vector<bool> invalid(2, false);
  const auto start = Clock::now();
  std::vector<Clock::duration> took(2);
  testing::on_threads(2, [&](int r) {
    ShmOptions o;
    o.connect_timeout = 1500ms;
    o.arena_slot_bytes = r == 0 ? 1 << 20 : 2 << 20;
    try {
      ShmTransport t(r, 2, prefix, o);
      errors[static_cast<size_t>(r)] = "connected";
    } catch (const InvalidArgument& e) {
      invalid[static_cast<size_t>(r)] = true;
      errors[static_cast<size_t>(r)] = e.what();
    } catch (const Error& e) {  // the other one gave up first: its segment is gone
      errors[static_cast<size_t>(r)] = e.what();
    }
    took[static_cast<size_t>(r)] = Clock::now() - start;
  });
  int told = 0;
  for (int r = 0; r < 2; ++r) {
    const std::string& e = errors[static_cast<size_t>(r)];
    EXPECT_NE(e, "connected") << "rank " << r;
    if (!invalid[static_cast<size_t>(r)]) continue;
    ++told;
    EXPECT_NE(e.find("PUSHPULL_SHM_ARENA_SLOT_BYTES"), std::string::npos) << e;
    EXPECT_NE(e.find("1048576-byte arena slots"), std::string::npos) << e;
    EXPECT_NE(e.find("2097152-byte arena slots"), std::string::npos) << e;
    EXPECT_LT(took[static_cast<size_t>(r)], 1s) << "rank " << r << " waited for its own size";
  }
  EXPECT_GE(told, 1) << errors[0] << " / " << errors[1];
  EXPECT_FALSE(any_file_with(prefix));
}

TEST(ShmTransport, AMissingPeerTimesOut) {
  ShmOptions o;
  o.connect_timeout = 200ms;
  const std::string prefix = fresh_prefix();
  EXPECT_THROW(ShmTransport(0, 2, prefix, o), Timeout);
  EXPECT_FALSE(any_file_with(prefix));
}

TEST(ShmTransport, AClosedPeerFailsPendingReceivesAndLaterPosts) {
  auto g = testing::connect_shm_group(2);
  char buf[8];
  auto r = irecv(*g[0], 1, 1, buf, sizeof buf);
  g[1]->close(Status(ErrorCode::kPeerFailure, "rank 1 test shutdown"));
  try {
    r.wait(Clock::now() + 10s, "receive from a closed peer");
    ADD_FAILURE() << "no error";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 is gone (closed)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(isend(*g[0], 1, 1, buf, sizeof buf).wait(Clock::now() + 10s, "send"), PeerFailure);
}

TEST(ShmTransport, WhatAPeerSentBeforeClosingIsStillDelivered) {
  auto g = testing::connect_shm_group(2);
  int v = 42, got = 0;
  isend(*g[1], 0, 3, &v, sizeof v).wait(Clock::now() + 10s, "send");
  g[1]->close(Status(ErrorCode::kPeerFailure, "done"));
  std::this_thread::sleep_for(150ms);  // rank 0 notices the close meanwhile
  irecv(*g[0], 1, 3, &got, sizeof got).wait(Clock::now() + 10s, "receive");
  EXPECT_EQ(got, 42);
}

TEST(ShmTransport, ASizeMismatchIsAProtocolError) {
  auto g = testing::connect_shm_group(2);
  char small[4], big[8] = {};
  auto r = irecv(*g[1], 0, 5, small, sizeof small);
  isend(*g[0], 1, 5, big, sizeof big);
  EXPECT_THROW(r.wait(Clock::now() + 10s, "receive"), ProtocolError);
}

TEST(ShmTransport, AFloodOfUnclaimedMessagesFailsThatPeer) {
  ShmOptions o;
  o.max_early_bytes = 64 << 10;
  auto g = testing::connect_shm_group(2, o);
  std::vector<char> chunk(16 << 10);
  for (int i = 0; i < 8; ++i)
    isend(*g[0], 1, 9, chunk.data(), chunk.size());
  char x;
  auto r = irecv(*g[1], 0, 10, &x, 1);  // never sent: fails with the flood
  EXPECT_THROW(r.wait(Clock::now() + 10s, "receive"), ProtocolError);
}

TEST(ShmTransport, CloseFailsEverythingPendingOnThisRank) {
  auto g = testing::connect_shm_group(2);
  char buf[4];
  auto r = irecv(*g[0], 1, 1, buf, sizeof buf);
  g[0]->close(Status(ErrorCode::kIoError, "closing"));
  EXPECT_TRUE(r.done());
  EXPECT_THROW(r.wait(Clock::now() + 1s, "receive"), Error);
}

}  // namespace
}  // namespace pushpull::collective
