// SPDX-License-Identifier: Apache-2.0
// A whole parameter-server job inside this process: a scheduler, servers and
// workers as threads on loopback, or on the in-process medium (socketpairs,
// no port: transport/inproc/in_process_listeners.h) when
// options.cluster.root_uri is "inproc". For tests, benchmarks and trying a program
// without a launcher; the nodes are the same objects a real job uses.
//
// Thread safety: run_inprocess_job blocks until the job ended; `body` runs on
// every worker's own thread at once.
#pragma once

#include <functional>
#include <string>

#include "pushpull/kvstore.h"
#include "pushpull/options.h"

namespace pushpull {

struct InProcessJob {
  int servers = 1;
  int workers = 1;
  std::string type = "dist_sync";
  // Cluster addresses and ports are filled in (root_uri "inproc" selects the
  // in-process medium, anything else loopback); everything else (timeouts,
  // big-array bound, threads) is taken from here.
  Options options;
  // Optional: adjusts the options of the i-th server or worker started (not
  // its rank, which the scheduler assigns), e.g. to set one node apart.
  std::function<void(Role role, int i, Options& options)> node_options = {};
};

// Starts the job, runs body(store) on each worker, and ends the job in order.
// Rethrows the first exception of a worker (after stopping the job, so the
// others do not wait for it); throws the scheduler's error if the job failed.
void run_inprocess_job(const InProcessJob& job, const std::function<void(KVStore&)>& body);

}  // namespace pushpull
