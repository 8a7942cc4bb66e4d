// SPDX-License-Identifier: Apache-2.0
// What `pushpull launch` does for the job's observability (docs/timeline.md):
// the timeline's clock service and the one merged timeline file at the end,
// and the note on the final line of a failed job saying where the flight
// recorder's dumps are.
//
// Thread safety: a JobTimeline is used by the launcher's main thread only;
// it owns its clock service (a thread and a UDP socket) until destroyed.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/clock_sync.h"
#include "launch/plan.h"

namespace pushpull::launch {

class SignalGuard;

// The timeline base name F the job's processes get (--timeline-filename, or
// PUSHPULL_TIMELINE / HOROVOD_TIMELINE in --env or the launcher's
// environment); "" when the job records none.
std::string timeline_base(const LaunchConfig& cfg, const Environment& env);

class JobTimeline {
 public:
  // When the job records a timeline: starts the clock service on the
  // launcher's address and adds PUSHPULL_TIMELINE_CLOCK to cfg.env. A
  // service that cannot start is logged; the merge then goes unaligned.
  JobTimeline(LaunchConfig& cfg, const Environment& env);
  JobTimeline(const JobTimeline&) = delete;
  JobTimeline& operator=(const JobTimeline&) = delete;
  ~JobTimeline();
  bool active() const { return !base_.empty(); }
  // After the job: fetches the remote hosts' files (ssh launcher: rsync, as
  // --sync-dst-dir copies) and merges every process's file into F (the
  // per-process files stay). Logs what it did; never throws.
  void merge(SignalGuard& signals, const LaunchConfig& cfg, const std::vector<ProcessSpec>& plan);

 private:
  std::string base_;
  std::unique_ptr<base::ClockService> clock_;
};

// Merges per-process timeline files into `out` (a Chrome trace, JSON array):
// each file's events shifted by its pushpull_clock_offset (microseconds) and
// its pids renumbered (file k: k * 1000 + pid) so nodes never collide. A
// file cut short (a killed process) is read up to its last whole event.
// Returns the number of events written; throws IoError when `out` cannot be
// written. Exposed for tests.
size_t merge_timeline_files(const std::vector<std::string>& files, const std::string& out);

// " (flight recorder dumps: ...)" for the final line of a failed job: the
// dump files found (local jobs) or where each host keeps them.
// Local jobs: the dumps written since `since` (the job's start).
std::string flight_recorder_note(const LaunchConfig& cfg, const Environment& env,
                                 const std::vector<ProcessSpec>& plan,
                                 std::filesystem::file_time_type since);

}  // namespace pushpull::launch
