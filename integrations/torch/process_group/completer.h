// SPDX-License-Identifier: Apache-2.0
// Completer: one thread per ProcessGroupPushpull that finishes its works in
// submission order, so a work's Future completes (and DDP's comm hooks run)
// without anyone calling wait(). Works that passed their deadline while the
// engine still uses their tensors are kept ("parked") until the engine lets
// go of them.
//
// Thread safety: add() from any thread; stop() once, from the owner (it
// joins the thread; call it after the session was shut down, so every
// pending op has failed and nothing blocks for long).
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "work.h"

namespace pushpull::torch_pg {

class Completer {
 public:
  Completer();
  ~Completer();
  Completer(const Completer&) = delete;
  Completer& operator=(const Completer&) = delete;

  void add(c10::intrusive_ptr<PushpullWork> work);
  // Finishes what is queued (the session is down: it fails at once), then
  // ends the thread. Idempotent.
  void stop();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<PushpullWork>> queue_;  // guarded by mu_
  bool stopping_ = false;                               // guarded by mu_
  // Expired works the engine may still write into (completer thread only).
  std::vector<c10::intrusive_ptr<PushpullWork>> parked_;
  std::thread thread_;
};

}  // namespace pushpull::torch_pg
