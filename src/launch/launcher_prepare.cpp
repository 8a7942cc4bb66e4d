// SPDX-License-Identifier: Apache-2.0
// prepare() and print_plan() of launcher.h: checking a job's configuration
// and filling its defaults (job id, host address, the job secret), and the
// plan --dry-run and -v print. Kept apart from run_launch (launcher.cpp).
#include <unistd.h>

#include <iostream>
#include <random>

#include <fmt/format.h>
#include <openssl/rand.h>

#include "base/hex.h"
#include "base/secret_file.h"
#include "launch/commands.h"
#include "launch/launcher.h"
#include "pushpull/error.h"

namespace pushpull::launch {

namespace {

std::string make_job_id() {
  std::random_device rd;
  return fmt::format("pp-{}-{:08x}{:08x}", getpid(), rd(), rd());
}

}  // namespace

std::string make_job_secret() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1)
    throw IoError("cannot generate the job secret: OpenSSL's RAND_bytes failed");
  return to_hex(bytes, sizeof bytes);
}

std::string resolve_launch_secret(const LaunchConfig& cfg, const Environment& env,
                                  const std::optional<std::string>& given) {
  if (given && !given->empty()) return *given;
  if (auto f = env.get("PUSHPULL_JOB_SECRET_FILE"); f && !f->empty())
    return base::read_secret_file(*f);
  // Set but empty asks for no secret: only PUSHPULL_ALLOW_INSECURE=1 grants it.
  if (given && cfg.allow_insecure) return {};
  if (cfg.nnodes > 0) {
    // Every node's launcher must give its workers the same secret; a fresh
    // one each would differ. The per-user file is the same on every host
    // that shares the home directory (docs/security.md).
    if (cfg.allow_insecure) return {};
    return base::user_secret(env).secret;
  }
  return make_job_secret();
}

void prepare(LaunchConfig& cfg, const LaunchContext& ctx) {
  auto bad = [](const std::string& m) { throw InvalidArgument(m); };
  if (cfg.command.empty())
    bad("no command to run: put it after the options, e.g. pushpull launch -n 2 -- ./train");
  if (cfg.num_workers < 1)
    bad(fmt::format("-n/--num-workers must be at least 1 (got {})", cfg.num_workers));
  if (cfg.num_servers < 0)
    bad(fmt::format("-s/--num-servers must not be negative (got {})", cfg.num_servers));
  if (cfg.port < 0 || cfg.port > 65535) bad(fmt::format("--port {} is not in 0..65535", cfg.port));
  if (cfg.timeout_s < 0) bad("--timeout must not be negative");
  if (cfg.max_restarts < 0) bad("--max-restarts must not be negative");
  if (cfg.max_restarts > 0 && cfg.num_servers < 1)
    bad("--max-restarts restarts dead workers of a parameter-server job (-s >= 1), or replaces "
        "them in an elastic job (--min-workers/--max-workers, docs/elastic.md)");
  if (cfg.max_restarts > 0 && cfg.launcher != LauncherKind::kLocal &&
      cfg.launcher != LauncherKind::kSsh)
    bad("--max-restarts needs the local or ssh launcher (it restarts one process at a time)");
  if (!cfg.sync_dst_dir.empty() && cfg.hosts.empty())
    bad("--sync-dst-dir copies the current directory to the hosts of -H/--hostfile: give -H too");
  if (!cfg.sync_dst_dir.empty() && cfg.launcher != LauncherKind::kSsh)
    bad("--sync-dst-dir needs the ssh launcher");
  if (cfg.launcher == LauncherKind::kLocal && !cfg.hosts.empty())
    bad("--launcher local runs everything on this host: drop -H or use --launcher ssh");
  if (cfg.launcher == LauncherKind::kSsh && cfg.hosts.empty())
    bad("--launcher ssh needs the hosts: give -H/--hostfile");
  if (cfg.launcher == LauncherKind::kSlurm && !cfg.hosts.empty())
    bad("--launcher slurm runs on the Slurm allocation: drop -H");
  // Slots are checked here so a too-small hostfile is a usage error.
  (void)place(cfg.hosts, cfg.num_servers, cfg.num_workers);

  // One host (local, or mpirun without a hostfile): loopback; else the
  // address of --interface, else one the other hosts can reach.
  if (cfg.host_ip.empty()) {
    if (cfg.hosts.empty() && cfg.launcher != LauncherKind::kSlurm) {
      cfg.host_ip = "127.0.0.1";
    } else if (!cfg.interface.empty()) {
      auto addr = interface_ipv4_address(cfg.interface);
      if (!addr)
        bad(fmt::format("--interface {}: this host has no IPv4 address on it (give --host-ip)",
                        cfg.interface));
      cfg.host_ip = *addr;
    } else {
      cfg.host_ip = first_ipv4_address();
    }
  }
  if (cfg.job_id.empty()) cfg.job_id = ctx.env.get("PUSHPULL_JOB_ID").value_or(make_job_id());
  if (cfg.server_command.empty()) cfg.server_command = shell_quote(ctx.self_exe) + " server";
  if (cfg.workdir.empty()) cfg.workdir = cfg.sync_dst_dir.empty() ? ctx.cwd : cfg.sync_dst_dir;
  cfg.allow_insecure = ctx.env.get("PUSHPULL_ALLOW_INSECURE") == "1";
  cfg.tls = cfg.tls || ctx.env.get("PUSHPULL_TLS") == "1";
  if (cfg.tls && cfg.allow_insecure)
    throw InvalidArgument(
        "--tls (PUSHPULL_TLS=1) needs the job secret its key is derived from, and "
        "PUSHPULL_ALLOW_INSECURE=1 turns secrets off: unset one of them");
  cfg.bind_any = ctx.env.get("PUSHPULL_BIND_ANY") == "1";

  // The job secret: --env's, else the launcher's, else a fresh one. Every
  // process gets it through its environment only (see commands.h).
  for (const EnvList* role_list : {&cfg.env_server, &cfg.env_worker})
    for (const auto& [k, v] : *role_list)
      if (k == "PUSHPULL_JOB_SECRET")
        bad("PUSHPULL_JOB_SECRET belongs to the whole job: set it with --env or in the "
            "launcher's environment, not for one role");
  std::optional<std::string> secret = ctx.env.get("PUSHPULL_JOB_SECRET");
  std::erase_if(cfg.env, [&](const auto& kv) {
    if (kv.first != "PUSHPULL_JOB_SECRET") return false;
    secret = kv.second;
    return true;
  });
  cfg.job_secret = resolve_launch_secret(cfg, ctx.env, secret);
  // Credentials that could not travel as the launcher passes them.
  ProcessSpec probe;
  for (Role role : {Role::kWorker, Role::kServer}) {
    probe.role = role;
    for (const auto& [k, v] : sensitive_only(process_env(cfg, Rendezvous{}, probe)))
      if (cfg.launcher == LauncherKind::kSsh && v.find('\n') != std::string::npos)
        bad(fmt::format("{} holds a newline: the ssh launcher passes it as one line", k));
  }
  if (cfg.launcher == LauncherKind::kMpi || cfg.launcher == LauncherKind::kSlurm)
    (void)launcher_env(cfg, Rendezvous{});
}

void print_plan(std::ostream& out, const LaunchConfig& cfg, const Rendezvous& rv,
                const std::vector<ProcessSpec>& plan, bool as_root) {
  out << fmt::format("# pushpull launch plan: {} workers, {} servers, launcher {}, job {}\n",
                     cfg.num_workers, cfg.num_servers, launcher_name(cfg.launcher), cfg.job_id);
  out << fmt::format(
      "# {} {}:{}, working directory {}\n",
      cfg.num_servers > 0 ? "scheduler (in the launcher) at" : "rendezvous (worker 0) at", rv.addr,
      rv.port == 0 ? std::string("auto") : std::to_string(rv.port), cfg.workdir);
  out << fmt::format("{:<16} {:<7} {:>4} {:>5}  {}\n", "HOST", "ROLE", "RANK", "LOCAL", "COMMAND");
  for (const auto& p : plan) {
    out << fmt::format("{:<16} {:<7} {:>4} {:>5}  {}\n", p.host, role_name(p.role), p.rank,
                       p.local_rank, shell_join(p.argv));
    if (cfg.verbose)
      for (const auto& [k, v] : p.env)
        out << fmt::format("    {}={}\n", k, masked_value(k, v));
  }
  if (cfg.launcher == LauncherKind::kMpi)
    out << "# runs: " << shell_join(mpirun_argv(cfg, rv, as_root)) << "\n";
  if (cfg.launcher == LauncherKind::kSlurm) {
    auto srun = srun_command(cfg, rv, cfg.workdir + "/.pushpull-" + cfg.job_id + ".srun.conf");
    out << "# runs: " << shell_join(srun.argv) << "\n# with --multi-prog:\n" << srun.multi_prog;
  }
  out.flush();
}

}  // namespace pushpull::launch
