// SPDX-License-Identifier: Apache-2.0
// Process sets (Communicator ops with `members`) and join's return value, over
// the in-process transport: only the members submit, the others are never
// blocked, reduce_scatter splits among the members, and misuse is refused at
// once on the misusing rank.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "collective/messages.h"
#include "group.h"
#include "pushpull/collective.h"

namespace pushpull::collective {
namespace {

using testing::Group;

double at(const Array& a, int64_t i) {
  return static_cast<const float*>(a.data())[i];
}

TEST(ProcessSets, OnlyMembersSubmitAndTheOthersAreNotBlocked) {
  const int n = 4;
  Group g(n);
  const std::vector<int> odd = {1, 3};
  g.run([&](int r, Communicator& c) {
    if (r % 2 == 1) {
      Array sum = Array::full(Shape{5}, r);
      Array sum2 = Array::full(Shape{7}, 2 * r);
      auto h1 = c.allreduce_async("s", sum, sum, Reduction::kSum, odd);
      auto h2 = c.allreduce_async("s2", sum2, sum2, Reduction::kSum, odd);  // may fuse with "s"
      c.wait(h1);
      c.wait(h2);
      EXPECT_EQ(at(sum, 4), 1 + 3);
      EXPECT_EQ(at(sum2, 6), 2 + 6);

      Array avg = Array::full(Shape{2}, r);
      c.wait(c.allreduce_async("a", avg, avg, Reduction::kAverage, odd));
      EXPECT_EQ(at(avg, 0), 2.0);  // divided by the members, not by size()

      Array rows = Array::full(Shape{r, 2}, r);  // rank 1: 1 row, rank 3: 3 rows
      Array got = c.take_output(c.allgather_async("g", rows, odd));
      ASSERT_EQ(got.shape(), (Shape{4, 2}));
      EXPECT_EQ(at(got, 0), 1.0);
      EXPECT_EQ(at(got, 7), 3.0);

      Array b = Array::full(Shape{3}, r);
      c.wait(c.broadcast_async("b", b, 3, odd));
      EXPECT_EQ(at(b, 2), 3.0);

      // 5 rows among 2 members: 3 and 2 (the first member one more).
      Array in = Array::full(Shape{5, 1}, 1.0);
      Array part = c.take_output(c.reduce_scatter_async("rs", in, Reduction::kSum, odd));
      ASSERT_EQ(part.shape(), (Shape{r == 1 ? 3 : 2, 1}));
      EXPECT_EQ(at(part, 0), 2.0);
    } else {
      // Rank 0 and 2 never submit the set's ops; they run their own.
      Array x = Array::full(Shape{1}, 1.0);
      c.wait(c.allreduce_async("even", x, x, Reduction::kSum, {0, 2}));
      EXPECT_EQ(at(x, 0), 2.0);
    }
    Array all = Array::full(Shape{1}, 1.0);
    c.allreduce("everyone", all);
    EXPECT_EQ(at(all, 0), n);
  });
}

TEST(ProcessSets, MisuseIsRefusedAtOnce) {
  Group g(3);
  Array a = Array::full(Shape{2}, 1.0);
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(g[0].allreduce_async("x", a, a, Reduction::kSum, {1, 2}), InvalidArgument);
  EXPECT_THROW(g[0].allreduce_async("x", a, a, Reduction::kSum, {0, 3}), InvalidArgument);
  EXPECT_THROW(g[0].broadcast_async("b", a, 2, {0, 1}), InvalidArgument);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // The group is still usable.
  g.run([&](int, Communicator& c) {
    Array x = Array::full(Shape{1}, 1.0);
    c.allreduce("after", x);
    EXPECT_EQ(at(x, 0), 3.0);
  });
}

TEST(ProcessSets, MembersThatDisagreeFailOnEveryMember) {
  Group g(3);
  g.run([&](int r, Communicator& c) {
    if (r == 2) return;
    Array x = Array::full(Shape{1}, 1.0);
    // Rank 0 says {0, 1}, rank 1 (later) {0, 1, 2}: the first spec names the
    // set the coordinator waits for, so once rank 0 and 1 are in, the
    // mismatch fails the op on both (rank 2 never submits).
    std::vector<int> members = r == 0 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2};
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_THROW(c.wait(c.allreduce_async("m", x, x, Reduction::kSum, members)), InvalidArgument);
  });
}

TEST(ProcessSets, SpecMembersRoundTripAndBadMembersAreRejected) {
  Spec s;
  s.name = "t";
  s.shape = Shape{2};
  s.members = {0, 2};
  Announce a;
  a.specs = {s};
  Announce got = decode_announce(encode(a), 3);
  EXPECT_EQ(got.specs.at(0).members, s.members);
  for (auto bad : {std::vector<int32_t>{2, 0}, {0, 0}, {0, 3}, {-1}}) {
    a.specs[0].members = bad;
    EXPECT_THROW(decode_announce(encode(a), 3), ProtocolError);
  }
}

TEST(Join, AllgatherAndBroadcastFailOnEveryRankWhileAMemberIsJoined) {
  // As Horovod: reductions go on with a joined rank's zeros, an allgather or a
  // broadcast (even from a rank still there) fails on every rank that
  // submitted it; a set whose members are all still there is not affected.
  const int n = 3;
  Group g(n);
  g.run([&](int r, Communicator& c) {
    if (r != 0) {
      Array x = Array::full(Shape{2}, 1.0);
      c.allreduce("sum", x);
      EXPECT_EQ(at(x, 0), 2.0);
      try {
        c.take_output(c.allgather_async("g", x));
        ADD_FAILURE() << "allgather with rank 0 joined did not fail on rank " << r;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("[0] have joined"), std::string::npos) << e.what();
      }
      EXPECT_THROW(c.wait(c.broadcast_async("b", x, 1)), InvalidArgument);
      Array y = Array::full(Shape{2}, static_cast<double>(r));
      c.wait(c.broadcast_async("b12", y, 2, {1, 2}));  // rank 0 is not a member
      EXPECT_EQ(at(y, 1), 2.0);
    }
    c.join();
  });
}

TEST(Join, ReturnsTheRankThatJoinedLast) {
  const int n = 3;
  Group g(n);
  g.run([&](int r, Communicator& c) {
    // Rank 1 keeps working after the others joined, so it joins last.
    if (r == 1) {
      for (int i = 0; i < 3; ++i) {
        Array x = Array::full(Shape{2}, 1.0);
        c.allreduce("late" + std::to_string(i), x);
        EXPECT_EQ(at(x, 0), 1.0);  // the joined ranks contribute zeros
      }
    }
    EXPECT_EQ(c.join(), 1);
  });
}

}  // namespace
}  // namespace pushpull::collective
