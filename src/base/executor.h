// SPDX-License-Identifier: Apache-2.0
// ShardedExecutor: N worker threads; each task names a shard (e.g. a key's
// hash) and runs on thread shard % N, so tasks of one shard run one at a time
// in submission order, while tasks of different shards may run concurrently.
// The local KVStore uses it for per-key ordering of pushes and pulls, and the
// parameter server for its per-key update ordering.
//
// Completion is a countdown latch carrying the first error: an operation made
// of several tasks (one per key) shares one Completion, and its waiter learns
// of every part's outcome at once. TaskHandle is the waiter's side.
//
// Ownership: the executor owns its threads (joined by the destructor, after
// every task already queued has run). Tasks own what their std::function
// captures. Thread safety: submit(), wait_idle() and every Completion /
// TaskHandle method may be called from any thread. A task must not wait on a
// task of its own shard (it would wait for itself); waits have deadlines, so
// that mistake is a Timeout, not a hang.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull {

class Completion {
 public:
  // `parts`: how many finish() calls complete it (0: complete at once).
  explicit Completion(int parts = 1);
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;

  // One part is done; `s` is its outcome. The first error is kept.
  void finish(const Status& s = Status::ok());
  bool done() const;
  // Blocks until done or until `timeout` passes. Returns the first error of
  // the parts, a Timeout status when the deadline passed, or ok.
  Status wait_for(Millis timeout) const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  int pending_;
  Status status_;
};

// The waiter's side of one or more tasks. Copyable; an empty handle is done.
class TaskHandle {
 public:
  TaskHandle() = default;
  explicit TaskHandle(std::shared_ptr<Completion> c) : c_(std::move(c)) {}
  bool done() const { return !c_ || c_->done(); }
  // Blocks up to `timeout`; throws the task's exception type (see Status) or
  // Timeout.
  void wait(Millis timeout) const;
  Status wait_for(Millis timeout) const { return c_ ? c_->wait_for(timeout) : Status::ok(); }
  const std::shared_ptr<Completion>& completion() const { return c_; }

 private:
  std::shared_ptr<Completion> c_;
};

class ShardedExecutor {
 public:
  // `num_threads` >= 1; `name` labels the threads (visible in debuggers).
  // `num_threads` = 0: manual mode, no thread at all: tasks run, in
  // submission order, when the owner calls run_queued() (or wait_idle /
  // run_exclusive / the destructor). The deterministic simulation
  // (tests/sim/) drives servers this way: nothing runs behind its back.
  explicit ShardedExecutor(int num_threads, std::string name = "pp-exec");
  // Runs every task already queued, then joins the threads.
  ~ShardedExecutor();
  ShardedExecutor(const ShardedExecutor&) = delete;
  ShardedExecutor& operator=(const ShardedExecutor&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()); }
  // The thread index that runs tasks of `shard`.
  int thread_of(uint64_t shard) const { return static_cast<int>(shard % workers_.size()); }

  // Queues `fn` on the thread of `shard`; never blocks. An exception thrown
  // by `fn` is captured as the handle's status.
  TaskHandle submit(uint64_t shard, std::function<void()> fn);
  // Same, but finishes one part of `done` (which may be shared by several
  // tasks) instead of making a new handle.
  void submit(uint64_t shard, std::function<void()> fn, std::shared_ptr<Completion> done);

  // Manual mode: runs queued tasks (and those they submit) until none is
  // left; returns how many ran. 0 with threads.
  size_t run_queued();

  // Blocks until every task submitted before this call has run, or until
  // `timeout` passes (Timeout). Must not be called from a task.
  void wait_idle(Millis timeout);

  // Runs `fn` on the calling thread once every task submitted before the call
  // has run, while every worker thread is parked (so `fn` may read or replace
  // state the tasks own, e.g. to save or load optimizer states). Timeout if
  // the workers are not all parked within `timeout`; `fn`'s exception
  // propagates. The workers resume when it returns. Must not be called from a task.
  void run_exclusive(const std::function<void()>& fn, Millis timeout);

 private:
  struct Task {
    std::function<void()> fn;
    std::shared_ptr<Completion> done;
  };
  struct Worker {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Task> queue;
    bool stop = false;
    std::thread thread;
  };
  void run(Worker& w);
  // Runs one task; its exception becomes its handle's status.
  static void run_task(Task& task);

  std::vector<std::unique_ptr<Worker>> workers_;
  bool manual_ = false;  // num_threads == 0: one queue, no thread
};

// A 64-bit mix of `x` (splitmix64 finaliser), so shard numbers derived from
// small consecutive keys spread over threads.
inline uint64_t mix_hash(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace pushpull
