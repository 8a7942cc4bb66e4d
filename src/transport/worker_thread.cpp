// SPDX-License-Identifier: Apache-2.0
#include "transport/worker_thread.h"

#include "pushpull/error.h"

namespace pushpull::transport {

WorkerThread::~WorkerThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WorkerThread::start(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    if (busy_) throw Internal("collective: a worker thread was given a job while busy");
    job_ = std::move(job);
    busy_ = true;
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_all();
}

void WorkerThread::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
}

void WorkerThread::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (busy_ && job_); });
    if (!job_) return;  // stop_ with nothing to run
    auto job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    try {
      job();
    } catch (...) {  // NOLINT(bugprone-empty-catch): jobs report through their own state
    }
    job = nullptr;  // its captures die before the waiter wakes
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace pushpull::transport
