// SPDX-License-Identifier: Apache-2.0
// The engine and the public API over the in-process transport when ranks
// disagree or fail: mismatched shapes, a missing tensor, a stall at
// shutdown, join with uneven batches, dead ranks (with pending handles and
// during a large allreduce), a duplicate pending name.
#include "pushpull/collective.h"

#include <gtest/gtest.h>

#include "group.h"
#include "harness.h"

namespace pushpull::collective {
namespace {

using testing::fast_options;
using testing::Group;

TEST(Communicator, MismatchedShapesFailOnEveryRank) {
  Group g(3);
  g.run([&](int r, Communicator& c) {
    Array a(r == 1 ? Shape{3, 2} : Shape{2, 3}, DType::kFloat32);
    try {
      c.allreduce("weights", a);
      FAIL() << "rank " << r << " did not fail";
    } catch (const InvalidArgument& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("weights"), std::string::npos) << m;
      EXPECT_NE(m.find("rank 1: allreduce float32(3, 2)"), std::string::npos) << m;
      EXPECT_NE(m.find("rank 0: allreduce float32(2, 3)"), std::string::npos) << m;
    }
    // The group still works afterwards.
    Array b(Shape{4}, DType::kFloat32);
    for (int i = 0; i < 4; ++i)
      set_element(b, i, 1);
    c.allreduce("after", b);
    EXPECT_EQ(get_element(b, 3), 3);
  });
}

TEST(Communicator, MissingTensorWarnsThenCompletes) {
  auto opts = fast_options();
  opts.collective.stall_warning_seconds = 0.1;
  std::mutex mu;
  std::vector<StallReport> reports;
  opts.on_stall = [&](const StallReport& s) {
    std::lock_guard lock(mu);
    reports.push_back(s);
  };
  Group g(3, opts);
  g.run([&](int r, Communicator& c) {
    Array a = Array::full(Shape{5}, 1.0);
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(400));
    c.allreduce("late", a);
    EXPECT_EQ(get_element(a, 0), 3);
  });
  std::lock_guard lock(mu);
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports[0].tensor, "late");
  EXPECT_EQ(reports[0].missing_ranks, std::vector<int>{2});
}

TEST(Communicator, StallShutdownFailsTheWaitingRanks) {
  auto opts = fast_options();
  opts.collective.stall_warning_seconds = 0.05;
  opts.collective.stall_shutdown_seconds = 0.2;
  Group g(3, opts);
  g.run([&](int r, Communicator& c) {
    if (r == 1) return;  // never submits
    Array a = Array::full(Shape{5}, 1.0);
    try {
      c.allreduce("orphan", a);
      FAIL() << "no stall error on rank " << r;
    } catch (const Timeout& e) {
      EXPECT_NE(std::string(e.what()).find("[1]"), std::string::npos) << e.what();
    }
  });
}

TEST(Communicator, JoinWithUnevenBatches) {
  const int n = 4;
  Group g(n);
  g.run([&](int r, Communicator& c) {
    for (int b = 0; b <= r; ++b) {  // rank r has r+1 batches
      Array sum = Array::full(Shape{33}, r + 1);
      Array avg = Array::full(Shape{33}, r + 1);
      Array mx = Array::full(Shape{2}, r + 1);
      auto h1 = c.allreduce_async(fmt::format("sum{}", b), sum, sum, Reduction::kSum);
      auto h2 = c.allreduce_async(fmt::format("avg{}", b), avg, avg, Reduction::kAverage);
      auto h3 = c.allreduce_async(fmt::format("max{}", b), mx, mx, Reduction::kMax);
      c.wait(h1), c.wait(h2), c.wait(h3);
      // Contributors of batch b: ranks b..n-1, holding values b+1..n.
      double s = 0;
      for (int q = b; q < n; ++q)
        s += q + 1;
      EXPECT_EQ(get_element(sum, 32), s) << "batch " << b << " rank " << r;
      EXPECT_FLOAT_EQ(get_element(avg, 0), s / (n - b)) << "batch " << b;
      EXPECT_EQ(get_element(mx, 1), n);
    }
    c.join();
    // After everyone joined, the group goes on normally.
    Array a = Array::full(Shape{3}, 1.0);
    c.allreduce("after-join", a);
    EXPECT_EQ(get_element(a, 2), n);
  });
}

TEST(Communicator, DeadRankFailsEveryPendingHandle) {
  const int n = 4;
  Group g(n);
  auto start = std::chrono::steady_clock::now();
  g.run([&](int r, Communicator& c) {
    if (r == 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      c.shutdown();  // this rank dies: its endpoint closes
      return;
    }
    Array a = Array::full(Shape{1000}, 1.0);
    EXPECT_THROW(c.allreduce("never", a), PeerFailure) << "rank " << r;
    // Later ops fail at once too.
    EXPECT_THROW(c.allreduce("later", a), PeerFailure);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(Communicator, DeadRankDuringLargeAllreduce) {
  const int n = 3;
  Group g(n);
  g.run([&](int r, Communicator& c) {
    std::vector<float> v(4 << 20, 1.0f);
    auto h = c.allreduce_async("big", ArrayView(v.data(), Shape{static_cast<int64_t>(v.size())}));
    if (r == 2) {
      c.shutdown();
      return;
    }
    try {
      c.wait(h);  // may have completed before rank 2 left; later ops must fail
      c.allreduce("next", ArrayView(v.data(), Shape{16}));
      FAIL() << "rank " << r << " did not see the dead rank";
    } catch (const PeerFailure& e) {
      EXPECT_NE(std::string(e.what()).find("rank"), std::string::npos);
    }
  });
}

TEST(Communicator, DuplicatePendingNameIsRejected) {
  Group g(2);
  Array a = Array::full(Shape{2}, 1.0);
  auto h = g[0].allreduce_async("x", a);
  EXPECT_THROW(g[0].allreduce_async("x", a), InvalidArgument);
  EXPECT_THROW(g[0].broadcast_async("y", a, 5), InvalidArgument);
  g.run([&](int r, Communicator& c) {
    if (r == 1)
      c.allreduce("x", a);
    else
      c.wait(h);
  });
}

}  // namespace
}  // namespace pushpull::collective
