// SPDX-License-Identifier: Apache-2.0
// Rank 0's scheduling (Coordinator::poll) at explicit times: which ready
// tensors wait for the cycle, which go out at once, and which are fused.
#include <gtest/gtest.h>

#include "collective/coordinator.h"

namespace pushpull::collective {

using transport::Clock;

namespace {

using namespace std::chrono_literals;

Spec allreduce(const std::string& name, int64_t floats) {
  Spec s;
  s.name = name;
  s.shape = Shape{floats};
  return s;
}

CollectiveOptions opts() {
  CollectiveOptions o;
  o.cycle_time_ms = 5;
  o.fusion_threshold_bytes = 64 << 20;
  return o;
}

const auto t0 = Clock::time_point{} + 1h;
constexpr int64_t kLarge = kZeroCopyAllreduceBytes / 4;  // floats

std::vector<Response> poll(Coordinator& c, Clock::time_point now) {
  std::vector<StallReport> stalls;
  return c.poll(now, &stalls);
}

TEST(Scheduling, ASmallReadyTensorWaitsTheCycleWhileAnotherIsPartlySubmitted) {
  ResponseCache cache;
  Coordinator c(2, opts(), cache);
  c.submit(0, allreduce("a", 16), t0);
  c.submit(1, allreduce("a", 16), t0);
  c.submit(0, allreduce("b", 16), t0);  // rank 1 has not submitted b yet
  EXPECT_TRUE(poll(c, t0 + 1ms).empty());
  EXPECT_EQ(c.next_deadline(t0 + 1ms), t0 + 5ms);
  c.submit(1, allreduce("b", 16), t0 + 2ms);
  auto rs = poll(c, t0 + 2ms);  // nothing pending any more: out at once, fused
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].tensors.size(), 2u);
}

TEST(Scheduling, ALargeReadyTensorGoesOutAtOnceAloneWithTheSmallOnesReady) {
  ResponseCache cache;
  Coordinator c(2, opts(), cache);
  for (int r = 0; r < 2; ++r) {
    c.submit(r, allreduce("small1", 16), t0);
    c.submit(r, allreduce("big", kLarge), t0);
    c.submit(r, allreduce("small2", 16), t0);
  }
  c.submit(0, allreduce("later", 16), t0);  // partly submitted: would hold small ones back
  auto rs = poll(c, t0);
  ASSERT_EQ(rs.size(), 3u) << "small1 | big alone | small2, in the order they became ready";
  ASSERT_EQ(rs[0].tensors.size(), 1u);
  EXPECT_EQ(rs[0].tensors[0].name, "small1");
  ASSERT_EQ(rs[1].tensors.size(), 1u);
  EXPECT_EQ(rs[1].tensors[0].name, "big");
  ASSERT_EQ(rs[2].tensors.size(), 1u);
  EXPECT_EQ(rs[2].tensors[0].name, "small2");
}

TEST(Scheduling, LargeTensorsAreNeverFusedWithEachOther) {
  ResponseCache cache;
  Coordinator c(2, opts(), cache);
  for (int r = 0; r < 2; ++r) {
    c.submit(r, allreduce("x", kLarge), t0);
    c.submit(r, allreduce("y", kLarge), t0);
  }
  auto rs = poll(c, t0);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].tensors.size(), 1u);
  EXPECT_EQ(rs[1].tensors.size(), 1u);
}

TEST(Scheduling, AJustSmallerTensorStillFuses) {
  ResponseCache cache;
  Coordinator c(2, opts(), cache);
  for (int r = 0; r < 2; ++r) {
    c.submit(r, allreduce("x", kLarge - 1), t0);
    c.submit(r, allreduce("y", kLarge - 1), t0);
  }
  auto rs = poll(c, t0);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].tensors.size(), 2u);
}

TEST(Scheduling, ABroadcastDoesNotWaitTheCycle) {
  ResponseCache cache;
  Coordinator c(2, opts(), cache);
  Spec b = allreduce("bcast", 16);
  b.type = OpType::kBroadcast;
  c.submit(0, b, t0);
  c.submit(1, b, t0);
  c.submit(0, allreduce("pending", 16), t0);
  auto rs = poll(c, t0);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].tensors[0].name, "bcast");
}

TEST(Scheduling, AnAllgatherFailsAtOnceOnTheRanksThatSubmittedItWhileAMemberHasJoined) {
  // Rank 1 joined; ranks 0 and 2 each submit an allgather under a different
  // name (unnamed ops are numbered per rank): each fails at once, without
  // waiting for the other's submission, which would never come. A reduction
  // still waits for every member that has not joined.
  ResponseCache cache;
  Coordinator c(3, opts(), cache);
  c.join(1, t0);
  Spec g = allreduce("allgather.noname.3", 16);
  g.type = OpType::kAllgather;
  c.submit(0, g, t0);
  auto rs = poll(c, t0 + 10ms);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kError);
  EXPECT_EQ(rs[0].code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(rs[0].tensors[0].name, "allgather.noname.3");
  EXPECT_NE(rs[0].message.find("joined"), std::string::npos) << rs[0].message;
  g.name = "allgather.noname.4";
  c.submit(2, g, t0 + 10ms);
  rs = poll(c, t0 + 20ms);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kError);
  EXPECT_EQ(rs[0].tensors[0].name, "allgather.noname.4");
  c.submit(0, allreduce("sum", 16), t0 + 20ms);
  EXPECT_TRUE(poll(c, t0 + 30ms).empty());  // rank 2 has not submitted it
  c.submit(2, allreduce("sum", 16), t0 + 30ms);
  rs = poll(c, t0 + 40ms);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, Response::Kind::kExecute);
  EXPECT_EQ(rs[0].joined, std::vector<int>{1});
}

}  // namespace
}  // namespace pushpull::collective
