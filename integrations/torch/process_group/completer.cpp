// SPDX-License-Identifier: Apache-2.0
#include "completer.h"

#include <algorithm>
#include <chrono>

namespace pushpull::torch_pg {

Completer::Completer() : state_(std::make_shared<State>()), thread_([s = state_] { run(*s); }) {}

Completer::~Completer() {
  stop();
}

void Completer::add(c10::intrusive_ptr<PushpullWork> work) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->queue.push_back(std::move(work));
  }
  state_->cv.notify_one();
}

void Completer::stop() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
  }
  state_->cv.notify_one();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // called from a callback on this thread: it ends on its own
  } else {
    thread_.join();
  }
}

void Completer::run(State& s) {
  for (;;) {
    c10::intrusive_ptr<PushpullWork> work;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      // Parked works are rechecked every 100 ms; otherwise sleep until work arrives.
      auto ready = [&] { return s.stopping || !s.queue.empty(); };
      if (s.parked.empty()) {
        s.cv.wait(lock, ready);
      } else {
        s.cv.wait_for(lock, std::chrono::milliseconds(100), ready);
      }
      if (!s.queue.empty()) {
        work = std::move(s.queue.front());
        s.queue.pop_front();
      } else if (s.stopping) {
        break;
      }
    }
    if (work && !work->complete_by_deadline()) s.parked.push_back(std::move(work));
    std::erase_if(s.parked, [](const auto& w) { return w->engine_done(); });
  }
  // The session is shut down: its engine thread has stopped, nothing writes
  // into the parked works' tensors any more.
  s.parked.clear();
}

}  // namespace pushpull::torch_pg
