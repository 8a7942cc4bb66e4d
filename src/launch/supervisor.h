// The process supervisor of `pushpull launch`: starts every child in its own
// process group, prints their output line by line with a "[worker 3] "
// prefix (and copies it to per-process log files), and turns the first
// failure into a stop of the whole job.
//
// Rules:
//  - A child that exits non-zero or dies on a signal fails the job. The
//    supervisor prints which one and how, waits `settle` (300 ms) for other
//    failures (a crash closes its sockets before its exit can be reaped, so
//    peers that fail because of it may be reaped first) and reports the most
//    telling one (a signal, else an exit code other than the generic 1, else
//    the first seen). Then it asks every other child to stop (SIGTERM to its
//    process group, or end of file on its stdin for ssh clients), sends
//    SIGKILL to the groups still alive after the grace period, and returns
//    that child's code (128+signal for a signal).
//  - SIGINT / SIGTERM / SIGHUP to the launcher stop the job the same way
//    (exit code 128+signal).
//  - Success: every essential child (the workers) exited 0. The other
//    children (servers) are then given `service_deadline` to exit by
//    themselves (the cluster protocol shuts them down) and are stopped after
//    that; a server that fails after every worker succeeded only warns.
//  - Children get PR_SET_PDEATHSIG(SIGKILL), so they die with the launcher
//    even if it is killed with SIGKILL. That signal is tied to the thread
//    that forks them: call run() from the thread that lives longest (main).
//
// Threading: SignalGuard must be created on the main thread before any other
// thread starts (signalfd only sees signals blocked in every thread).
// run() blocks the calling thread until every child has been reaped; every
// wait inside it is bounded by the deadlines above.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

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
};

struct ChildResult {
  std::string label;
  pid_t pid = -1;
  bool exited = false;   // else killed by `signal`
  int code = 0;          // exit code, or the signal number
  bool stopped = false;  // the supervisor had asked it to stop
};

struct SupervisorSettings {
  Millis grace{5000};              // SIGTERM → SIGKILL
  Millis service_deadline{30000};  // non-essential children after the last worker
  Millis tick{200};                // how often `watch` is consulted
  // After the first failure, how long to wait for the one that caused it
  // (see supervise()) before stopping the others.
  Millis settle{300};
};

struct Outcome {
  int exit_code = 0;
  std::string reason;  // why the job stopped ("" on success)
  std::vector<ChildResult> children;
};

// Consulted every tick while the job runs; returns (exit code, reason) to fail
// the job (e.g. the embedded scheduler reported a failure).
using Watch = std::function<std::optional<std::pair<int, std::string>>()>;

// Runs `children` to completion as described above. A child that cannot be
// started (program not found, fork failed) fails the job with exit code 127
// after the ones already started are stopped. Throws IoError only when a log
// file cannot be created (before anything starts).
Outcome supervise(SignalGuard& signals, std::vector<ChildSpec> children,
                  const SupervisorSettings& settings, const Watch& watch = {});

// "SIGKILL" (or "signal 42" for one without a name).
std::string signal_name(int sig);
// "exit code 3" / "signal SIGKILL".
std::string describe_status(bool exited, int code);

}  // namespace pushpull::launch
