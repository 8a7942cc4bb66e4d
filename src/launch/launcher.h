// SPDX-License-Identifier: Apache-2.0
// `pushpull launch`: runs a whole job (scheduler in this process, servers
// and workers as child processes on this host or others) and reports how it
// ended. See docs/launch.md for the user-facing contract.
//
// Threading: run_launch() must be called on the main thread before any other
// thread starts (it blocks SIGINT/SIGTERM/SIGHUP/SIGCHLD to read them through
// a signalfd). It blocks until the job ends; every wait is bounded by the
// grace period, --timeout or the processes' own lifetime.
#pragma once

#include <chrono>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launch/embedded_scheduler.h"
#include "launch/plan.h"
#include "transport/address.h"

namespace pushpull::launch {

struct LaunchContext {
  Environment env;                     // the launcher's environment (local children inherit it)
  std::string self_exe;                // this binary: the default server is "<self_exe> server"
  std::string cwd;                     // the launcher's working directory
  SchedulerFactory scheduler_factory;  // empty: no embedded scheduler in this build
  bool dry_run = false;
};

// Checks `cfg` and fills its defaults (host address, job id, server command,
// working directory, job secret: the launcher's or a fresh random one,
// PUSHPULL_ALLOW_INSECURE / PUSHPULL_BIND_ANY). Throws InvalidArgument with a
// message for the user on anything wrong (the CLI exits 2), before anything
// starts: among others an empty secret on a job that reaches other hosts
// without PUSHPULL_ALLOW_INSECURE=1.
void prepare(LaunchConfig& cfg, const LaunchContext& ctx);

// Writes the plan (host, role, rank, local rank, command; with cfg.verbose the
// variables too, credentials masked) in a human-readable table.
void print_plan(std::ostream& out, const LaunchConfig& cfg, const Rendezvous& rv,
                const std::vector<ProcessSpec>& plan, bool as_root);

// Runs a prepared job; returns the launcher's exit code: 0 when every worker
// exited 0, else the root cause's (supervisor.h): its exit code or
// 128+signal, 1 for a node reported failed that did not fail by itself,
// 128+signal when the launcher was signalled, 127 when a process could not
// start. Its last log line names the root cause ("job failed: ...").
int run_launch(const LaunchConfig& cfg, const LaunchContext& ctx);

// This host's first non-loopback IPv4 address, else "127.0.0.1".
std::string first_ipv4_address();
// The IPv4 address of the interface `spec` selects here (one name, a list
// `eth0,ens5` whose first existing entry wins, or per host
// `host1:eth0,host2:ens5`: transport/address.h), if it has one. Throws
// InvalidArgument on a malformed spec.
std::optional<std::string> interface_ipv4_address(const std::string& spec);
// The address this host sends from toward `host` (the route's source
// address); 127.0.0.1 for a loopback `host`; else first_ipv4_address().
std::string address_toward(const std::string& host);
// Waits until `host` resolves (a headless service's DNS record may appear
// after the pod that needs it starts), retrying with backoff; false when it
// still does not after `within`.
bool wait_until_resolvable(const std::string& host, std::chrono::milliseconds within);
// One loopback test for the whole project (transport/address.h).
using transport::is_loopback_host;

// A fresh job secret: 128 bits from OpenSSL's RAND_bytes, as hex. Throws
// IoError when the generator fails.
std::string make_job_secret();

// The secret of a launched job (docs/security.md, "The job secret"): `given`
// (--env's or the launcher's PUSHPULL_JOB_SECRET) when non-empty, else the
// file PUSHPULL_JOB_SECRET_FILE names, else none when PUSHPULL_JOB_SECRET is
// set empty and PUSHPULL_ALLOW_INSECURE=1, else, in the per-node mode
// (--nnodes), the per-user secret file (every node's launcher must agree),
// else a fresh one. Throws (naming the file) when a file is unusable.
std::string resolve_launch_secret(const LaunchConfig& cfg, const Environment& env,
                                  const std::optional<std::string>& given);

}  // namespace pushpull::launch
