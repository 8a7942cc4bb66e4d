// SPDX-License-Identifier: Apache-2.0
// The seam between the launcher and the cluster layer's scheduler.
//
// `pushpull launch` runs the scheduler inside its own process: it binds the
// port first and only then hands the real, bound port to the children, so no
// other program can take the port between choosing and binding it.
//
// The launch layer only knows this interface; the CLI passes a factory that
// wraps the cluster layer's Scheduler (see tools/launch.cpp). Without a
// factory the launcher binds a port (without listening: connections are
// refused) and holds it for the job's life, and warns that nothing listens
// on it (useful for programs that do not talk to a scheduler).
//
// Thread safety: start/status/wait/stop are called from the launcher's main
// thread only; implementations run their own threads in the background.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::launch {

class EmbeddedScheduler {
 public:
  virtual ~EmbeddedScheduler() = default;
  // Binds `bind_addr:port` ("" = the wildcard address; port 0: any free
  // port), advertises `advertised` (the address the nodes are given), starts
  // serving in the background and returns the bound port. Throws IoError
  // when it cannot bind.
  virtual int start(const std::string& advertised, const std::string& bind_addr, int port) = 0;
  // Non-blocking: nullopt while the job runs, then the final status (ok when
  // every node left in order; otherwise why the job failed, naming the node).
  virtual std::optional<Status> status() = 0;
  // Blocks up to `deadline` for the scheduler to finish by itself; returns
  // whether it did.
  virtual bool wait(Millis deadline) = 0;
  // Stops at once and releases the port and threads. Idempotent; no-throw.
  virtual void stop() noexcept = 0;
  // The process of node (role, rank) ended by itself: `exit_code` when it
  // exited, `signal` > 0 when a signal killed it. The scheduler fails the job
  // naming it (nonzero code, signal, or exit 0 while others wait for it), or
  // ends the job when every worker exited 0 without joining. No-throw.
  virtual void process_exited(Role role, int rank, int exit_code, int signal) noexcept = 0;
  // Whether node (role, rank) was failed over (a parameter server whose
  // ranges moved to their backups): its end does not end the job.
  virtual bool failed_over(Role, int) noexcept { return false; }
  // Worker restart (--max-restarts; docs/ps.md "Worker restart"). Before
  // start(): whether lost workers wait for a replacement.
  virtual void allow_worker_restarts(bool) noexcept {}
  // The launcher restarts worker `rank`'s process (instead of process_exited).
  virtual void process_restarting(Role, int, int, int) noexcept {}
  // How many times worker `rank` was lost (a running process of a lost
  // worker, e.g. a stopped one, is killed and restarted).
  virtual int worker_losses(int) noexcept { return 0; }
  // How many times server `rank` was failed over (a restarted one rejoins).
  virtual int server_losses(int) noexcept { return 0; }
  // Whether the job failed already (the moment the scheduler decided it,
  // before status() has the final word).
  virtual bool job_failed() noexcept { return false; }
};

// Makes a scheduler for a job described by `node_options` (role scheduler,
// numbers of servers and workers, job id, timeouts).
using SchedulerFactory = std::function<std::unique_ptr<EmbeddedScheduler>(const Options&)>;

}  // namespace pushpull::launch
