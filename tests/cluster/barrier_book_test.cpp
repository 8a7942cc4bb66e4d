// SPDX-License-Identifier: Apache-2.0
// The scheduler's barriers by member (cluster/barrier_book.h): a worker lost
// and replaced at every moment around a barrier neither completes it early
// nor deadlocks it (issue: a restarted worker deadlocked an epoch-end
// barrier, counted by connections).
#include "cluster/barrier_book.h"

#include <gtest/gtest.h>

namespace pushpull::cluster {
namespace {

constexpr uint8_t kWorkers = 1;
using M = BarrierBook::Member;

std::vector<M> workers(int n) {
  std::vector<M> out;
  for (int w = 0; w < n; ++w)
    out.emplace_back(Role::kWorker, w);
  return out;
}

BarrierTag at(uint64_t position, uint64_t seq) {
  return {true, position, seq};
}

TEST(BarrierBook, CompletesWhenEveryMemberArrivedAndAnswersEachWithItsCount) {
  BarrierBook b;
  const auto all = workers(3);
  EXPECT_TRUE(b.arrive(kWorkers, {Role::kWorker, 0}, 10, 5, {}, all).empty());
  EXPECT_TRUE(b.arrive(kWorkers, {Role::kWorker, 1}, 11, 5, {}, all).empty());
  auto done = b.arrive(kWorkers, {Role::kWorker, 2}, 12, 2, {}, all);
  ASSERT_EQ(done.size(), 3u);
  for (const auto& a : done)
    EXPECT_EQ(a.count, a.conn == 12 ? 2u : 5u);
  EXPECT_EQ(b.waiting(kWorkers), 0u);
}

TEST(BarrierBook, ALostWorkerBlocksTheBarrierUntilItsReplacementMovesPast) {
  // Workers 0 and 1 wait at the barrier after round 7 (3 keys: position 21);
  // worker 2 dies there. Its replacement resumes after round 7 and pushes
  // round 8 without calling that barrier (an epoch-end barrier).
  BarrierBook b;
  const auto all = workers(3);
  b.arrive(kWorkers, {Role::kWorker, 2}, 12, 9, at(21, 1), all);
  b.lose({Role::kWorker, 2});  // died inside the barrier
  EXPECT_TRUE(b.arrive(kWorkers, {Role::kWorker, 0}, 10, 9, at(21, 1), all).empty());
  EXPECT_TRUE(b.arrive(kWorkers, {Role::kWorker, 1}, 11, 9, at(21, 1), all).empty());
  EXPECT_TRUE(b.settle(kWorkers, all).empty()) << "completed without the lost worker";
  b.pass(2, 21);  // the replacement's first push, at position 21
  auto done = b.settle(kWorkers, all);
  EXPECT_EQ(done.size(), 2u);
  // The next barrier (after round 10: position 30) needs the replacement.
  EXPECT_TRUE(b.arrive(kWorkers, {Role::kWorker, 0}, 10, 10, at(30, 1), all).empty());
  EXPECT_TRUE(b.arrive(kWorkers, {Role::kWorker, 1}, 11, 10, at(30, 1), all).empty());
  EXPECT_EQ(b.arrive(kWorkers, {Role::kWorker, 2}, 13, 1, at(30, 1), all).size(), 3u);
}

TEST(BarrierBook, AReplacementThatPassesBeforeTheOthersArriveIsNotWaitedFor) {
  // The others are slow: the replacement pushes before they reach the
  // barrier at its position.
  BarrierBook b;
  const auto all = workers(3);
  b.lose({Role::kWorker, 1});
  b.pass(1, 21);
  EXPECT_TRUE(b.arrive(kWorkers, {Role::kWorker, 0}, 10, 4, at(21, 1), all).empty());
  EXPECT_EQ(b.arrive(kWorkers, {Role::kWorker, 2}, 12, 4, at(21, 1), all).size(), 2u);
}

TEST(BarrierBook, AReplacementCallingTheBarrierAtItsPositionMeetsTheOthers) {
  // A barrier at the start of each epoch: the replacement resumes before it
  // and calls it.
  BarrierBook b;
  const auto all = workers(2);
  b.lose({Role::kWorker, 1});
  EXPECT_TRUE(b.arrive(kWorkers, {Role::kWorker, 0}, 10, 3, at(20, 1), all).empty());
  EXPECT_EQ(b.arrive(kWorkers, {Role::kWorker, 1}, 11, 1, at(20, 1), all).size(), 2u);
}

TEST(BarrierBook, ABarrierItsPredecessorAlreadyPassedIsAnsweredAtOnce) {
  // The predecessor went through the barrier at position 20, pushed part of
  // the next round and died: its replacement resumes at position 20 and
  // calls that barrier again; the others are in the round, waiting for it.
  BarrierBook b;
  const auto all = workers(2);
  b.arrive(kWorkers, {Role::kWorker, 0}, 10, 3, at(20, 1), all);
  ASSERT_EQ(b.arrive(kWorkers, {Role::kWorker, 1}, 11, 3, at(20, 1), all).size(), 2u);
  b.lose({Role::kWorker, 1});
  auto done = b.arrive(kWorkers, {Role::kWorker, 1}, 12, 1, at(20, 1), all);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].conn, 12u);
  EXPECT_EQ(b.waiting(kWorkers), 0u);
}

TEST(BarrierBook, UntrackedBarriersIgnorePasses) {
  // dist_async (untracked): a pass never stands in for an arrival.
  BarrierBook b;
  const auto all = workers(2);
  b.pass(1, 100);
  EXPECT_TRUE(b.arrive(kWorkers, {Role::kWorker, 0}, 10, 1, {}, all).empty());
  EXPECT_EQ(b.arrive(kWorkers, {Role::kWorker, 1}, 11, 1, {}, all).size(), 2u);
}

TEST(BarrierBook, AFailedOverServerLeavesTheServersBarrier) {
  BarrierBook b;
  constexpr uint8_t kServers = 2;
  std::vector<M> live = {{Role::kServer, 0}, {Role::kServer, 1}};
  EXPECT_TRUE(b.arrive(kServers, {Role::kServer, 0}, 1, 1, {}, live).empty());
  live.pop_back();  // server 1 failed over
  b.lose({Role::kServer, 1});
  EXPECT_EQ(b.settle(kServers, live).size(), 1u);
}

}  // namespace
}  // namespace pushpull::cluster
