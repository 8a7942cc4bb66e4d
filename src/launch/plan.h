// SPDX-License-Identifier: Apache-2.0
// What `pushpull launch` runs: the job description (LaunchConfig), the
// placement of every process on a host (make_plan) and the environment each
// process gets (process_env).
//
// Placement: hosts in hostfile order; servers are placed first (as MXNet's
// launch.py does), then workers. When every host declares `slots`, each host
// is filled up to its slots before the next (mpirun's by-slot order); when
// some host has no slots, processes go round robin over the hosts (servers
// from the first host, then workers from the first host again), skipping
// hosts whose slots are full. More processes than slots is an error.
//
// Spare server hosts (`--server-hosts`, docs/ps.md "Mixed placement"): the
// last `spare_hosts` hosts run servers only, one each, ranks 0..k-1; the
// other servers and every worker are placed on the other hosts as above.
// With one server more per worker host the job is BytePS's hybrid, and the
// workers share big values by its split (ps/server_shares.h).
//
// Thread safety: pure functions over values.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launch/hostfile.h"
#include "pushpull/options.h"

namespace pushpull::launch {

enum class LauncherKind { kLocal, kSsh, kMpi, kSlurm };
std::string_view launcher_name(LauncherKind k);
std::optional<LauncherKind> parse_launcher(std::string_view text);

// One `--env NAME[=VALUE]` setting, already resolved to a value.
using EnvList = std::vector<std::pair<std::string, std::string>>;

struct LaunchConfig {
  int num_workers = 1;
  int num_servers = 0;  // 0: collective-only job, no scheduler
  LauncherKind launcher = LauncherKind::kLocal;
  std::vector<HostEntry> hosts;  // empty: every process on this host
  // How many of `hosts` (the last ones) are spare server hosts: servers
  // only, one each (--server-hosts).
  size_t spare_hosts = 0;
  std::vector<std::string> command;  // worker program and its arguments
  std::string server_command;        // shell command line for servers
  std::string host_ip;               // scheduler / launcher address as the nodes see it
  int port = 0;                      // scheduler port; 0 = a free one
  double timeout_s = 0;              // --timeout; 0 = nodes' default
  std::string interface;             // DMLC_INTERFACE for every node ("" = unset)
  std::string job_id;                // PUSHPULL_JOB_ID
  std::string log_dir;
  std::string sync_dst_dir;
  std::string workdir;                   // where processes start (remote: sync dir or cwd)
  std::vector<std::string> ssh_options;  // extra ssh arguments, e.g. -i KEY
  EnvList env, env_server, env_worker;   // --env, --env-server, --env-worker
  double grace_s = 5;                    // SIGTERM → SIGKILL grace period
  // --max-restarts of a parameter-server job (not elastic): how many dead
  // workers the launcher restarts with their rank over the job (docs/ps.md
  // "Worker restart"); 0 = a dead worker fails the job.
  int max_restarts = 0;
  bool verbose = false;
  // PUSHPULL_JOB_SECRET of every process and of the scheduler:
  // resolve_launch_secret() (launcher.h). "" = none: only when the user set
  // it empty together with PUSHPULL_ALLOW_INSECURE=1.
  std::string job_secret;
  bool allow_insecure = false;  // PUSHPULL_ALLOW_INSECURE=1, passed on to every process
  bool tls = false;       // --tls or PUSHPULL_TLS=1: every connection over TLS 1.3 (passed on)
  bool bind_any = false;  // PUSHPULL_BIND_ANY=1: the scheduler binds the wildcard address
  // torchrun-style per-node mode (--nnodes > 0): every host runs its own
  // launcher for its num_workers workers (and num_servers servers), global
  // ranks node_rank * num_workers + local rank of nnodes * num_workers (the
  // same for servers), meeting at master_addr:port: node 0's worker 0 binds
  // it without servers, node 0's launcher's scheduler with them.
  int nnodes = 0;
  int node_rank = 0;
  std::string master_addr;
};

struct ProcessSpec {
  Role role = Role::kWorker;
  int rank = 0;        // among its role
  int local_rank = 0;  // among its role on its host
  int local_size = 1;
  size_t host_index = 0;  // into LaunchConfig::hosts (0 when local)
  std::string host;       // "localhost" address when local
  int ssh_port = 22;
  std::map<std::string, std::string> env;  // what the launcher sets (not inherited vars)
  std::vector<std::string> argv;           // the program to run on that host

  std::string label() const;  // "worker 3", "server 0"
};

// Where the nodes find the scheduler (or, with no servers, rank 0's rendezvous).
struct Rendezvous {
  Rendezvous() = default;
  Rendezvous(std::string a, int p) : addr(std::move(a)), port(p) {}  // {addr, port}
  std::string addr;
  int port = 0;
  // torchrun's MASTER_ADDR / MASTER_PORT when a scheduler holds `port`
  // (-s > 0): worker 0's host and a port of its own, so a torch.distributed
  // script's store never collides with the scheduler. Also with -s 0 when the
  // launcher holds `port` for worker 0 (PUSHPULL_LISTEN_FD): a torch store
  // cannot adopt that socket, so it gets a port of its own while
  // PUSHPULL_MASTER_PORT stays `port`. Empty / 0: addr, port.
  std::string master_addr;
  int master_port = 0;
};

// Places every process (servers first, by rank) and fills its env and argv.
// Throws InvalidArgument when the hosts' slots cannot hold the job.
std::vector<ProcessSpec> make_plan(const LaunchConfig& cfg, const Rendezvous& rv);

// The variables the launcher sets for one process (see docs/launch.md).
std::map<std::string, std::string> process_env(const LaunchConfig& cfg, const Rendezvous& rv,
                                               const ProcessSpec& p);

// Placement only: for each process (servers first, then workers) the index of
// its host. Exposed for tests.
std::vector<size_t> place(const std::vector<HostEntry>& hosts, int num_servers, int num_workers,
                          size_t spare_hosts = 0);

}  // namespace pushpull::launch
