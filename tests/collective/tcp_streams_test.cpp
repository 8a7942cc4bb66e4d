// SPDX-License-Identifier: Apache-2.0
// The direct data streams of TcpTransport (tcp_streams.h) under the
// algorithms, ranks as threads with real sockets on loopback: every
// algorithm's stream path against local references (sizes that take the
// recursive-doubling, halving-doubling and ring paths, several segments and
// scratch slots, the ring's writer and reader threads), bit-identical results on every rank,
// broadcast from a non-zero root, a size mismatch turning into an error (not a hang), and close()
// waking a rank blocked on its streams.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "collective/algorithms.h"
#include "harness.h"
#include "tcp_group.h"
#include "transport/tcp/tcp_streams.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::collective {

using transport::TcpTransport;

namespace {

using testing::make_input;
using testing::reference;

std::vector<std::unique_ptr<TcpTransport>> connect_group(int n) {
  return testing::connect_tcp_group(n, Millis(10000));
}

// fn(rank, ctx) on n threads over one connected group; rethrows the first error.
void run_group(int n, const std::function<void(int, AlgoContext&)>& fn,
               uint64_t segment = 1 << 20) {
  auto ts = connect_group(n);
  for (auto& t : ts)
    ASSERT_TRUE(t->has_streams());
  testing::on_threads(n, [&](int r) {
    std::vector<char> scratch;
    AlgoContext ctx{*ts[r]};
    ctx.peer_timeout = Millis(10000);
    ctx.ring_segment_bytes = segment;
    ctx.scratch = &scratch;
    fn(r, ctx);
  });
}

TEST(TcpStreams, AllreduceEveryPathMatchesReference) {
  for (int n : {2, 3, 4, 5}) {
    // 1 element; recursive doubling (<= 16 KiB); halving-doubling (< 64
    // KiB); ring with one segment; ring with many segments and slots; ring
    // with the writer thread (>= 4 MiB), and the reader thread (>= 16 MiB).
    const std::vector<int64_t> counts = {
        1, 1001, 12289, 70001, (3 << 20) / 4 + 3, (5 << 20) / 4 + 5, (17 << 20) / 4 + 1};
    std::vector<std::vector<std::vector<char>>> results(counts.size(),
                                                        std::vector<std::vector<char>>(n));
    run_group(
        n,
        [&](int r, AlgoContext& ctx) {
          for (size_t c = 0; c < counts.size(); ++c) {
            for (auto [op, dtype] : {std::pair{ReduceOp::kSum, DType::kFloat32},
                                     std::pair{ReduceOp::kMax, DType::kInt32},
                                     std::pair{ReduceOp::kSum, DType::kFloat16}}) {
              Array a = make_input(op, dtype, r, counts[c]);
              ++ctx.op_id;
              allreduce(ctx, a.data(), static_cast<size_t>(counts[c]), dtype, op);
              for (int64_t i = 0; i < counts[c]; i += 97)
                ASSERT_EQ(get_element(a, i), reference(op, dtype, n, i))
                    << "n=" << n << " count=" << counts[c] << " element " << i;
              ASSERT_EQ(get_element(a, counts[c] - 1), reference(op, dtype, n, counts[c] - 1));
              if (dtype == DType::kFloat32) {
                const char* p = static_cast<const char*>(a.data());
                results[c][r].assign(p, p + a.nbytes());
              }
            }
          }
        },
        64 << 10);  // small segments: many units, scratch slots reused
    for (size_t c = 0; c < counts.size(); ++c)
      for (int r = 1; r < n; ++r)
        EXPECT_EQ(results[c][r], results[c][0]) << "rank " << r << " differs, count " << counts[c];
  }
}

TEST(TcpStreams, BroadcastAndBarrier) {
  for (int n : {2, 3, 5}) {
    run_group(n, [&](int r, AlgoContext& ctx) {
      for (size_t bytes : {size_t{1}, size_t{5000}, size_t{3 << 20}}) {
        std::vector<uint8_t> b(bytes, r == n - 1 ? 0 : 1);
        if (r == n - 1)
          for (size_t i = 0; i < bytes; ++i)
            b[i] = static_cast<uint8_t>(i * 7 + 3);
        ++ctx.op_id;
        broadcast(ctx, b.data(), bytes, n - 1);
        for (size_t i = 0; i < bytes; i += 13)
          ASSERT_EQ(b[i], static_cast<uint8_t>(i * 7 + 3)) << "rank " << r << " byte " << i;
        ++ctx.op_id;
        barrier(ctx);
      }
    });
  }
}

TEST(TcpStreams, MismatchedSizesFailInsteadOfHanging) {
  auto t0 = std::chrono::steady_clock::now();
  std::atomic<int> failed{0};
  run_group(2, [&](int r, AlgoContext& ctx) {
    ctx.peer_timeout = Millis(2000);
    std::vector<float> v(r == 0 ? 100000 : 100001, 1.0f);
    ++ctx.op_id;
    try {
      allreduce(ctx, v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
    } catch (const Error& e) {
      ++failed;
      // Either side may notice first; both must name what went wrong.
      EXPECT_TRUE(e.code() == ErrorCode::kProtocolError || e.code() == ErrorCode::kTimeout ||
                  e.code() == ErrorCode::kPeerFailure)
          << e.what();
      ctx.transport.close(Status(ErrorCode::kPeerFailure, "test: giving up"));
    }
  });
  EXPECT_EQ(failed.load(), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
}

TEST(TcpStreams, CloseWakesABlockedRank) {
  // 1 KiB: the caller's own poll loop; 4 MiB: + writer thread; 20 MiB: + reader thread.
  for (size_t count : {size_t{256}, size_t{1} << 20, size_t{5} << 20}) {
    auto ts = connect_group(2);
    std::vector<char> scratch;
    AlgoContext ctx{*ts[0]};
    ctx.peer_timeout = Millis(20000);
    ctx.scratch = &scratch;
    std::vector<float> v(count, 1.0f);
    std::thread closer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ts[0]->close(Status(ErrorCode::kPeerFailure, "test closed rank 0"));
    });
    auto t0 = std::chrono::steady_clock::now();
    try {
      allreduce(ctx, v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);  // rank 1 never joins
      ADD_FAILURE() << "allreduce without its peer returned, count " << count;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("test closed rank 0"), std::string::npos)
          << "count " << count << ": " << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << count;
    closer.join();
  }
}

TEST(TcpStreams, PeerGoneIsPeerFailure) {
  auto ts = connect_group(3);
  ts[2]->close(Status(ErrorCode::kPeerFailure, "rank 2 left"));
  std::vector<char> scratch;
  AlgoContext ctx{*ts[1]};  // rank 1's right neighbour is rank 2
  ctx.peer_timeout = Millis(20000);
  ctx.scratch = &scratch;
  std::vector<float> v(5 << 20, 1.0f);  // 20 MiB: writer and reader threads
  try {
    allreduce(ctx, v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
    ADD_FAILURE() << "allreduce with a closed peer returned";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pushpull::collective
