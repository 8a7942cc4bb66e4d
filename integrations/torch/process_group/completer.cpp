// SPDX-License-Identifier: Apache-2.0
#include "completer.h"

#include <algorithm>
#include <chrono>

namespace pushpull::torch_pg {

Completer::Completer() : thread_([this] { run(); }) {}

Completer::~Completer() {
  stop();
}

void Completer::add(c10::intrusive_ptr<PushpullWork> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
  }
  cv_.notify_one();
}

void Completer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Completer::run() {
  for (;;) {
    c10::intrusive_ptr<PushpullWork> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Parked works are rechecked every 100 ms; otherwise sleep until work arrives.
      auto ready = [&] { return stopping_ || !queue_.empty(); };
      if (parked_.empty()) {
        cv_.wait(lock, ready);
      } else {
        cv_.wait_for(lock, std::chrono::milliseconds(100), ready);
      }
      if (!queue_.empty()) {
        work = std::move(queue_.front());
        queue_.pop_front();
      } else if (stopping_) {
        break;
      }
    }
    if (work && !work->complete_by_deadline()) parked_.push_back(std::move(work));
    std::erase_if(parked_, [](const auto& w) { return w->engine_done(); });
  }
  // The session is shut down: its engine thread has stopped, nothing writes
  // into the parked works' tensors any more.
  parked_.clear();
}

}  // namespace pushpull::torch_pg
