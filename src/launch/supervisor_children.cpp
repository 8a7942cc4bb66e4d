// SPDX-License-Identifier: Apache-2.0
// The supervisor's children (supervisor_impl.h): starting and restarting a
// child, reading the launcher's signals, reaping the children that ended in
// the order they died, and deciding what each exit means for the job.
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "launch/supervisor_impl.h"
#include "pushpull/log.h"

namespace pushpull::launch::supervisor_detail {

// Starts (or restarts) a child, or says why it could not be started.
Status Job::start(Child& c) {
  Spawned sp;
  Status st = spawn_child(c.spec, &sp);
  if (c.spec.pass_fd >= 0) {  // passed once: the child holds it now (supervisor.h)
    ::close(c.spec.pass_fd);
    c.spec.pass_fd = -1;
  }
  if (!st) return st;
  guardian_->watch(sp.pid);
  c.pid = sp.pid;
  c.running = true;
  c.term_sent = false;
  c.killed_as_lost = false;
  c.result = ChildResult{};
  c.result.label = c.spec.label;
  c.result.host = c.spec.host;
  c.result.pid = sp.pid;
  c.stdin_w = std::move(sp.stdin_w);
  c.streams[0].fd = std::move(sp.out_r);
  c.streams[0].out = 1;
  c.streams[1].fd = std::move(sp.err_r);
  c.streams[1].out = 2;
  return {};
}

// The restart hook said yes: the same child again (its old pipes' last
// lines are flushed first; a grandchild still writing to them is cut off).
void Job::restart(Child& c) {
  for (auto& st : c.streams) {
    flush(c, st);
    st.fd.reset();
  }
  if (Status st = start(c); !st) {
    PP_ERROR("cannot restart {}: {}", c.spec.label, st.message());
    add_event({FailureEvent::Kind::kChild, size_t(&c - children_.data()), ""});
  }
}

void Job::read_signals() {
  signalfd_siginfo info;
  while (read(signals_.fd(), &info, sizeof info) == sizeof info) {
    int sig = int(info.ssi_signo);
    if (sig == SIGCHLD) {
      // Standard signals do not queue: a pending SIGCHLD keeps the siginfo
      // of the first child that exited, so this records who died first
      // when several are reaped in one pass (the cause before its victims).
      sigchld_order_.push_back(pid_t(info.ssi_pid));
      continue;
    }
    if (stopping_) {
      PP_WARN("{} again: killing every process now", signal_name(sig));
      kill_all();
    } else {
      PP_ERROR("launcher received {}: stopping every process", signal_name(sig));
      begin_stop(128 + sig, fmt::format("the launcher received {}", signal_name(sig)));
    }
  }
}

void Job::reap() {
  read_signals();  // first, so sigchld_order_ covers what is reaped now
  std::vector<Child*> ended;
  for (auto& c : children_) {
    if (!c.running) continue;
    int status = 0;
    pid_t r = waitpid(c.pid, &status, WNOHANG);
    if (r != c.pid) continue;
    c.running = false;
    c.result.ended = true;
    c.result.exited = WIFEXITED(status);
    c.result.code = c.result.exited ? WEXITSTATUS(status) : WTERMSIG(status);
    c.result.stopped = c.term_sent;
    ended.push_back(&c);
  }
  auto order = [&](const Child* c) {
    auto it = std::find(sigchld_order_.begin(), sigchld_order_.end(), c->pid);
    return it - sigchld_order_.begin();  // unknown: last
  };
  std::stable_sort(ended.begin(), ended.end(),
                   [&](const Child* a, const Child* b) { return order(a) < order(b); });
  for (Child* c : ended)
    on_exit(*c);
  if (!ended.empty()) sigchld_order_.clear();
}

void Job::on_exit(Child& c) {
  drain(c);
  bool ok = c.result.exited && c.result.code == 0;
  auto how = describe_status(c.result.exited, c.result.code);
  if (c.term_sent && !c.killed_as_lost) {
    PP_DEBUG("{} (pid {}) ended with {} after it was asked to stop", c.spec.label, c.pid, how);
    return;
  }
  if ((!ok || c.killed_as_lost) && !stopping_ && hooks_.restart &&
      hooks_.restart(c.spec, c.result)) {
    restart(c);
    return;
  }
  if (c.killed_as_lost) {
    if (hooks_.survivable && hooks_.survivable(c.spec, c.result)) {
      PP_DEBUG("{} (pid {}) ended with {} after it was failed over", c.spec.label, c.pid, how);
      return;
    }
    c.result.stopped = false;  // not stopped with the job: its loss is the failure
  }
  if (hooks_.on_exit) hooks_.on_exit(c.spec, c.result);
  if (ok) {
    PP_DEBUG("{} (pid {}) ended with {}", c.spec.label, c.pid, how);
    return;
  }
  if (hooks_.survivable && hooks_.survivable(c.spec, c.result)) {
    PP_WARN("{} (pid {}) ended with {}; the job goes on without it (failed over)", c.spec.label,
            c.pid, how);
    return;
  }
  if (!c.spec.essential && essentials_done()) {
    PP_WARN("{} (pid {}) ended with {} after every worker finished", c.spec.label, c.pid, how);
    return;
  }
  PP_ERROR("{} (pid {}) failed with {}", c.spec.label, c.pid, how);
  add_event({FailureEvent::Kind::kChild, size_t(&c - children_.data()), ""});
}

}  // namespace pushpull::launch::supervisor_detail
