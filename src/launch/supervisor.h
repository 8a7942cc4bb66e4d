// SPDX-License-Identifier: Apache-2.0
// The process supervisor of `pushpull launch`: starts every child in its own
// process group, prints their output line by line with a "[worker 3] "
// prefix (and copies it to per-process log files), and turns the first
// failure into a stop of the whole job.
//
// Rules:
//  - A child that exits non-zero or dies on a signal fails the job, and so
//    does a failure the job's scheduler reports (SupervisorHooks::scheduler).
//    The supervisor collects the failures of the next `settle` (500 ms) after
//    the first one (a crash closes its sockets before its exit can be reaped,
//    so the peers that fail because of it may be reaped first), names the
//    root cause (find_root_cause: root_cause.h) and lists the other failures
//    as its consequences. Then it asks every other child to stop (SIGTERM and
//    SIGCONT to its process group, or end of file on its stdin for ssh
//    clients), sends SIGKILL to the groups still alive after the grace
//    period, and returns the root cause's code (128+signal for a signal; 1
//    for a node that was reported failed but did not fail by itself).
//  - SIGINT / SIGTERM / SIGHUP to the launcher stop the job the same way
//    (exit code 128+signal); a second one kills every group at once.
//  - Success: every essential child (the workers) exited 0. The other
//    children (servers) are then given `service_deadline` to exit by
//    themselves (the cluster protocol shuts them down), or `grace` once the
//    scheduler reports the job complete, and are stopped after that; a
//    server that fails after every worker succeeded only warns.
//  - Restart (SupervisorHooks::restart, pushpull launch --max-restarts): a
//    child that failed by itself, or that the supervisor killed because
//    `survivable` said so while it ran (a lost worker), is offered to the
//    restart hook first; when it says yes the child is started again with
//    the same (possibly edited) spec, its output keeps its prefix and log
//    file, and nothing else happens (no failure, no on_exit).
//  - No orphans: children get PR_SET_PDEATHSIG(SIGKILL), so they die with
//    the launcher even if it is killed with SIGKILL (that signal is tied to
//    the thread that forks them: call supervise() from the thread that lives
//    longest, main). Their own children (the rest of each process group) are
//    killed by a guardian process that supervise() forks first: it learns
//    every group through a pipe and, when the pipe closes without the
//    launcher saying it is done (the launcher died), sends SIGKILL to each.
//
// Threading: SignalGuard must be created on the main thread before any other
// thread starts (signalfd only sees signals blocked in every thread).
// supervise() blocks the calling thread until every child has been reaped;
// every wait inside it is bounded by the deadlines above. The hooks are
// called on that thread.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launch/root_cause.h"
#include "pushpull/options.h"

namespace pushpull::launch {

// Blocks SIGINT, SIGTERM, SIGHUP and SIGCHLD in the calling thread (and so in
// threads it starts later) and reads them through a signalfd. Restores the
// previous mask on destruction. Move-only in spirit: not copyable.
class SignalGuard {
 public:
  SignalGuard();
  ~SignalGuard();
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  sigset_t old_mask_;
};

struct ChildSpec {
  std::string label;                   // "worker 3": the output prefix and log name
  std::vector<std::string> argv;       // argv[0] is searched in the child's PATH
  std::vector<std::string> env;        // the complete environment, "NAME=value"
  std::string workdir;                 // "" = the launcher's
  std::string log_path;                // "" = no log file
  bool essential = true;               // must exit 0 for the job to succeed
  bool stop_by_closing_stdin = false;  // ssh clients: EOF asks the remote side to stop
  // stop_by_closing_stdin only: written to its stdin first (ssh: the
  // credentials the remote script reads). Must fit in a pipe (64 KiB).
  std::string stdin_data;
  // A descriptor of the launcher's (close-on-exec) this child alone inherits
  // across exec, at the same number (env names it: PUSHPULL_LISTEN_FD). The
  // supervisor owns it: it closes its copy once the child is started, so
  // the child holds it alone and a restart does not get it. -1: none.
  int pass_fd = -1;
  std::string host;         // where it runs, for the report ("" = not shown)
  Role role = Role::kNone;  // the node it is, for SupervisorHooks::on_exit
  int rank = -1;            //   (kNone: not one node, e.g. mpirun)
};

// pid, how it ended, whether it was asked to stop, whom its output blamed.
using ChildResult = ChildState;

struct SupervisorSettings {
  Millis grace{5000};              // SIGTERM → SIGKILL
  Millis service_deadline{30000};  // non-essential children after the last worker
  Millis tick{200};                // how often the scheduler hook is consulted
  // After the first failure, how long to collect others before naming the
  // root cause and stopping the rest (see the rules above).
  Millis settle{500};
  // How many restarts the restart hook may grant over the job (the
  // guardian's room for their process groups).
  int max_restarts = 0;
};

// What the job's scheduler says.
struct SchedulerState {
  enum class Kind { kRunning, kSucceeded, kFailed };
  Kind kind = Kind::kRunning;
  std::string message;  // kFailed: why, naming the node ("worker 1 (host h:p) failed: ...")
};

struct SupervisorHooks {
  // Consulted every tick while the job runs; empty: no scheduler.
  std::function<SchedulerState()> scheduler;
  // Called when a child ends by itself (not stopped by the supervisor).
  std::function<void(const ChildSpec&, const ChildResult&)> on_exit;
  // Called (after on_exit) for a child that failed by itself: true when the
  // job survives its end (a parameter server that was failed over). Also
  // asked every tick for running children: one it is true for (a stopped
  // server the job went on without) is killed.
  std::function<bool(const ChildSpec&, const ChildResult&)> survivable;
  // Called for a child that failed by itself, or was killed because
  // `survivable` was true while it ran, before anything else: true starts
  // it again with `spec` (which the hook may edit).
  std::function<bool(ChildSpec&, const ChildResult&)> restart;
};

struct Outcome {
  int exit_code = 0;
  std::string reason;                     // the root cause ("" on success)
  std::vector<std::string> consequences;  // later failures, in observed order
  std::vector<ChildResult> children;
};

// Runs `children` to completion as described above. A child that cannot be
// started (program not found, fork failed) fails the job with exit code 127
// after the ones already started are stopped. Throws IoError only when a log
// file cannot be created or the guardian cannot start (before anything starts).
Outcome supervise(SignalGuard& signals, std::vector<ChildSpec> children,
                  const SupervisorSettings& settings, const SupervisorHooks& hooks = {});

// "SIGKILL" (or "signal 42" for one without a name).
std::string signal_name(int sig);
// "exit code 3" / "signal SIGKILL".
std::string describe_status(bool exited, int code);

}  // namespace pushpull::launch
