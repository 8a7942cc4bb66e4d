// SPDX-License-Identifier: Apache-2.0
// A thread that runs one job at a time for as long as its owner lives: the
// writer and reader threads of large stream operations (tcp_streams.h,
// tcp_streams_run.cpp) are started once per transport rather than once per operation
// (a thread start and join each time cost a few tens of microseconds, and on
// a loaded host a scheduling delay before the new thread first runs).
//
// Thread safety: start() and wait() are called by one thread at a time (the
// algorithm thread holding the transport's stream lock). A job must not
// throw; an escaping exception is caught and dropped (the jobs report their
// errors through their own state). The destructor waits for the running job
// and joins the thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace pushpull::transport {

class WorkerThread {
 public:
  WorkerThread() = default;
  ~WorkerThread();
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  // Runs `job` on the thread (started on first use). The previous job must
  // have ended (wait()).
  void start(std::function<void()> job);
  // Until the job started last has returned; at once when there is none.
  void wait();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace pushpull::transport
