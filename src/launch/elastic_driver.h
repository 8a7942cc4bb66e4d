// SPDX-License-Identifier: Apache-2.0
// `pushpull launch --min-workers A --max-workers B [--host-discovery-script
// FILE] [--max-restarts K] [--elastic-timeout S] -- COMMAND`: an elastic
// collective job (Horovod's elastic mode). docs/elastic.md is the user's
// contract; in short:
//
//  - The launcher hosts the job's rendezvous (collective/elastic_rendezvous.h)
//    for its whole life and starts, watches and stops the workers itself
//    (local children, or ssh clients for other hosts).
//  - Capacity: the hosts of the discovery script (re-run every
//    `discovery_interval`), else those of -H, else this host with -n slots.
//    Up to B workers run, one per free slot.
//  - A worker that fails (non-zero exit, signal) is removed: the launcher
//    tells the other members at once, so their pending collectives fail
//    and they re-form without it. Its slot is refilled while --max-restarts
//    allows (K replacements over the job), else it stays empty (as Horovod
//    blacklists a failing slot): the discovery script adds capacity back by
//    reporting more slots.
//  - Fewer than A workers alive: the job waits --elastic-timeout for the
//    discovery script to add hosts (without a script it cannot grow: it
//    fails at once) and then fails with a message naming the count and the
//    last failure.
//  - The job succeeds when every worker has exited and at least one exited 0
//    with no failure after the first success (training finished).
//
// Threading: run_elastic must be called on the main thread before any other
// thread starts (as run_launch). It blocks until the job ends; every wait is
// bounded by the grace period, --elastic-timeout or the processes' lifetimes.
#pragma once

#include <string>

#include "launch/launcher.h"

namespace pushpull::launch {

struct ElasticConfig {
  int min_workers = 0;  // 0: not elastic
  int max_workers = 0;  // 0: as many as the slots (-n without a script)
  std::string discovery_script;
  double discovery_interval_s = 3;
  double elastic_timeout_s = 600;
  int max_restarts = 0;
  // After the first member of a round asks to re-form, how long the others
  // have to follow before they count as hung and are killed.
  double rejoin_timeout_s = 10;
  bool enabled() const { return min_workers > 0 || max_workers > 0 || !discovery_script.empty(); }
};

// Checks `ec` against `cfg` (-n, -s, --launcher); fills defaults. Throws
// InvalidArgument with a message for the user.
void prepare_elastic(LaunchConfig& cfg, ElasticConfig& ec, const LaunchContext& ctx);

// Runs a prepared elastic job; returns the launcher's exit code (0, the last
// failure's code or 128+signal, 2 when the discovery script cannot run at
// the start). Its last log line names why a failed job failed.
int run_elastic(const LaunchConfig& cfg, const ElasticConfig& ec, const LaunchContext& ctx);

}  // namespace pushpull::launch
