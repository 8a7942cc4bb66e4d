// SPDX-License-Identifier: Apache-2.0
// Completer: one thread per ProcessGroupPushpull that finishes its works in
// submission order, so a work's Future completes (and DDP's comm hooks run)
// without anyone calling wait(). Works that passed their deadline while the
// engine still uses their tensors are kept ("parked") until the engine lets
// go of them.
//
// Thread safety: add() from any thread; stop() from the owner (it joins the
// thread; call it after the session was shut down, so every pending op has
// failed and nothing blocks for long). stop() may also run on the completer
// thread itself (a future callback dropping the last reference to the
// process group): the thread is then detached and finishes on its own, on
// state it shares (State), not on the Completer.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <condition_variable>
#include <deque>
#include <memory>
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
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<c10::intrusive_ptr<PushpullWork>> queue;  // guarded by mu
    bool stopping = false;                               // guarded by mu
    // Expired works the engine may still write into (completer thread only).
    std::vector<c10::intrusive_ptr<PushpullWork>> parked;
  };
  static void run(State& s);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace pushpull::torch_pg
