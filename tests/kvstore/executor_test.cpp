// SPDX-License-Identifier: Apache-2.0
#include "base/executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <vector>

namespace pushpull {
namespace {

using namespace std::chrono_literals;

TEST(ExecutorTest, RejectsNegativeThreads) {
  EXPECT_THROW(ShardedExecutor(-1), InvalidArgument);
}

TEST(ExecutorTest, ManualModeRunsNothingBehindItsOwnersBack) {
  // 0 threads (the deterministic simulation's servers): tasks, and tasks
  // they submit, run in submission order when the owner asks, on its thread.
  ShardedExecutor ex(0);
  std::vector<int> seen;
  auto h = ex.submit(3, [&] {
    seen.push_back(1);
    ex.submit(9, [&] { seen.push_back(3); });
  });
  ex.submit(5, [&] { seen.push_back(2); });
  EXPECT_TRUE(seen.empty());
  EXPECT_FALSE(h.done());
  EXPECT_EQ(ex.run_queued(), 3u);
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(h.done());
  ex.submit(1, [&] { seen.push_back(4); });
  ex.wait_idle(Millis(10));
  EXPECT_EQ(seen.size(), 4u);
}

TEST(ExecutorTest, TasksOfOneShardRunInSubmissionOrder) {
  ShardedExecutor ex(4);
  std::vector<int> seen;  // only touched by shard 7's thread
  std::vector<TaskHandle> hs;
  for (int i = 0; i < 2000; ++i)
    hs.push_back(ex.submit(7, [&seen, i] { seen.push_back(i); }));
  for (auto& h : hs)
    h.wait(10s);
  ASSERT_EQ(seen.size(), 2000u);
  for (int i = 0; i < 2000; ++i)
    ASSERT_EQ(seen[i], i);
}

TEST(ExecutorTest, DifferentShardsRunConcurrently) {
  ShardedExecutor ex(2);
  ASSERT_NE(ex.thread_of(0), ex.thread_of(1));
  // Shard 0's task waits for shard 1's: that only finishes if both run at once.
  auto b_ran = std::make_shared<Completion>(1);
  auto a = ex.submit(0, [b_ran] { b_ran->wait_for(10s).raise(); });
  auto b = ex.submit(1, [b_ran] { b_ran->finish(); });
  a.wait(10s);
  b.wait(10s);
}

TEST(ExecutorTest, TaskExceptionReachesTheWaiter) {
  ShardedExecutor ex(1);
  auto h = ex.submit(3, [] { throw InvalidArgument("bad thing"); });
  try {
    h.wait(10s);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "bad thing");
  }
  // The thread survives the exception.
  int x = 0;
  ex.submit(3, [&x] { x = 5; }).wait(10s);
  EXPECT_EQ(x, 5);
}

TEST(ExecutorTest, WaitHasADeadline) {
  ShardedExecutor ex(1);
  auto gate = std::make_shared<Completion>(1);
  auto h = ex.submit(0, [gate] { gate->wait_for(10s); });
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(h.wait(30ms), Timeout);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_FALSE(h.done());
  gate->finish();
  h.wait(10s);
  EXPECT_TRUE(h.done());
}

TEST(ExecutorTest, CompletionKeepsFirstErrorOfParts) {
  Completion c(3);
  c.finish();
  c.finish(Status(ErrorCode::kNotFound, "first"));
  EXPECT_FALSE(c.done());
  c.finish(Status(ErrorCode::kIoError, "second"));
  EXPECT_TRUE(c.done());
  Status s = c.wait_for(1ms);
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.message(), "first");
  EXPECT_TRUE(Completion(0).done());
  EXPECT_TRUE(TaskHandle().done());
}

TEST(ExecutorTest, WaitIdleWaitsForEverythingEarlier) {
  ShardedExecutor ex(3);
  std::atomic<int> n{0};
  for (int i = 0; i < 300; ++i)
    ex.submit(static_cast<uint64_t>(i), [&n] {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      ++n;
    });
  ex.wait_idle(10s);
  EXPECT_EQ(n.load(), 300);
}

TEST(ExecutorTest, RunExclusiveSeesNoConcurrentTask) {
  ShardedExecutor ex(4);
  std::atomic<int> running{0}, done{0};
  for (int i = 0; i < 200; ++i)
    ex.submit(static_cast<uint64_t>(i), [&] {
      ++running;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      ++done;
      --running;
    });
  int seen_done = -1, seen_running = -1;
  ex.run_exclusive(
      [&] {
        std::this_thread::sleep_for(5ms);
        seen_done = done.load();
        seen_running = running.load();
      },
      10s);
  EXPECT_EQ(seen_done, 200);
  EXPECT_EQ(seen_running, 0);
  // Workers resume afterwards.
  ex.submit(1, [&] { ++done; }).wait(10s);
  EXPECT_EQ(done.load(), 201);
  // An exception from the exclusive section propagates and workers still resume.
  EXPECT_THROW(ex.run_exclusive([] { throw IoError("disk"); }, 10s), IoError);
  ex.submit(2, [&] { ++done; }).wait(10s);
  EXPECT_EQ(done.load(), 202);
}

TEST(ExecutorTest, DestructorRunsQueuedTasks) {
  std::atomic<int> n{0};
  {
    ShardedExecutor ex(2);
    for (int i = 0; i < 100; ++i)
      ex.submit(static_cast<uint64_t>(i), [&n] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ++n;
      });
  }
  EXPECT_EQ(n.load(), 100);
}

TEST(ExecutorTest, SharedCompletionCountsEveryTask) {
  ShardedExecutor ex(2);
  auto c = std::make_shared<Completion>(10);
  std::atomic<int> n{0};
  for (int i = 0; i < 10; ++i)
    ex.submit(
        static_cast<uint64_t>(i), [&n] { ++n; }, c);
  TaskHandle(c).wait(10s);
  EXPECT_EQ(n.load(), 10);
}

}  // namespace
}  // namespace pushpull
