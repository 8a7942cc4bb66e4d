// SPDX-License-Identifier: Apache-2.0
// The guardian of a job's process groups: a small process forked by the
// supervisor that kills every group it was told about if the launcher dies
// without cleaning up (SIGKILL, a crash). PR_SET_PDEATHSIG only reaches the
// launcher's direct children; the guardian also reaches what they started.
//
// The launcher tells it each group through a pipe; on a normal end the
// launcher says "done" and the guardian exits without killing anything. When
// the pipe closes without "done", the launcher is gone: it sends SIGKILL to
// every group and exits. It ignores SIGINT/SIGTERM/SIGHUP (they are blocked
// in the launcher, and the mask is inherited) and runs in a session of its
// own, so a signal to the launcher's process group does not take it away
// before it did its work.
//
// Thread safety: one owner thread. The fork is safe in a threaded launcher:
// the guardian only makes async-signal-safe calls.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <vector>

namespace pushpull::launch {

class Guardian {
 public:
  // Forks the guardian, able to hold `max_groups` groups. Throws IoError.
  explicit Guardian(size_t max_groups);
  // Says "done" and reaps the guardian.
  ~Guardian();
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  // The process group `pgid` (a child's pid) belongs to the job.
  void watch(pid_t pgid);

 private:
  int fd_ = -1;  // the pipe's write end
  pid_t pid_ = -1;
  size_t watched_ = 0, max_groups_ = 0;
};

}  // namespace pushpull::launch
