// SPDX-License-Identifier: Apache-2.0
// `pushpull launch`: starts a job's scheduler (in this process), servers and
// workers on this host or on the hosts of a hostfile. See docs/launch.md.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "base/file_auth.h"
#include "base/private_file.h"
#include "commands.h"
#include "launch/cluster_env.h"
#include "launch/cluster_scheduler.h"
#include "launch/elastic_driver.h"
#include "launch/host_list.h"
#include "launch/launcher.h"
#include "launch_elastic.h"
#include "ps/checkpoint.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull::cli {
namespace {

struct LaunchArgs {
  launch::LaunchConfig cfg;
  std::string hostfile, launcher;
  std::string server_hosts;  // --server-hosts: spare hosts, a server each
  std::vector<std::string> env, env_server, env_worker;
  std::vector<std::string> command;
  bool dry_run = false;
  std::string timeline;    // --timeline-filename
  int nproc_per_node = 0;  // per-node mode (--nnodes)
  bool workers_given = false;
  launch::ElasticConfig elastic;           // --min-workers/--max-workers/...: docs/elastic.md
  std::string checkpoint_dir, resume_dir;  // docs/ps.md "Checkpoints"
  int64_t checkpoint_every = 0;
  std::set<std::string> given;  // the per-node options given on the command line
};

// --checkpoint-dir/--checkpoint-every/--resume: checks them and passes them
// to the servers (and the resumed round to every process) in the
// environment. --resume validates every file of the last complete
// checkpoint first, so a torn or foreign file stops the job before it
// starts. Every file must verify under the user's checkpoint key
// (base::checkpoint_key: the per-user secret file or
// PUSHPULL_CHECKPOINT_KEY_FILE, forwarded to the servers); the servers get
// the key's id and stop at start-up when theirs differs (another host's
// secret). Throws InvalidArgument.
void checkpoint_config(LaunchArgs& a, const Environment& env) {
  auto& c = a.cfg;
  if (a.checkpoint_every < 0) throw InvalidArgument("--checkpoint-every must be >= 0");
  if (!a.resume_dir.empty() && a.checkpoint_dir.empty() && a.checkpoint_every > 0)
    a.checkpoint_dir = a.resume_dir;  // go on checkpointing where we resume from
  if (a.checkpoint_every > 0 && a.checkpoint_dir.empty())
    throw InvalidArgument("--checkpoint-every needs --checkpoint-dir DIR");
  if (a.checkpoint_every == 0 && !a.checkpoint_dir.empty())
    throw InvalidArgument("--checkpoint-dir needs --checkpoint-every N (rounds, N >= 1)");
  if ((a.checkpoint_every > 0 || !a.resume_dir.empty()) && c.num_servers < 1)
    throw InvalidArgument("checkpoints are the parameter servers': they need -s >= 1");
  if (a.checkpoint_every == 0 && a.resume_dir.empty()) return;
  base::FileKey key;
  try {
    key = base::checkpoint_key(env);
  } catch (const Error& e) {
    throw InvalidArgument(fmt::format("checkpoints need the checkpoint key: {}", e.what()));
  }
  if (auto f = env.get("PUSHPULL_CHECKPOINT_KEY_FILE"); f && !f->empty())
    c.env_server.emplace_back("PUSHPULL_CHECKPOINT_KEY_FILE",
                              std::filesystem::absolute(*f).string());
  c.env_server.emplace_back("PUSHPULL_CHECKPOINT_KEY_ID", key.id_hex());
  if (a.checkpoint_every > 0 && !a.dry_run && c.hosts.empty()) {
    // Made here (0700) before anything starts, so a directory or symlink
    // another user planted at its name (in /tmp, say) stops the job now,
    // naming it, instead of failing every checkpoint (base/private_file.h).
    try {
      base::make_private_dirs(std::filesystem::absolute(a.checkpoint_dir).string(),
                              "--checkpoint-dir");
    } catch (const IoError& e) {
      throw InvalidArgument(e.what());
    }
  }
  if (a.checkpoint_every > 0) {
    c.env_server.emplace_back("PUSHPULL_CHECKPOINT_DIR",
                              std::filesystem::absolute(a.checkpoint_dir).string());
    c.env_server.emplace_back("PUSHPULL_CHECKPOINT_EVERY", std::to_string(a.checkpoint_every));
  }
  if (a.resume_dir.empty()) return;
  std::optional<int64_t> round;
  try {
    round = ps::last_complete_checkpoint(a.resume_dir, c.num_servers);
    if (!round)
      throw InvalidArgument(fmt::format(
          "--resume {}: no complete checkpoint for {} servers there (a round-* directory with "
          "server-0..{}.ppckpt)",
          a.resume_dir, c.num_servers, c.num_servers - 1));
    for (int s = 0; s < c.num_servers; ++s)
      ps::read_checkpoint(ps::checkpoint_path(a.resume_dir, *round, s),
                          {c.num_servers, s, c.num_workers}, key);
  } catch (const IoError& e) {
    throw InvalidArgument(fmt::format("--resume {}: {}", a.resume_dir, e.what()));
  }
  // The crashed run's rounds after R are incomplete; left in place, the
  // resumed run's files of such a round would complete it with theirs.
  if (!a.dry_run)
    for (const auto& moved : ps::set_aside_rounds_after(a.resume_dir, *round))
      fmt::print(stderr, "pushpull launch: set aside the incomplete round {}\n", moved);
  c.env_server.emplace_back("PUSHPULL_RESUME_DIR",
                            std::filesystem::absolute(a.resume_dir).string());
  c.env.emplace_back("PUSHPULL_RESUME_ROUND", std::to_string(*round));
  fmt::print(stderr, "pushpull launch: resuming from round {} ({})\n", *round,
             ps::checkpoint_path(a.resume_dir, *round, 0));
}

// torchrun's per-node mode: --nnodes, --nproc-per-node, or a Kubeflow
// Trainer pod (PET_NNODES) without -n/-H/--launcher. What the flags leave
// out comes from the cluster manager's variables (launch/cluster_env.h:
// Kubeflow, srun, mpirun). Checks the options and turns --nproc-per-node
// into this node's worker count, -s into this node's server count. Throws
// InvalidArgument.
void per_node_config(LaunchArgs& a, bool workers_given, const Environment& env) {
  auto& c = a.cfg;
  const bool wanted =
      c.nnodes > 0 || a.nproc_per_node > 0 ||
      (env.get("PET_NNODES") && !workers_given && a.hostfile.empty() && a.launcher.empty());
  if (!wanted) {
    if (!workers_given)
      throw InvalidArgument("-n/--num-workers is required (or --nnodes with --nproc-per-node)");
    if (c.num_servers < 0) c.num_servers = c.num_workers;
    return;
  }
  auto from = launch::cluster_node_env(env, [](const std::string& path) {
    std::ifstream in(path);
    if (!in) return std::optional<std::string>();
    std::stringstream text;
    text << in.rdbuf();
    return std::optional<std::string>(text.str());
  });
  auto given = [&](const char* flag) { return a.given.count(flag) > 0; };
  if (!given("--nnodes") && from.nnodes > 0) c.nnodes = from.nnodes;
  if (!given("--node-rank") && from.node_rank >= 0) c.node_rank = from.node_rank;
  if (!given("--nproc-per-node") && from.nproc_per_node > 0) a.nproc_per_node = from.nproc_per_node;
  if (!given("--master-addr") && !from.master_addr.empty()) c.master_addr = from.master_addr;
  if (!given("--master-port"))
    c.port = from.master_port > 0 ? from.master_port
                                  : (from.source.empty() ? 0 : launch::kDefaultMasterPort);
  if (a.nproc_per_node < 1) a.nproc_per_node = 1;  // torchrun's default
  const std::string src = from.source.empty()
                              ? std::string()
                              : fmt::format(" (read from the {} variables)", from.source);
  if (c.nnodes <= 0)
    throw InvalidArgument(
        "the per-node mode needs --nnodes N (or PET_NNODES, WORLD_SIZE, SLURM_JOB_NUM_NODES, "
        "OMPI_COMM_WORLD_SIZE)");
  if (workers_given && c.num_workers != a.nproc_per_node * c.nnodes)
    throw InvalidArgument(fmt::format("-n {} is not --nnodes {} x --nproc-per-node {}",
                                      c.num_workers, c.nnodes, a.nproc_per_node));
  if (c.node_rank < 0 || c.node_rank >= c.nnodes)
    throw InvalidArgument(
        fmt::format("--node-rank {} is not in 0..{}{}", c.node_rank, c.nnodes - 1, src));
  if (c.master_addr.empty() || c.port <= 0)
    throw InvalidArgument(
        fmt::format("--nnodes needs --master-addr (node 0's address) and --master-port{}", src));
  if (!a.hostfile.empty() || !a.launcher.empty())
    throw InvalidArgument(
        "--nnodes runs this node's share of the job: no -H or --launcher with it");
  c.num_workers = a.nproc_per_node;
  // -s in the per-node mode: servers on this node (0: a collectives-only job).
  if (c.num_servers < 0) c.num_servers = 0;
  // Every node's workers prove the same secret (a fresh one per launcher
  // would differ): PUSHPULL_JOB_SECRET or PUSHPULL_JOB_SECRET_FILE when set,
  // else the per-user secret file, the same on hosts sharing the home
  // directory (launch::resolve_launch_secret, docs/security.md).
  // Every node's launcher must name the same job (peers check it): derived
  // from the meeting point unless PUSHPULL_JOB_ID says otherwise.
  if (c.job_id.empty() && !env.get("PUSHPULL_JOB_ID"))
    c.job_id = fmt::format("pp-{}-{}", c.master_addr, c.port);
  // Peers reach this node's workers at its own address, not at the master's:
  // the --interface one, else the route's toward node 0.
  if (c.host_ip.empty() && !c.interface.empty()) {
    auto addr = launch::interface_ipv4_address(c.interface);
    if (!addr)
      throw InvalidArgument(fmt::format(
          "--interface {}: this host has no IPv4 address on it (give --host-ip)", c.interface));
    c.host_ip = *addr;
  }
  if (c.host_ip.empty() && !a.dry_run) {
    // Node 0's name may not resolve yet (a pod's DNS record appears once the
    // pod has an address): wait for it, up to --timeout (default 5 min).
    const auto within = std::chrono::milliseconds(
        static_cast<int64_t>((c.timeout_s > 0 ? c.timeout_s : 300) * 1000));
    if (!launch::wait_until_resolvable(c.master_addr, within))
      throw InvalidArgument(fmt::format("--master-addr {}{} does not resolve after {} s",
                                        c.master_addr, src, within.count() / 1000));
  }
  if (c.host_ip.empty()) c.host_ip = launch::address_toward(c.master_addr);
}

// "NAME=VALUE" sets; "NAME" forwards the launcher's value.
launch::EnvList resolve_env(const std::vector<std::string>& items, const Environment& env,
                            const char* flag) {
  launch::EnvList out;
  for (const auto& item : items) {
    auto eq = item.find('=');
    std::string name = item.substr(0, eq);
    bool ok = !name.empty() && !(name[0] >= '0' && name[0] <= '9');
    for (char c : name)
      ok = ok && (c == '_' || std::isalnum(static_cast<unsigned char>(c)));
    if (!ok)
      throw InvalidArgument(fmt::format("{} {}: '{}' is not a variable name", flag, item, name));
    if (eq != std::string::npos) {
      out.emplace_back(name, item.substr(eq + 1));
    } else if (auto v = env.get(name)) {
      out.emplace_back(name, *v);
    } else {
      throw InvalidArgument(
          fmt::format("{} {}: {} is not set in the launcher's environment (use {}=VALUE)", flag,
                      name, name, name));
    }
  }
  return out;
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("pushpull") : p.string();
}

int run(LaunchArgs& a, const std::vector<std::string>& command) {
  launch::LaunchContext ctx;
  ctx.env = Environment::current();
  ctx.self_exe = self_exe();
  std::error_code ec;
  ctx.cwd = std::filesystem::current_path(ec).string();
  ctx.dry_run = a.dry_run;
  auto& cfg = a.cfg;
  try {
    cfg.command = command;
    if (!command.empty() && command[0].size() > 1 && command[0][0] == '-')
      throw InvalidArgument(
          fmt::format("unknown option {} (put the program after '--' if its name starts with '-')",
                      command[0]));
    const bool servers_given = cfg.num_servers >= 0;
    per_node_config(a, a.workers_given, ctx.env);
    if (!a.hostfile.empty()) cfg.hosts = launch::read_hosts(a.hostfile);  // file or h1:2,h2:2
    if (!a.server_hosts.empty()) {
      if (cfg.hosts.empty() || cfg.nnodes > 0)
        throw InvalidArgument(
            "--server-hosts needs the workers' hosts in -H (and no --nnodes): the spare hosts "
            "come on top of them");
      auto spare = launch::read_hosts(a.server_hosts);
      cfg.spare_hosts = spare.size();
      cfg.hosts.insert(cfg.hosts.end(), spare.begin(), spare.end());
      if (!servers_given) cfg.num_servers = static_cast<int>(spare.size());
    }
    if (a.launcher.empty()) {
      cfg.launcher = cfg.hosts.empty() ? launch::LauncherKind::kLocal : launch::LauncherKind::kSsh;
    } else if (auto k = launch::parse_launcher(a.launcher)) {
      cfg.launcher = *k;
    } else {
      throw InvalidArgument(
          fmt::format("unknown launcher '{}' (use local, ssh, mpi or slurm)", a.launcher));
    }
    cfg.env = resolve_env(a.env, ctx.env, "--env");
    if (!a.timeline.empty()) cfg.env.emplace_back("PUSHPULL_TIMELINE", a.timeline);
    cfg.env_server = resolve_env(a.env_server, ctx.env, "--env-server");
    cfg.env_worker = resolve_env(a.env_worker, ctx.env, "--env-worker");
    checkpoint_config(a, ctx.env);
    // One --max-restarts: replacements in an elastic job, restarts (same
    // rank) in a parameter-server job.
    if (!a.elastic.enabled()) cfg.max_restarts = a.elastic.max_restarts;
    if (a.elastic.enabled())
      launch::prepare_elastic(cfg, a.elastic, ctx);
    else
      launch::prepare(cfg, ctx);
  } catch (const InvalidArgument& e) {
    fmt::print(stderr, "pushpull launch: {}\n", e.what());
    return 2;
  }
  if (cfg.verbose) set_log_level(LogLevel::kDebug);
  // The launcher reports a closed stdout itself; it must not die of SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  if (a.elastic.enabled()) return launch::run_elastic(cfg, a.elastic, ctx);
  ctx.scheduler_factory = launch::cluster_scheduler_factory();
  return launch::run_launch(cfg, ctx);
}

}  // namespace

void register_launch(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  auto* cmd = app.add_subcommand(
      "launch", "Run a job: scheduler, servers and workers on this host or on many");
  cmd->footer("Usage: pushpull launch [OPTIONS] [--] COMMAND [ARGS...]  (see docs/launch.md)");
  // Everything from the first positional argument on (or after "--") is the
  // program and its own arguments, never the launcher's options.
  cmd->positionals_at_end();
  auto& c = args->cfg;
  c.num_servers = -1;  // default: as many as workers
  cmd->add_option("-n,--num-workers", c.num_workers, "Number of workers");
  cmd->add_option("-s,--num-servers", c.num_servers,
                  "Number of servers (default: as many as workers; 0: collective-only job)");
  cmd->add_option("-H,--hostfile,--hosts", args->hostfile,
                  "A hostfile (one per line: host[:sshport] [slots=K]) or a list h1:2,h2:2 "
                  "(host:slots)");
  cmd->add_option("--server-hosts", args->server_hosts,
                  "Spare hosts (h1,h2 or a hostfile) that run one server each and no worker; "
                  "-s beyond their number puts the other servers on the -H hosts (one per "
                  "worker host: BytePS's hybrid; docs/ps.md \"Mixed placement\")");
  cmd->add_option("--nnodes", c.nnodes,
                  "torchrun-style: run one launcher per node, this many nodes (collectives only)");
  cmd->add_option("--node-rank", c.node_rank, "With --nnodes: this node's index, 0..nnodes-1");
  cmd->add_option("--nproc-per-node", args->nproc_per_node, "With --nnodes: workers on this node");
  cmd->add_option("--master-addr", c.master_addr, "With --nnodes: node 0's address");
  cmd->add_option("--master-port", c.port, "With --nnodes: the rendezvous port on node 0");
  cmd->add_option("--timeline-filename", args->timeline,
                  "Every process writes a Chrome trace F.<role><rank>.json (PUSHPULL_TIMELINE; "
                  "docs/timeline.md)");
  cmd->add_option("--launcher", args->launcher,
                  "local, ssh, mpi or slurm (default: local without -H, ssh with it)");
  cmd->add_option("--sync-dst-dir", c.sync_dst_dir,
                  "rsync the current directory to DIR on every host first, then run there");
  cmd->add_option("--env", args->env, "NAME=VALUE to set, or NAME to forward (repeatable)")
      ->allow_extra_args(false);  // one value per occurrence
  cmd->add_option("--env-server", args->env_server, "Like --env, for servers only")
      ->allow_extra_args(false);  // one value per occurrence
  cmd->add_option("--env-worker", args->env_worker, "Like --env, for workers only")
      ->allow_extra_args(false);  // one value per occurrence
  cmd->add_option("--server-command", c.server_command,
                  "Shell command line run for servers (default: this binary's `server`)");
  cmd->add_option("--host-ip", c.host_ip, "The scheduler's address as the other nodes see it");
  cmd->add_option("--interface", c.interface, "Network interface every node uses (DMLC_INTERFACE)");
  cmd->add_option("--port", c.port, "Scheduler port (default: a free port)");
  cmd->add_option("--timeout", c.timeout_s,
                  "Startup and failure deadline in seconds, passed to the nodes; also how long "
                  "servers get to exit after the workers (default 30)");
  cmd->add_option("--grace", c.grace_s, "Seconds between SIGTERM and SIGKILL when stopping (5)");
  cmd->add_option("--log-dir", c.log_dir,
                  "Also write each process's output to DIR/<role>.<rank>.log");
  cmd->add_option("--ssh-option", c.ssh_options,
                  "Extra argument for ssh and rsync's ssh, e.g. --ssh-option=-i --ssh-option=KEY "
                  "(repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("command", args->command, "The worker program and its arguments")
      ->expected(1, -1)
      ->allow_extra_args();
  cmd->add_option("--checkpoint-dir", args->checkpoint_dir,
                  "Servers write checkpoints of their key ranges here (docs/ps.md)");
  cmd->add_option("--checkpoint-every", args->checkpoint_every,
                  "Write a checkpoint every N dist_sync rounds (with --checkpoint-dir)");
  cmd->add_option("--resume", args->resume_dir,
                  "Restart the job from the last complete checkpoint in DIR (workers get "
                  "PUSHPULL_RESUME_ROUND)");
  cmd->add_flag("--tls", c.tls,
                "Run every connection of the job over TLS 1.3 keyed from the job secret "
                "(PUSHPULL_TLS=1; docs/security.md \"Encryption\")");
  cmd->add_flag("--dry-run", args->dry_run, "Print the plan and exit without running anything");
  cmd->add_flag("-v,--verbose", c.verbose, "Print the plan and each process's variables");
  // Last, so a --max-restarts registered above (the restart policy) is shared.
  add_elastic_options(cmd, args->elastic);
  cmd->callback([args, cmd] {
    args->workers_given = cmd->count("--num-workers") > 0;
    elastic_restarts(cmd, args->elastic, &args->cfg.num_servers);
    if (args->elastic.enabled() && !args->workers_given) {
      args->workers_given = true;  // -n defaults to --max-workers (else --min-workers)
      args->cfg.num_workers = std::max({1, args->elastic.max_workers, args->elastic.min_workers});
    }
    for (const char* flag :
         {"--nnodes", "--node-rank", "--nproc-per-node", "--master-addr", "--master-port"})
      if (cmd->count(flag) > 0) args->given.insert(flag);
    int code = run(*args, args->command);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace pushpull::cli
