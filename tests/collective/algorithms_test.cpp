// SPDX-License-Identifier: Apache-2.0
// The algorithms alone (no engine), every world size 1..8, against
// references computed locally; the same cases over every transport
// (fabrics.h: in-process, TCP with its direct streams, shared memory).
#include "collective/algorithms.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "fabrics.h"
#include "harness.h"

namespace pushpull::collective {

using transport::Block;
using transport::Clock;
using transport::even_blocks;
using transport::InProcessFabric;
using transport::irecv;
using transport::isend;
using transport::Request;
using transport::Transport;

namespace {

using testing::input_value;
using testing::Kind;
using testing::make_input;
using testing::reference;

// Every case below runs once per transport kind.
class Algorithms : public ::testing::TestWithParam<Kind> {
 protected:
  void run_ranks(int n, const std::function<void(int, Transport&)>& fn) { fabrics_.run(n, fn); }
  testing::Fabrics fabrics_{GetParam()};
};

enum class Algo { kRing, kHalvingDoubling };

struct Case {
  Algo algo;
  int n;
  DType dtype;
  ReduceOp op;
  int64_t count;
};

void check_allreduce(testing::Fabrics& fabrics, const Case& c, uint64_t segment_bytes = 4096) {
  std::vector<Array> results(static_cast<size_t>(c.n));
  fabrics.run(c.n, [&](int r, Transport& t) {
    std::vector<char> scratch;
    AlgoContext ctx{t};
    ctx.op_id = 3;
    ctx.ring_segment_bytes = segment_bytes;
    ctx.scratch = &scratch;
    Array a = make_input(c.op, c.dtype, r, c.count);
    if (c.algo == Algo::kRing)
      ring_allreduce(ctx, a.data(), static_cast<size_t>(c.count), c.dtype, c.op);
    else
      halving_doubling_allreduce(ctx, a.data(), static_cast<size_t>(c.count), c.dtype, c.op);
    results[static_cast<size_t>(r)] = std::move(a);
  });
  for (int r = 0; r < c.n; ++r) {
    for (int64_t i = 0; i < c.count; ++i) {
      ASSERT_EQ(get_element(results[static_cast<size_t>(r)], i), reference(c.op, c.dtype, c.n, i))
          << "rank " << r << " element " << i << " n " << c.n << " " << dtype_name(c.dtype) << " "
          << reduce_op_name(c.op) << " count " << c.count;
    }
  }
}

TEST_P(Algorithms, RingAllreduceEverySizeDtypeOpAndWorld) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                          DType::kInt32,   DType::kInt64,   DType::kInt8,     DType::kUInt8};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax};
  for (int n = 1; n <= 8; ++n)
    for (DType d : dtypes)
      for (ReduceOp op : ops)
        for (int64_t count :
             {int64_t{0}, int64_t{1}, int64_t{n - 1}, int64_t{3 * n + 1}, int64_t{5003}})
          check_allreduce(fabrics_, {Algo::kRing, n, d, op, count});
}

TEST_P(Algorithms, HalvingDoublingAllreduceEverySizeDtypeOpAndWorld) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                          DType::kInt32,   DType::kInt64,   DType::kInt8,     DType::kUInt8};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax};
  for (int n = 1; n <= 8; ++n)
    for (DType d : dtypes)
      for (ReduceOp op : ops)
        for (int64_t count :
             {int64_t{0}, int64_t{1}, int64_t{n - 1}, int64_t{3 * n + 1}, int64_t{1001}})
          check_allreduce(fabrics_, {Algo::kHalvingDoubling, n, d, op, count});
}

TEST_P(Algorithms, RingAllreduceLargePipelined) {
  // 24 MiB of float32 over 4 ranks with 256 KiB segments; 3 MiB odd-sized at 7.
  check_allreduce(fabrics_, {Algo::kRing, 4, DType::kFloat32, ReduceOp::kSum, (24 << 20) / 4},
                  256 << 10);
  check_allreduce(fabrics_, {Algo::kRing, 7, DType::kFloat16, ReduceOp::kSum, (3 << 20) / 2 + 3},
                  64 << 10);
}

TEST_P(Algorithms, RingAllgatherVariableBlocks) {
  for (int n = 1; n <= 8; ++n) {
    std::vector<Block> blocks;
    size_t off = 0;
    for (int r = 0; r < n; ++r) {
      size_t cnt = static_cast<size_t>((r * 37) % 11) * 129;  // some ranks contribute nothing
      blocks.push_back({off, cnt});
      off += cnt;
    }
    std::vector<std::vector<int32_t>> out(static_cast<size_t>(n));
    run_ranks(n, [&](int r, Transport& t) {
      std::vector<char> scratch;
      AlgoContext ctx{t};
      ctx.ring_segment_bytes = 1024;
      ctx.scratch = &scratch;
      std::vector<int32_t> buf(off, -1);
      for (size_t i = 0; i < blocks[r].count; ++i)
        buf[blocks[r].offset + i] = r * 100000 + static_cast<int32_t>(i);
      ring(ctx, buf.data(), DType::kInt32, ReduceOp::kSum, blocks, false, true);
      out[static_cast<size_t>(r)] = std::move(buf);
    });
    for (int r = 0; r < n; ++r)
      for (int b = 0; b < n; ++b)
        for (size_t i = 0; i < blocks[b].count; ++i)
          ASSERT_EQ(out[r][blocks[b].offset + i], b * 100000 + static_cast<int32_t>(i));
  }
}

TEST_P(Algorithms, RingReduceScatterEachRankGetsItsBlock) {
  for (int n = 1; n <= 8; ++n) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{2 * n + 1}, int64_t{10007}}) {
      auto blocks = even_blocks(static_cast<size_t>(count), n);
      std::vector<Array> out(static_cast<size_t>(n));
      run_ranks(n, [&](int r, Transport& t) {
        std::vector<char> scratch;
        AlgoContext ctx{t};
        ctx.ring_segment_bytes = 2048;
        ctx.scratch = &scratch;
        Array a = make_input(ReduceOp::kSum, DType::kFloat64, r, count);
        ring(ctx, a.data(), DType::kFloat64, ReduceOp::kSum, blocks, true, false);
        out[static_cast<size_t>(r)] = std::move(a);
      });
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < blocks[r].count; ++i) {
          int64_t e = static_cast<int64_t>(blocks[r].offset + i);
          ASSERT_EQ(get_element(out[r], e), reference(ReduceOp::kSum, DType::kFloat64, n, e));
        }
    }
  }
}

TEST_P(Algorithms, BroadcastEveryRootTreeAndChain) {
  for (int n = 1; n <= 8; ++n) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}, size_t{300001}}) {
      for (int root = 0; root < n; ++root) {
        std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n));
        run_ranks(n, [&](int r, Transport& t) {
          std::vector<char> scratch;
          AlgoContext ctx{t};
          ctx.ring_segment_bytes = 32 << 10;
          ctx.small_allreduce_bytes = 4096;
          ctx.scratch = &scratch;
          std::vector<uint8_t> buf(bytes, 0);
          if (r == root)
            for (size_t i = 0; i < bytes; ++i)
              buf[i] = static_cast<uint8_t>(i * 31 + root);
          broadcast(ctx, buf.data(), bytes, root);
          out[static_cast<size_t>(r)] = std::move(buf);
        });
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < bytes; ++i)
            ASSERT_EQ(out[r][i], static_cast<uint8_t>(i * 31 + root)) << n << " " << root;
      }
    }
  }
}

TEST_P(Algorithms, BarrierNoRankLeavesBeforeAllArrive) {
  for (int n = 1; n <= 8; ++n) {
    std::atomic<int> arrived{0};
    run_ranks(n, [&](int, Transport& t) {
      std::vector<char> scratch;
      AlgoContext ctx{t};
      ctx.scratch = &scratch;
      arrived.fetch_add(1);
      barrier(ctx);
      EXPECT_EQ(arrived.load(), n);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(EveryTransport, Algorithms,
                         ::testing::Values(Kind::kInProcess, Kind::kTcp, Kind::kShm),
                         [](const auto& info) { return testing::kind_name(info.param); });

TEST(Transport, ClosedPeerFailsPendingReceive) {
  InProcessFabric fabric(2);
  auto a = fabric.endpoint(0);
  auto b = fabric.endpoint(1);
  char buf[4];
  Request r = irecv(*a, 1, 9, buf, sizeof buf);
  b->close(Status(ErrorCode::kPeerFailure, "test killed rank 1"));
  EXPECT_THROW(r.wait(Clock::now() + Millis(1000), "recv"), PeerFailure);
  // Later posts to the dead rank fail at once.
  EXPECT_THROW(isend(*a, 1, 9, buf, 4).wait(Clock::now() + Millis(1000), "send"), PeerFailure);
}

TEST(Transport, WaitTimesOut) {
  InProcessFabric fabric(2);
  auto a = fabric.endpoint(0);
  auto b = fabric.endpoint(1);
  char buf[4];
  Request r = irecv(*a, 1, 9, buf, sizeof buf);
  EXPECT_THROW(r.wait(Clock::now() + Millis(20), "recv"), Timeout);
}

TEST(Transport, SizeMismatchIsProtocolError) {
  InProcessFabric fabric(2);
  auto a = fabric.endpoint(0);
  auto b = fabric.endpoint(1);
  char buf[8] = {};
  Request r = irecv(*a, 1, 5, buf, 4);
  Request s = isend(*b, 0, 5, buf, 8);
  EXPECT_THROW(r.wait(Clock::now() + Millis(1000), "recv"), ProtocolError);
}

// The transport's contract: close() returns only after every completion of
// the closing rank has run. A peer's close that fails this rank's receive
// runs its completion on the peer's thread; closing this rank meanwhile must
// wait for it (the owner is freed right after: the elastic store's
// heap-use-after-free under load).
TEST(Transport, CloseWaitsForACompletionAnotherRanksCloseIsRunning) {
  InProcessFabric fabric(2);
  auto a = fabric.endpoint(0);
  auto b = fabric.endpoint(1);
  char buf[4];
  std::atomic<bool> started{false}, finished{false};
  a->post_recv(1, 9, buf, sizeof buf, [&](const Status& st) {
    EXPECT_FALSE(st.is_ok());
    started = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    finished = true;
  });
  std::thread killer([&] { b->close(Status(ErrorCode::kPeerFailure, "test killed rank 1")); });
  while (!started)
    std::this_thread::yield();
  a->close(Status(ErrorCode::kPeerFailure, "rank 0 shuts down"));
  EXPECT_TRUE(finished) << "close() returned while its completion was still running";
  killer.join();
}

// A completion may close its own rank without waiting for itself.
TEST(Transport, ACompletionMayCloseItsOwnRank) {
  InProcessFabric fabric(2);
  auto a = fabric.endpoint(0);
  auto b = fabric.endpoint(1);
  char in[4], out[4] = {1, 2, 3, 4};
  const auto t0 = Clock::now();
  a->post_recv(1, 9, in, sizeof in, [&](const Status& st) {
    EXPECT_TRUE(st.is_ok());
    a->close(Status(ErrorCode::kPeerFailure, "closed from its own completion"));
  });
  Request s = isend(*b, 0, 9, out, sizeof out);
  s.wait(Clock::now() + Millis(5000), "send");
  EXPECT_LT(Clock::now() - t0, Millis(5000));
  EXPECT_EQ(in[3], 4);
}

}  // namespace
}  // namespace pushpull::collective
