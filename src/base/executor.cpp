// SPDX-License-Identifier: Apache-2.0
#include "base/executor.h"

#include <pthread.h>

#include <fmt/format.h>

#include "pushpull/log.h"

namespace pushpull {

Completion::Completion(int parts) : pending_(parts) {
  if (parts < 0) throw InvalidArgument(fmt::format("Completion: negative part count {}", parts));
}

void Completion::finish(const Status& s) {
  std::lock_guard lock(mu_);
  if (!s.is_ok() && status_.is_ok()) status_ = s;
  if (pending_ > 0 && --pending_ == 0) cv_.notify_all();
}

bool Completion::done() const {
  std::lock_guard lock(mu_);
  return pending_ == 0;
}

Status Completion::wait_for(Millis timeout) const {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return pending_ == 0; }))
    return Status(ErrorCode::kTimeout,
                  fmt::format("operation not finished after {} ms ({} part(s) still running); "
                              "raise the timeout if the work is legitimately slow",
                              timeout.count(), pending_));
  return status_;
}

void TaskHandle::wait(Millis timeout) const {
  wait_for(timeout).raise();
}

ShardedExecutor::ShardedExecutor(int num_threads, std::string name) {
  if (num_threads < 0)
    throw InvalidArgument(fmt::format(
        "ShardedExecutor needs at least one thread (or 0: manual), got {}", num_threads));
  if (num_threads == 0) {
    manual_ = true;
    workers_.push_back(std::make_unique<Worker>());  // the queue, without a thread
    return;
  }
  workers_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i)
    workers_.push_back(std::make_unique<Worker>());
  for (int i = 0; i < num_threads; ++i) {
    Worker& w = *workers_[i];
    w.thread = std::thread([this, &w] { run(w); });
    // Linux limits thread names to 15 characters.
    std::string label = fmt::format("{}-{}", name, i).substr(0, 15);
    pthread_setname_np(w.thread.native_handle(), label.c_str());
  }
}

size_t ShardedExecutor::run_queued() {
  if (!manual_) return 0;
  Worker& w = *workers_[0];
  size_t ran = 0;
  for (;;) {
    Task task;
    {
      std::lock_guard lock(w.mu);
      if (w.queue.empty()) return ran;
      task = std::move(w.queue.front());
      w.queue.pop_front();
    }
    run_task(task);
    ++ran;
  }
}

ShardedExecutor::~ShardedExecutor() {
  run_queued();  // manual mode: queued work was promised to its waiters
  for (auto& w : workers_) {
    std::lock_guard lock(w->mu);
    w->stop = true;
    w->cv.notify_one();
  }
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.join();
}

void ShardedExecutor::run(Worker& w) {
  for (;;) {
    Task task;
    {
      std::unique_lock lock(w.mu);
      w.cv.wait(lock, [&] { return w.stop || !w.queue.empty(); });
      // Drain before stopping: queued work was promised to its waiters.
      if (w.queue.empty()) return;
      task = std::move(w.queue.front());
      w.queue.pop_front();
    }
    run_task(task);
  }
}

void ShardedExecutor::run_task(Task& task) {
  Status s;
  try {
    task.fn();
  } catch (...) {
    s = Status::from_current_exception();
  }
  // Drop the captures before signalling, so a waiter that returns may free
  // what they referenced.
  task.fn = nullptr;
  if (task.done) task.done->finish(s);
}

TaskHandle ShardedExecutor::submit(uint64_t shard, std::function<void()> fn) {
  auto done = std::make_shared<Completion>(1);
  submit(shard, std::move(fn), done);
  return TaskHandle(std::move(done));
}

void ShardedExecutor::submit(uint64_t shard, std::function<void()> fn,
                             std::shared_ptr<Completion> done) {
  Worker& w = *workers_[thread_of(shard)];
  std::lock_guard lock(w.mu);
  w.queue.push_back(Task{std::move(fn), std::move(done)});
  w.cv.notify_one();
}

void ShardedExecutor::wait_idle(Millis timeout) {
  if (manual_) {
    run_queued();
    return;
  }
  // A no-op on every thread: once each has run, everything queued before ran.
  auto done = std::make_shared<Completion>(num_threads());
  for (int i = 0; i < num_threads(); ++i)
    submit(
        static_cast<uint64_t>(i), [] {}, done);
  Status s = done->wait_for(timeout);
  if (s.code() == ErrorCode::kTimeout)
    throw Timeout(fmt::format("executor: queued tasks still running after {} ms", timeout.count()));
}

void ShardedExecutor::run_exclusive(const std::function<void()>& fn, Millis timeout) {
  if (manual_) {
    run_queued();
    return fn();
  }
  auto parked = std::make_shared<Completion>(num_threads());
  auto gate = std::make_shared<Completion>(1);
  for (int i = 0; i < num_threads(); ++i) {
    submit(
        static_cast<uint64_t>(i),
        [parked, gate, timeout] {
          parked->finish();
          // The deadline only guards against a caller that never opens the
          // gate; the opener below always does.
          if (gate->wait_for(timeout).code() == ErrorCode::kTimeout)
            PP_WARN("executor: exclusive section still running after {} ms; resuming",
                    timeout.count());
        },
        nullptr);
  }
  struct Opener {
    std::shared_ptr<Completion> gate;
    ~Opener() { gate->finish(); }
  } opener{gate};
  if (parked->wait_for(timeout).code() == ErrorCode::kTimeout)
    throw Timeout(fmt::format(
        "executor: could not pause the worker threads within {} ms (a task is still running)",
        timeout.count()));
  fn();
}

}  // namespace pushpull
