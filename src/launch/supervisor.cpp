// SPDX-License-Identifier: Apache-2.0
// The supervisor of `pushpull launch` (supervisor.h): the signal guard, the
// names of signals and exit statuses, supervise() and the Job's main loop.
// The Job's other parts: supervisor_children.cpp (start, restart, reap),
// supervisor_output.cpp (the children's output) and supervisor_stop.cpp
// (failures, the root cause and stopping the job).
#include "launch/supervisor.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "base/private_file.h"
#include "launch/supervisor_impl.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull::launch {

SignalGuard::SignalGuard() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD})
    sigaddset(&set, s);
  if (pthread_sigmask(SIG_BLOCK, &set, &old_mask_) != 0)
    throw IoError("cannot block signals for the launcher");
  fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd_ < 0) {
    int err = errno;
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    throw IoError(fmt::format("signalfd failed: {}", std::strerror(err)));
  }
}

SignalGuard::~SignalGuard() {
  close(fd_);
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string describe_status(bool exited, int code) {
  return exited ? fmt::format("exit code {}", code) : "signal " + signal_name(code);
}

namespace supervisor_detail {

Outcome Job::run(std::vector<ChildSpec> specs) {
  for (auto& s : specs) {
    Child c;
    c.result.label = s.label;
    c.result.host = s.host;
    if (!s.log_path.empty()) {
      // O_NOFOLLOW, 0600, never another user's file (base/private_file.h).
      try {
        c.log.reset(base::open_private_for_write(s.log_path, "log file"));
      } catch (const IoError& e) {
        throw IoError(fmt::format("{} (check --log-dir)", e.what()));
      }
    }
    c.spec = std::move(s);
    children_.push_back(std::move(c));
  }
  Guardian guardian(children_.size() + size_t(std::max(0, settings_.max_restarts)));
  guardian_ = &guardian;
  for (auto& c : children_) {
    if (stopping_) break;
    if (Status st = start(c); !st) {
      PP_ERROR("cannot start {}: {}", c.spec.label, st.message());
      begin_stop(127, fmt::format("{} could not be started: {}", c.spec.label, st.message()));
      continue;
    }
  }
  loop();
  guardian_ = nullptr;
  Outcome o;
  o.exit_code = exit_code_;
  o.reason = reason_;
  o.consequences = consequences_;
  for (auto& c : children_)
    o.children.push_back(c.result);
  return o;
}

void Job::loop() {
  std::optional<Clock::time_point> drain_until;
  while (true) {
    reap();
    check_progress();
    bool any_running = false;
    for (auto& c : children_)
      any_running = any_running || c.running;
    if (!any_running) {
      settle_failures(true);  // nobody left to wait for
      // A grandchild may hold a pipe open: give the output a moment, not forever.
      if (!drain_until) drain_until = Clock::now() + Millis(1000);
      if (!has_open_streams() || Clock::now() >= *drain_until) break;
    }
    bool settling = !stopping_ && !events_.empty();
    poll_once(any_running && !settling ? settings_.tick : Millis(20));
    consult_scheduler();
    settle_failures();
  }
  for (auto& c : children_)
    for (auto& st : c.streams)
      flush(c, st);
  // Safety sweep: nothing of any group we started outlives the launcher.
  for (auto& c : children_)
    if (c.pid > 0) kill(-c.pid, SIGKILL);
}

}  // namespace supervisor_detail

Outcome supervise(SignalGuard& signals, std::vector<ChildSpec> children,
                  const SupervisorSettings& settings, const SupervisorHooks& hooks) {
  supervisor_detail::Job job(signals, settings, hooks);
  return job.run(std::move(children));
}

}  // namespace pushpull::launch
