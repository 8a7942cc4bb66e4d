// SPDX-License-Identifier: Apache-2.0
#include "launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "base/private_file.h"
#include "launch/guardian.h"
#include "launch/line_splitter.h"
#include "launch/spawn.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull::launch {

using Clock = std::chrono::steady_clock;

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

namespace {

void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = write(fd, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed terminal must not stop the job
    s.remove_prefix(size_t(n));
  }
}

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

class Job {
 public:
  Job(SignalGuard& signals, const SupervisorSettings& settings, const SupervisorHooks& hooks)
      : signals_(signals), settings_(settings), hooks_(hooks) {}

  Outcome run(std::vector<ChildSpec> specs) {
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

 private:
  void loop() {
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

  // Starts (or restarts) a child, or says why it could not be started.
  Status start(Child& c) {
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
  void restart(Child& c) {
    for (auto& st : c.streams) {
      flush(c, st);
      st.fd.reset();
    }
    if (Status st = start(c); !st) {
      PP_ERROR("cannot restart {}: {}", c.spec.label, st.message());
      add_event({FailureEvent::Kind::kChild, size_t(&c - children_.data()), ""});
    }
  }

  void consult_scheduler() {
    stop_failed_over();
    if (!hooks_.scheduler || stopping_ || scheduler_done_) return;
    auto st = hooks_.scheduler();
    if (st.kind == SchedulerState::Kind::kRunning) return;
    scheduler_done_ = true;
    if (st.kind == SchedulerState::Kind::kSucceeded) {
      PP_DEBUG("the scheduler reports the job complete");
      return;
    }
    if (essentials_done()) {
      PP_WARN("the scheduler reported a failure after every worker finished: {}", st.message);
      return;
    }
    PP_ERROR("the scheduler reported: {}", st.message);
    add_event({FailureEvent::Kind::kScheduler, 0, st.message});
  }

  // A server the job went on without (failed over, e.g. a stopped one) is
  // of no use any more: kill it now rather than at the end of the job.
  void stop_failed_over() {
    if (!hooks_.survivable || stopping_) return;
    for (auto& c : children_) {
      if (!c.running || c.term_sent || !hooks_.survivable(c.spec, c.result)) continue;
      PP_WARN("{} (pid {}) was {}: killing it", c.spec.label, c.pid,
              c.spec.role == Role::kWorker ? "lost (stopped or unreachable)" : "failed over");
      c.term_sent = true;
      c.killed_as_lost = true;
      kill(-c.pid, SIGKILL);
    }
  }

  bool has_open_streams() const {
    for (auto& c : children_)
      for (auto& st : c.streams)
        if (st.fd.get() >= 0) return true;
    return false;
  }

  void poll_once(Millis timeout) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, Stream*>> owners;
    fds.push_back({signals_.fd(), POLLIN, 0});
    owners.push_back({nullptr, nullptr});
    for (auto& c : children_)
      for (auto& st : c.streams)
        if (st.fd.get() >= 0) {
          fds.push_back({st.fd.get(), POLLIN, 0});
          owners.push_back({&c, &st});
        }
    int n = poll(fds.data(), fds.size(), int(timeout.count()));
    if (n <= 0) return;
    // Output first: a failing child's last lines (its PeerFailure) say whom
    // it blames, and they are in the pipe before its exit can be reaped.
    for (size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents) read_stream(*owners[i].first, *owners[i].second);
    if (fds[0].revents) reap();
  }

  void read_stream(Child& c, Stream& st) {
    char buf[16384];
    ssize_t n = read(st.fd.get(), buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      flush(c, st);
      st.fd.reset();
      return;
    }
    st.lines.feed(std::string_view(buf, size_t(n)), [&](std::string_view l) { emit(c, st, l); });
  }

  // Reads what is already in a child's pipes (it has exited: nothing more is
  // coming from it, though a grandchild may still write later).
  void drain(Child& c) {
    for (auto& st : c.streams)
      for (int i = 0; i < 64 && st.fd.get() >= 0; ++i) {
        pollfd p{st.fd.get(), POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) break;
        read_stream(c, st);
      }
  }

  void flush(Child& c, Stream& st) {
    st.lines.flush([&](std::string_view l) { emit(c, st, l); });
  }

  void emit(Child& c, Stream& st, std::string_view line) {
    // One write per line: lines of different children never mix.
    write_all(st.out, fmt::format("[{}] {}\n", c.spec.label, line));
    if (c.log.get() >= 0) write_all(c.log.get(), fmt::format("{}\n", line));
    // A node that fails because a peer failed says so: remember whom.
    if (c.result.blames.empty()) {
      if (auto who = blamed_in(line); !who.empty() && who != c.spec.label) {
        c.result.blames = who;
        c.result.blame_line = std::string(failure_report_in(line));
      }
    }
  }

  void read_signals() {
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

  void reap() {
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

  void on_exit(Child& c) {
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

  void add_event(FailureEvent e) {
    if (stopping_) return;
    if (events_.empty()) first_failure_at_ = Clock::now();
    events_.push_back(std::move(e));
  }

  // The first failure stops the job after a short settling time (see
  // supervisor.h), then names the root cause among what was seen.
  void settle_failures(bool now_or_never = false) {
    if (stopping_ || events_.empty()) return;
    if (!now_or_never && Clock::now() - first_failure_at_ < settings_.settle) return;
    std::vector<ChildState> states;
    for (auto& c : children_)
      states.push_back(c.result);
    auto root = find_root_cause(states, events_);
    consequences_ = root.consequences;
    PP_ERROR("{}: stopping the job", root.reason);
    begin_stop(root.exit_code, root.reason);
  }

  bool essentials_done() const {
    for (auto& c : children_)
      if (c.spec.essential && (c.running || !c.result.exited || c.result.code != 0)) return false;
    return true;
  }

  void check_progress() {
    auto now = Clock::now();
    if (stopping_) {
      if (!killed_ && now >= kill_at_) kill_all();
      return;
    }
    if (!essentials_done()) return;
    bool services_left = false;
    for (auto& c : children_)
      services_left = services_left || c.running;
    if (!services_left) return;
    if (!service_deadline_) service_deadline_ = now + settings_.service_deadline;
    // The scheduler saw the job through: the servers were told to leave.
    if (scheduler_done_) service_deadline_ = std::min(*service_deadline_, now + settings_.grace);
    if (now >= *service_deadline_) {
      PP_WARN("every worker finished but servers are still running: stopping them");
      hint_idle_servers();
      begin_stop(0, "");
    }
  }

  // Every worker exited 0 while servers still ran: likely a collectives-only
  // or torch.distributed script launched with servers (docs/launch.md).
  void hint_idle_servers() {
    PP_WARN(
        "hint: workers that use only collectives or torch.distributed leave the servers "
        "idle; launch them with -s 0");
  }

  void begin_stop(int code, std::string reason) {
    if (stopping_) return;
    stopping_ = true;
    exit_code_ = code;
    reason_ = std::move(reason);
    kill_at_ = Clock::now() + settings_.grace;
    for (auto& c : children_) {
      if (!c.running) continue;
      c.term_sent = true;
      if (c.spec.stop_by_closing_stdin) {
        c.stdin_w.reset();
      } else {
        kill(-c.pid, SIGTERM);
        kill(-c.pid, SIGCONT);  // a stopped process only handles SIGTERM once continued
      }
    }
  }

  void kill_all() {
    killed_ = true;
    for (auto& c : children_)
      if (c.running) {
        c.term_sent = true;
        PP_WARN("{} (pid {}) still running: sending SIGKILL", c.spec.label, c.pid);
        kill(-c.pid, SIGKILL);
      }
  }

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

}  // namespace

Outcome supervise(SignalGuard& signals, std::vector<ChildSpec> children,
                  const SupervisorSettings& settings, const SupervisorHooks& hooks) {
  Job job(signals, settings, hooks);
  return job.run(std::move(children));
}

}  // namespace pushpull::launch
