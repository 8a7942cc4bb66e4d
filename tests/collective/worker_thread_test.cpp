// SPDX-License-Identifier: Apache-2.0
// WorkerThread: one thread for every job, jobs one at a time, clean teardown.
#include "transport/worker_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "pushpull/error.h"

namespace pushpull::collective {

using transport::WorkerThread;

namespace {

TEST(WorkerThread, RunsEveryJobOnTheSameThread) {
  WorkerThread w;
  std::thread::id first, later;
  w.start([&] { first = std::this_thread::get_id(); });
  w.wait();
  for (int i = 0; i < 100; ++i) {
    w.start([&] { later = std::this_thread::get_id(); });
    w.wait();
    ASSERT_EQ(later, first);
  }
  EXPECT_NE(first, std::this_thread::get_id());
}

TEST(WorkerThread, WaitWithoutAJobReturnsAtOnce) {
  WorkerThread w;
  w.wait();
}

TEST(WorkerThread, AJobThatThrowsDoesNotStopTheThread) {
  WorkerThread w;
  w.start([] { throw std::runtime_error("reported elsewhere"); });
  w.wait();
  std::atomic<bool> ran{false};
  w.start([&] { ran = true; });
  w.wait();
  EXPECT_TRUE(ran);
}

TEST(WorkerThread, AJobGivenWhileBusyIsRefused) {
  WorkerThread w;
  std::atomic<bool> release{false};
  w.start([&] {
    while (!release)
      std::this_thread::yield();
  });
  EXPECT_THROW(w.start([] {}), Error);
  release = true;
  w.wait();
}

TEST(WorkerThread, DestructionWaitsForTheRunningJob) {
  std::atomic<bool> done{false};
  {
    WorkerThread w;
    w.start([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done = true;
    });
  }
  EXPECT_TRUE(done);
}

}  // namespace
}  // namespace pushpull::collective
