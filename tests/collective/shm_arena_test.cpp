// SPDX-License-Identifier: Apache-2.0
// The shared-memory arena (shm_arena.h), reached as the algorithms reach it
// (allreduce() and barrier() over ShmTransports with host_collectives()):
// every size through the slots (one segment or many), every dtype and op,
// the same bits on every rank, long mixed sequences (slots alternate,
// phases stay in step), and the failure paths: a peer that closes, one
// that never comes, this rank's own close.
#include "transport/shm/shm_arena.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "collective/algorithms.h"
#include "fabrics.h"
#include "harness.h"
#include "pushpull/kernels.h"

namespace pushpull::collective {

using transport::Clock;
using transport::parse_slot_stores;
using transport::ShmArena;
using transport::ShmOptions;
using transport::SlotStores;
using transport::Transport;

namespace {

using namespace std::chrono_literals;

using testing::run_ranks;

// Small integers (exact in every dtype, products stay small): rank r's
// element i.
double value(int r, size_t i, ReduceOp op) {
  if (op == ReduceOp::kProd) return ((i + static_cast<size_t>(r)) % 3 == 0) ? 2.0 : 1.0;
  return static_cast<double>((i * 7 + static_cast<size_t>(r) * 3) % 11) - 5.0;
}

std::vector<char> input(int r, size_t count, DType dtype, ReduceOp op) {
  std::vector<double> d(count);
  for (size_t i = 0; i < count; ++i)
    d[i] = value(r, i, op);
  std::vector<char> out(count * dtype_size(dtype));
  convert(dtype, out.data(), DType::kFloat64, d.data(), count);
  return out;
}

std::vector<char> reference(int n, size_t count, DType dtype, ReduceOp op) {
  std::vector<char> acc = input(0, count, dtype, op);
  for (int r = 1; r < n; ++r) {
    auto in = input(r, count, dtype, op);
    reduce(op, dtype, acc.data(), in.data(), count);
  }
  return acc;
}

AlgoContext context(Transport& t, uint64_t op_id, Millis timeout = Millis(20000)) {
  thread_local std::vector<char> scratch;  // a fallback to the rings needs it
  AlgoContext ctx{t};
  ctx.scratch = &scratch;
  ctx.op_id = op_id;
  ctx.peer_timeout = timeout;
  return ctx;
}

TEST(ShmArena, EverySizeDtypeOpAndWorldInOneSegmentOrMany) {
  ShmOptions o;
  o.arena_slot_bytes = 4096;   // 1024 floats: many segments with small vectors
  o.arena_chunk_bytes = 1000;  // several steps per segment, the last one short
  for (int n : {2, 3, 4, 5}) {
    auto g = testing::connect_shm_group(n, o);
    ASSERT_NE(g[0]->host_collectives(), nullptr);
    EXPECT_TRUE(g[0]->host_collectives()->handles_allreduce(4096));
    EXPECT_TRUE(g[0]->host_collectives()->handles_allreduce(uint64_t{1} << 30));  // segments
    std::vector<std::vector<std::vector<char>>> results(static_cast<size_t>(n));
    uint64_t op_id = 0;
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kFloat16})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax})
        for (size_t count : {size_t{1}, size_t{3}, size_t{1000}, size_t{1024}, size_t{1025},
                             size_t{70001}, size_t{300000}}) {
          ++op_id;
          const size_t bytes = count * dtype_size(dtype);
          const auto want = reference(n, count, dtype, op);
          std::vector<std::vector<char>> got(static_cast<size_t>(n));
          run_ranks(g, [&](int r, Transport& t) {
            auto buf = input(r, count, dtype, op);
            auto ctx = context(t, op_id);
            allreduce(ctx, buf.data(), count, dtype, op);
            got[static_cast<size_t>(r)] = std::move(buf);
          });
          for (int r = 0; r < n; ++r)
            ASSERT_EQ(std::memcmp(got[static_cast<size_t>(r)].data(), want.data(), bytes), 0)
                << "n " << n << " rank " << r << " dtype " << dtype_name(dtype) << " op "
                << reduce_op_name(op) << " count " << count;
        }
  }
}

TEST(ShmArena, StreamingStoresGiveEverySizeDtypeOpAndWorldTheSameResult) {
  ShmOptions o;
  o.arena_slot_bytes = 4096;
  o.arena_chunk_bytes = 1000;  // pieces of odd sizes and alignments
  o.arena_stores = SlotStores::kStreaming;
  for (int n : {2, 3, 4}) {
    auto g = testing::connect_shm_group(n, o);
    uint64_t op_id = 0;
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kFloat16})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax})
        for (size_t count : {size_t{1}, size_t{3}, size_t{1025}, size_t{70001}}) {
          ++op_id;
          const auto want = reference(n, count, dtype, op);
          run_ranks(g, [&](int r, Transport& t) {
            auto buf = input(r, count, dtype, op);
            auto ctx = context(t, op_id);
            allreduce(ctx, buf.data(), count, dtype, op);
            ASSERT_EQ(std::memcmp(buf.data(), want.data(), count * dtype_size(dtype)), 0)
                << "n " << n << " rank " << r << " dtype " << dtype_name(dtype) << " op "
                << reduce_op_name(op) << " count " << count;
          });
        }
  }
}

// Float sums whose bits depend on the order of the additions.
std::vector<float> rounded_input(int r, size_t count) {
  std::vector<float> buf(count);
  for (size_t i = 0; i < count; ++i)
    buf[i] = 1.0f / static_cast<float>(3 + r + static_cast<int>(i % 17)) * (r % 2 ? 1e7f : 1);
  return buf;
}

TEST(ShmArena, CachedStreamingAndMeasuredStoresGiveTheSameBits) {
  // Above kTunedBytes, so auto tries both kinds of stores (the first
  // allreduces alternate) and then keeps one; a count that is no multiple
  // of anything, so the pieces start at odd offsets.
  const size_t count = ShmArena::kTunedBytes / 4 + 12345;
  const int n = 3;
  std::vector<float> first;
  for (SlotStores stores : {SlotStores::kCached, SlotStores::kStreaming, SlotStores::kAuto}) {
    ShmOptions o;
    o.arena_stores = stores;
    auto g = testing::connect_shm_group(n, o);
    for (int round = 0; round < 6; ++round) {
      std::vector<std::vector<float>> got(n);
      run_ranks(g, [&](int r, Transport& t) {
        auto buf = rounded_input(r, count);
        auto ctx = context(t, static_cast<uint64_t>(round) + 1);
        allreduce(ctx, buf.data(), count, DType::kFloat32, ReduceOp::kSum, 0.5);
        got[static_cast<size_t>(r)] = std::move(buf);
      });
      if (first.empty()) first = got[0];
      for (int r = 0; r < n; ++r)
        ASSERT_EQ(std::memcmp(got[static_cast<size_t>(r)].data(), first.data(), count * 4), 0)
            << "stores " << static_cast<int>(stores) << " round " << round << " rank " << r;
    }
  }
}

TEST(ShmArena, SlotStoresByName) {
  EXPECT_EQ(parse_slot_stores("auto"), SlotStores::kAuto);
  EXPECT_EQ(parse_slot_stores("cached"), SlotStores::kCached);
  EXPECT_EQ(parse_slot_stores("streaming"), SlotStores::kStreaming);
  EXPECT_EQ(parse_slot_stores("Streaming"), std::nullopt);
  EXPECT_EQ(parse_slot_stores(""), std::nullopt);
}

TEST(ShmArena, TheSameBitsOnEveryRankForRoundedSums) {
  // Values whose float sums depend on the order: every rank still ends with
  // the same bits (one rank reduces each block, in rank order).
  ShmOptions o;
  o.arena_slot_bytes = 4096;
  o.arena_chunk_bytes = 512;
  const int n = 4;
  auto g = testing::connect_shm_group(n, o);
  for (size_t count : {size_t{1000}, size_t{50000}}) {
    std::vector<std::vector<float>> got(n);
    run_ranks(g, [&](int r, Transport& t) {
      std::vector<float> buf = rounded_input(r, count);
      auto ctx = context(t, count);
      allreduce(ctx, buf.data(), count, DType::kFloat32, ReduceOp::kSum);
      got[static_cast<size_t>(r)] = std::move(buf);
    });
    for (int r = 1; r < n; ++r)
      EXPECT_EQ(std::memcmp(got[0].data(), got[r].data(), count * 4), 0) << "rank " << r;
  }
}

TEST(ShmArena, APostscaleAveragesThroughSlotsAndSingleCopy) {
  ShmOptions o;
  o.arena_slot_bytes = 4096;
  const int n = 4;
  auto g = testing::connect_shm_group(n, o);
  for (size_t count : {size_t{100}, size_t{100001}}) {
    run_ranks(g, [&](int r, Transport& t) {
      std::vector<float> buf(count, static_cast<float>(2 * r));  // mean: n - 1
      auto ctx = context(t, count);
      allreduce(ctx, buf.data(), count, DType::kFloat32, ReduceOp::kSum, 1.0 / n);
      for (size_t i = 0; i < count; i += 1009)
        ASSERT_EQ(buf[i], static_cast<float>(n - 1)) << "count " << count << " rank " << r;
      ASSERT_EQ(buf[count - 1], static_cast<float>(n - 1));
    });
  }
}

TEST(ShmArena, LongMixedSequencesOfSlotsSingleCopyAndBarriers) {
  ShmOptions o;
  o.arena_slot_bytes = 4096;
  o.arena_chunk_bytes = 1536;  // one to three chunks per slot allreduce
  const int n = 3;
  auto g = testing::connect_shm_group(n, o);
  run_ranks(g, [&](int r, Transport& t) {
    for (uint64_t k = 0; k < 300; ++k) {
      auto ctx = context(t, k + 1);
      if (k % 7 == 3) {
        barrier(ctx);
        continue;
      }
      const size_t count = k % 3 == 0 ? 20000 + k : 1 + k * 3;  // many segments or one
      std::vector<int32_t> buf(count);
      for (size_t i = 0; i < count; ++i)
        buf[i] = static_cast<int32_t>(k * 1000 + i + static_cast<size_t>(r));
      allreduce(ctx, buf.data(), count, DType::kInt32, ReduceOp::kSum);
      for (size_t i = 0; i < count; i += 97)
        ASSERT_EQ(buf[i], static_cast<int32_t>(n * (k * 1000 + i) + 3)) << "op " << k;
    }
  });
}

TEST(ShmArena, NoRankLeavesTheBarrierBeforeEveryRankArrived) {
  const int n = 3;
  auto g = testing::connect_shm_group(n);
  std::atomic<int> arrived{0};
  run_ranks(g, [&](int r, Transport& t) {
    for (int round = 0; round < 20; ++round) {
      if (r == round % n) std::this_thread::sleep_for(2ms);  // the late one changes
      arrived.fetch_add(1);
      auto ctx = context(t, static_cast<uint64_t>(round) + 1);
      barrier(ctx);
      EXPECT_GE(arrived.load(), (round + 1) * n) << "rank " << r << " round " << round;
      auto ctx2 = context(t, 1000 + static_cast<uint64_t>(round));
      barrier(ctx2);  // nobody counts the next round before all checked
    }
  });
}

TEST(ShmArena, NoSlotsMeansNoArena) {
  ShmOptions o;
  o.arena_slot_bytes = 0;
  auto g = testing::connect_shm_group(2, o);
  EXPECT_EQ(g[0]->host_collectives(), nullptr);
}

// Rank 1 closes its transport while ranks 0 and 2 wait for it in an
// allreduce of `count` floats: both fail promptly with PeerFailure naming it.
void a_closing_peer_fails_the_others(size_t count) {
  ShmOptions o;
  o.arena_slot_bytes = 4096;
  const int n = 3;
  auto g = testing::connect_shm_group(n, o);
  std::vector<std::string> errors(n);
  const auto start = Clock::now();
  run_ranks(g, [&](int r, Transport& t) {
    if (r == 1) {
      std::this_thread::sleep_for(100ms);
      t.close(Status(ErrorCode::kPeerFailure, "test: rank 1 leaves"));
      return;
    }
    std::vector<float> buf(count, 1.0f);
    auto ctx = context(t, 1, Millis(30000));
    try {
      allreduce(ctx, buf.data(), count, DType::kFloat32, ReduceOp::kSum);
    } catch (const PeerFailure& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  EXPECT_LT(Clock::now() - start, 5s);  // not the 30 s deadline
  for (int r : {0, 2})
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 1"), std::string::npos)
        << "rank " << r << ": '" << errors[static_cast<size_t>(r)] << "'";
}

TEST(ShmArena, APeerThatClosesFailsTheOthersInASlotAllreduce) {
  a_closing_peer_fails_the_others(100);
}

TEST(ShmArena, APeerThatClosesFailsTheOthersInASegmentedAllreduce) {
  a_closing_peer_fails_the_others(100000);
}

TEST(ShmArena, APeerThatNeverComesIsATimeoutNamingIt) {
  auto g = testing::connect_shm_group(2);
  std::vector<float> buf(10, 1.0f);
  auto ctx = context(*g[0], 1, Millis(300));
  const auto start = Clock::now();
  try {
    allreduce(ctx, buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
    FAIL() << "no timeout";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - start, 250ms);
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(ShmArena, ClosingThisRankEndsItsOwnWait) {
  auto g = testing::connect_shm_group(2);
  std::thread closer([&] {
    std::this_thread::sleep_for(100ms);
    g[0]->close(Status(ErrorCode::kTimeout, "test: the job gives up"));
  });
  std::vector<float> buf(10, 1.0f);
  auto ctx = context(*g[0], 1, Millis(30000));
  const auto start = Clock::now();
  EXPECT_THROW(barrier(ctx), Timeout);  // the closing reason
  EXPECT_LT(Clock::now() - start, 5s);
  closer.join();
}

}  // namespace
}  // namespace pushpull::collective
