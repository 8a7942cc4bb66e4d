// SPDX-License-Identifier: Apache-2.0
// Which failure caused a failed job: the launcher's final line names the
// root cause and lists the later failures as its consequences.
//
// When one node fails, the others fail because of it a moment later (they
// exit 1 with a PeerFailure naming it, or the scheduler declares it dead), and
// a crashed process closes its sockets before the launcher can reap it, so
// the order in which the launcher sees failures is not always the causal
// order. The supervisor collects the failures it observes during a short
// settling time after the first one, then asks find_root_cause().
//
// Thread safety: pure functions over values.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pushpull/options.h"

namespace pushpull::launch {

// What the supervisor knows of one child when it decides.
struct ChildState {
  std::string label;  // "worker 1"
  std::string host;   // where it runs ("" = not shown)
  int pid = -1;
  bool ended = false;    // reaped
  bool exited = false;   // ended: exited (else killed by `code`)
  int code = 0;          // exit code or signal number
  bool stopped = false;  // the supervisor had asked it to stop
  // The first node its output blamed (a line with "PeerFailure" naming a
  // node, see node_named_in), or "scheduler" for
  // "PeerFailure: the scheduler ended the job: ...", else "".
  std::string blames;
  std::string blame_line;  // that line, from "PeerFailure"
};

// One failure, in the order the supervisor observed it.
struct FailureEvent {
  enum class Kind { kChild, kScheduler };
  Kind kind = Kind::kChild;
  size_t child = 0;     // kChild: index into the children; it ended non-zero or by a signal
  std::string message;  // kScheduler: why the scheduler failed the job
};

struct RootCause {
  int exit_code = 1;
  std::string reason;                     // "worker 1 (pid 12, host 10.0.0.2) was killed by ..."
  std::vector<std::string> consequences;  // "server 0 exited with code 1", in observed order
};

// The root cause among `events` (not empty). Precedence, earliest first
// within each step:
//  1. a child killed by a signal before the scheduler reported anything;
//  2. the node the scheduler named, or the node a failed child's PeerFailure
//     named: that node's own failure if it has one (its exit code or
//     128+signal), else the report (exit code 1: e.g. a stopped process the
//     heartbeats caught, or a node that exited 0 while the job needed it);
//  3. a child that exited with a code other than 1, or died on a signal after
//     the scheduler's report;
//  4. a child that exited 1 (what nodes do when a peer failed);
//  5. a scheduler report naming no node it launched (e.g. a registration
//     timeout), also when only a child's PeerFailure line relays it.
RootCause find_root_cause(const std::vector<ChildState>& children,
                          const std::vector<FailureEvent>& events);

// "worker 3" from the first "worker 3 (host " / "server 3 (host " (or
// "... (not registered", a node that never joined) in `text`: how the cluster
// layer names nodes; the collectives' "rank 3 (host " is "worker 3" (a job's
// collective ranks are its workers). Else nullopt.
std::optional<std::string> node_named_in(std::string_view text);

// Whom a line of a child's output blames (see ChildState::blames), or "".
std::string blamed_in(std::string_view line);
// The failure report inside a child's output line (from "PeerFailure" or the
// collectives' "collective: rank N (host ...)"), empty when it has none.
std::string_view failure_report_in(std::string_view line);

// "worker 1 (pid 12, host 10.0.0.2)".
std::string describe_child(const ChildState& c);
// "exited with code 3" / "was killed by signal 9 (SIGKILL)".
std::string describe_end(bool exited, int code);

}  // namespace pushpull::launch
