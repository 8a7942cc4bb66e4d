// SPDX-License-Identifier: Apache-2.0
// The supervisor's failures and stopping (supervisor_impl.h): consulting the
// scheduler, killing children the job went on without, collecting failures
// for the settling time and naming the root cause, the end of the services
// after the last worker, and stopping (SIGTERM, then SIGKILL) every child.
#include <signal.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "launch/supervisor_impl.h"
#include "pushpull/log.h"

namespace pushpull::launch::supervisor_detail {

void Job::consult_scheduler() {
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
void Job::stop_failed_over() {
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

void Job::add_event(FailureEvent e) {
  if (stopping_) return;
  if (events_.empty()) first_failure_at_ = Clock::now();
  events_.push_back(std::move(e));
}

// The first failure stops the job after a short settling time (see
// supervisor.h), then names the root cause among what was seen.
void Job::settle_failures(bool now_or_never) {
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

bool Job::essentials_done() const {
  for (auto& c : children_)
    if (c.spec.essential && (c.running || !c.result.exited || c.result.code != 0)) return false;
  return true;
}

void Job::check_progress() {
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
void Job::hint_idle_servers() {
  PP_WARN(
      "hint: workers that use only collectives or torch.distributed leave the servers "
      "idle; launch them with -s 0");
}

void Job::begin_stop(int code, std::string reason) {
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

void Job::kill_all() {
  killed_ = true;
  for (auto& c : children_)
    if (c.running) {
      c.term_sent = true;
      PP_WARN("{} (pid {}) still running: sending SIGKILL", c.spec.label, c.pid);
      kill(-c.pid, SIGKILL);
    }
}

}  // namespace pushpull::launch::supervisor_detail
