// SPDX-License-Identifier: Apache-2.0
// The elastic options of `pushpull launch` (docs/elastic.md), kept apart
// from tools/launch.cpp. Header-only: included by the launch command of both
// CLIs (pushpull and the tests' pushpull_launch_cli).
#pragma once

#include <CLI/CLI.hpp>

#include "launch/elastic_driver.h"

namespace pushpull::cli {

inline void add_elastic_options(CLI::App* cmd, launch::ElasticConfig& e) {
  cmd->add_option("--min-workers,--min-np", e.min_workers,
                  "Elastic: the fewest workers the job runs with (docs/elastic.md)");
  cmd->add_option("--max-workers,--max-np", e.max_workers,
                  "Elastic: the most workers the job runs with");
  cmd->add_option("--host-discovery-script", e.discovery_script,
                  "Elastic: a program printing host:slots lines, re-run every few seconds");
  cmd->add_option("--discovery-interval", e.discovery_interval_s,
                  "Elastic: seconds between runs of the discovery script (3)");
  cmd->add_option("--elastic-timeout", e.elastic_timeout_s,
                  "Elastic: seconds to wait for at least --min-workers (600)");
  cmd->add_option("--rejoin-timeout", e.rejoin_timeout_s,
                  "Elastic: seconds the members of a round have to re-form after the first "
                  "did, before the others count as hung (10)");
  // --max-restarts may also be registered by the non-elastic restart policy;
  // one option serves both (elastic_restarts reads it).
  if (cmd->get_option_no_throw("--max-restarts") == nullptr)
    cmd->add_option("--max-restarts", e.max_restarts,
                    "How many dead workers are restarted (parameter-server job: same rank, "
                    "docs/ps.md) or replaced (elastic job) over the job (0)");
}

// After parsing: --max-restarts for the elastic job, whoever registered it;
// -s and -n defaults of an elastic job.
inline void elastic_restarts(CLI::App* cmd, launch::ElasticConfig& e, int* num_servers) {
  if (auto* o = cmd->get_option_no_throw("--max-restarts"); o != nullptr && o->count() > 0)
    e.max_restarts = o->as<int>();
  if (e.enabled() && cmd->count("--num-servers") == 0) *num_servers = 0;
}

}  // namespace pushpull::cli
