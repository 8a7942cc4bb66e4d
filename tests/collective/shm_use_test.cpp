// SPDX-License-Identifier: Apache-2.0
// use_shared_memory's choice (shm_data_transport.h): a job whose ranks are
// split over two segment directories ("hosts") moves data between ranks of
// one directory through shared memory and to the others over TCP, every
// pair correct; small messages ride the mesh's streams; off, or an unusable
// directory, means TCP; the mesh's verdict fails shared-memory operations.
#include <gtest/gtest.h>

#include <thread>

#include "collective/algorithms.h"
#include "shm_host_fixture.h"
#include "transport/shm/shm_segment.h"

namespace pushpull::collective {
namespace {

using namespace shm_testing;

TEST(UseSharedMemory, RanksOfOneDirectoryShareTheOthersUseTcp) {
  TempDir a, b;
  auto ts = choose(testing::connect_tcp_group(4),
                   {a.path.string(), a.path.string(), b.path.string(), a.path.string()});
  auto* s0 = dynamic_cast<ShmDataTransport*>(ts[0].get());
  ASSERT_NE(s0, nullptr);
  EXPECT_EQ(s0->group(), (std::vector<int>{0, 1, 3}));
  EXPECT_NE(dynamic_cast<ShmDataTransport*>(ts[3].get()), nullptr);
  auto* s2 = dynamic_cast<ShmDataTransport*>(ts[2].get());  // alone in b: TCP only
  ASSERT_NE(s2, nullptr);
  EXPECT_TRUE(s2->group().empty());
  every_pair_talks(ts);
  // No rank offers direct streams (every rank must take the same path), the
  // one alone in b included.
  for (auto& t : ts)
    for (int peer = 0; peer < 4; ++peer)
      EXPECT_FALSE(t->runs_direct_to(peer));
  // A ring allreduce over the mixed transport (1 MiB segments: several units).
  std::vector<std::vector<float>> data(4, std::vector<float>(700001));
  std::vector<std::thread> th;
  for (int r = 0; r < 4; ++r)
    th.emplace_back([&, r] {
      auto& d = data[static_cast<size_t>(r)];
      for (size_t i = 0; i < d.size(); ++i)
        d[i] = static_cast<float>((i % 97) + r);
      std::vector<char> scratch;
      AlgoContext ctx{*ts[static_cast<size_t>(r)]};
      ctx.op_id = 7;
      ctx.scratch = &scratch;
      allreduce(ctx, d.data(), d.size(), DType::kFloat32, ReduceOp::kSum);
    });
  for (auto& t : th)
    t.join();
  for (int r = 0; r < 4; ++r)
    for (size_t i : {size_t{0}, size_t{12345}, data[0].size() - 1})
      EXPECT_EQ(data[static_cast<size_t>(r)][i], static_cast<float>(4 * (i % 97) + 6)) << r;
  EXPECT_EQ(a.entries(), 0u);  // probes removed, segments unlinked once mapped
  EXPECT_EQ(b.entries(), 0u);
  for (auto& t : ts)
    t->close(Status(ErrorCode::kPeerFailure, "test over"));
}

// PUSHPULL_SHM_MIN_MESSAGE_BYTES: operations of small messages run on the
// TCP mesh's direct streams on every rank (the one alone on its host too,
// so all take the same path), larger ones through shared memory; both give
// the right sums, one after the other on the same transports.
TEST(UseSharedMemory, SmallMessagesRideTheMeshStreamsLargeOnesSharedMemory) {
  TempDir a, b;
  const uint64_t below = 64 << 10;
  auto ts = choose(testing::connect_tcp_group(3),
                   {a.path.string(), a.path.string(), b.path.string()}, true, below);
  for (auto& t : ts) {
    auto* s = dynamic_cast<ShmDataTransport*>(t.get());
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(s->streams_for(4096));
    EXPECT_TRUE(s->streams_for(below - 1));
    EXPECT_FALSE(s->streams_for(below));
    EXPECT_FALSE(t->runs_direct_to((t->rank() + 1) % 3));
  }
  // 1,000 floats: halving-doubling on the streams; 300,000: a ring whose
  // 400 KB blocks go through shared memory; then small again.
  const std::vector<size_t> counts = {1000, 300000, 7};
  std::vector<std::vector<std::vector<float>>> data(3);
  std::vector<std::thread> th;
  for (int r = 0; r < 3; ++r)
    th.emplace_back([&, r] {
      std::vector<char> scratch;
      AlgoContext ctx{*ts[static_cast<size_t>(r)]};
      ctx.scratch = &scratch;
      for (size_t k = 0; k < counts.size(); ++k) {
        auto& d = data[static_cast<size_t>(r)].emplace_back(counts[k]);
        for (size_t i = 0; i < d.size(); ++i)
          d[i] = static_cast<float>((i % 89) + r + k);
        ctx.op_id = 20 + k;
        allreduce(ctx, d.data(), d.size(), DType::kFloat32, ReduceOp::kSum);
      }
    });
  for (auto& t : th)
    t.join();
  for (int r = 0; r < 3; ++r)
    for (size_t k = 0; k < counts.size(); ++k) {
      const auto& d = data[static_cast<size_t>(r)][k];
      for (size_t i : {size_t{0}, d.size() / 2, d.size() - 1})
        EXPECT_EQ(d[i], static_cast<float>(3 * (i % 89) + 3 + 3 * k)) << r << " " << k;
    }
  for (auto& t : ts)
    t->close(Status(ErrorCode::kPeerFailure, "test over"));
}

TEST(UseSharedMemory, OffMeansTcpAndAnUnusableDirectoryFallsBackToTcp) {
  TempDir a;
  auto off = choose(testing::connect_tcp_group(2), {a.path.string(), a.path.string()}, false);
  EXPECT_NE(dynamic_cast<TcpTransport*>(off[0].get()), nullptr);
  EXPECT_NE(dynamic_cast<TcpTransport*>(off[1].get()), nullptr);
  EXPECT_EQ(a.entries(), 0u);
  // No directory to make probes in: every rank keeps TCP, none waits.
  const std::string missing = (a.path / "missing").string();
  auto ts = choose(testing::connect_tcp_group(2), {missing, missing});
  EXPECT_NE(dynamic_cast<TcpTransport*>(ts[0].get()), nullptr);
  EXPECT_NE(dynamic_cast<TcpTransport*>(ts[1].get()), nullptr);
  every_pair_talks(ts);
  for (auto& t : ts)
    t->close(Status(ErrorCode::kPeerFailure, "test over"));
}

TEST(UseSharedMemory, AVerdictOfTheMeshFailsSharedMemoryOperations) {
  TempDir a;
  auto tcp = testing::connect_tcp_group(2);
  TcpTransport* mesh0 = tcp[0].get();
  auto ts = choose(std::move(tcp), {a.path.string(), a.path.string()});
  ASSERT_NE(dynamic_cast<ShmDataTransport*>(ts[0].get()), nullptr);
  std::vector<uint8_t> buf(16);
  Request r = irecv(*ts[0], 1, 9, buf.data(), buf.size());  // data: through shared memory
  mesh0->declare(Status(ErrorCode::kPeerFailure, "collective: rank 1 stopped answering"));
  try {
    r.wait(Clock::now() + std::chrono::seconds(10), "the receive");
    FAIL() << "the receive completed";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 stopped answering"), std::string::npos);
  }
  for (auto& t : ts)
    t->close(Status(ErrorCode::kPeerFailure, "test over"));
}

}  // namespace
}  // namespace pushpull::collective
