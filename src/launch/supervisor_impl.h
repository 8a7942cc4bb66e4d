// SPDX-License-Identifier: Apache-2.0
// Private to the supervisor (supervisor.cpp, supervisor_children.cpp,
// supervisor_output.cpp, supervisor_stop.cpp): the Job that runs one
// supervise() call and the state it keeps per child. The rules it follows
// are supervisor.h's.
//
// Not thread-safe: a Job lives on the thread that called supervise(), owns
// its children's pipes and log files, and borrows the SignalGuard, the hooks
// and (while run() runs) the Guardian.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launch/guardian.h"
#include "launch/line_splitter.h"
#include "launch/spawn.h"
#include "launch/supervisor.h"

namespace pushpull::launch::supervisor_detail {

using Clock = std::chrono::steady_clock;

struct Stream {
  Fd fd;
  int out = 1;
  LineSplitter lines;
};

struct Child {
  ChildSpec spec;
  pid_t pid = -1;
  bool running = false;
  bool term_sent = false;
  bool killed_as_lost = false;  // killed by stop_failed_over: its end may be restarted
  Fd stdin_w;
  Stream streams[2];
  Fd log;
  ChildResult result;
};

// One supervise() call (supervisor.h's rules).
class Job {
 public:
  Job(SignalGuard& signals, const SupervisorSettings& settings, const SupervisorHooks& hooks)
      : signals_(signals), settings_(settings), hooks_(hooks) {}

  // Starts every child, supervises them until each has been reaped.
  Outcome run(std::vector<ChildSpec> specs);

 private:
  void loop();

  // Children (supervisor_children.cpp): starting, restarting, reaping.
  Status start(Child& c);
  void restart(Child& c);
  void read_signals();
  void reap();
  void on_exit(Child& c);

  // Output (supervisor_output.cpp): the children's pipes, line by line.
  bool has_open_streams() const;
  void poll_once(Millis timeout);
  void read_stream(Child& c, Stream& st);
  void drain(Child& c);
  void flush(Child& c, Stream& st);
  void emit(Child& c, Stream& st, std::string_view line);

  // Failures and stopping (supervisor_stop.cpp).
  void consult_scheduler();
  void stop_failed_over();
  void add_event(FailureEvent e);
  void settle_failures(bool now_or_never = false);
  bool essentials_done() const;
  void check_progress();
  void hint_idle_servers();
  void begin_stop(int code, std::string reason);
  void kill_all();

  SignalGuard& signals_;
  SupervisorSettings settings_;
  const SupervisorHooks& hooks_;
  Guardian* guardian_ = nullptr;  // run()'s, while it runs
  std::vector<Child> children_;
  bool stopping_ = false;
  bool killed_ = false;
  bool scheduler_done_ = false;  // it succeeded or failed: not consulted again
  Clock::time_point kill_at_{};
  std::optional<Clock::time_point> service_deadline_;
  std::vector<pid_t> sigchld_order_;
  std::vector<FailureEvent> events_;
  Clock::time_point first_failure_at_{};
  std::vector<std::string> consequences_;
  int exit_code_ = 0;
  std::string reason_;
};

}  // namespace pushpull::launch::supervisor_detail
