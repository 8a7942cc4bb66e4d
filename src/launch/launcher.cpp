// SPDX-License-Identifier: Apache-2.0
#include "launch/launcher.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <openssl/rand.h>

#include "base/private_file.h"
#include "base/secret_file.h"
#include "launch/commands.h"
#include "launch/observe.h"
#include "launch/supervisor.h"
#include "net/peer_policy.h"
#include "net/socket.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

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
  std::string hex;
  for (unsigned char b : bytes)
    hex += fmt::format("{:02x}", b);
  return hex;
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

namespace {

std::vector<std::string> merged_env(const Environment& base,
                                    const std::map<std::string, std::string>& overrides) {
  auto vars = base.vars();
  // Names a descriptor the launcher passes to one child only (run_launch):
  // never one from the launcher's own environment.
  vars.erase(net::kListenFdVariable);
  for (const auto& [k, v] : overrides)
    vars[k] = v;
  std::vector<std::string> out;
  out.reserve(vars.size());
  for (const auto& [k, v] : vars)
    out.push_back(k + "=" + v);
  return out;
}

std::string log_path(const LaunchConfig& cfg, const std::string& name) {
  if (cfg.log_dir.empty()) return "";
  return cfg.log_dir + "/" + name + ".log";
}

std::string file_name(const std::string& label) {
  std::string s = label;
  for (char& c : s)
    if (c == ' ') c = '.';
  return s;
}

// Where the nodes meet: the embedded scheduler, or rank 0's rendezvous.
// With -s 0 and the local launcher, rank 0's rendezvous port is bound here
// and held (*held): worker 0 inherits the listening socket (run_launch), so
// no other program can take the port between its choice and its use.
Rendezvous choose_rendezvous(const LaunchConfig& cfg, bool dry_run, net::Fd* held) {
  Rendezvous rv;
  if (cfg.nnodes > 0) return Rendezvous(cfg.master_addr, cfg.port);  // per-node mode: given
  if (cfg.num_servers > 0) {
    rv.addr = cfg.host_ip;
    rv.port = cfg.port;  // 0 until the scheduler has bound
    // MASTER_* for torch.distributed scripts: worker 0's host, a port other
    // than the scheduler's (checked again once the scheduler has bound).
    // Picked and released (racy, see net::pick_unused_port): the listener
    // is torch's store, which cannot be handed a socket; pushpull's own
    // collectives meet through the scheduler.
    auto hosts_of = place(cfg.hosts, cfg.num_servers, cfg.num_workers);
    rv.master_addr =
        cfg.hosts.empty() ? cfg.host_ip : cfg.hosts[hosts_of[size_t(cfg.num_servers)]].host;
    if (!dry_run)
      rv.master_port = net::pick_unused_port(cfg.hosts.empty() ? rv.master_addr : "0.0.0.0");
    return rv;
  }
  // No scheduler: worker 0 listens on the rendezvous port on its own host.
  auto hosts_of = place(cfg.hosts, 0, cfg.num_workers);
  rv.addr = cfg.hosts.empty() ? cfg.host_ip : cfg.hosts[hosts_of[0]].host;
  rv.port = cfg.port;
  if (dry_run) return rv;
  if (cfg.launcher == LauncherKind::kLocal) {
    // Worker 0 is our child: bind its port now (the one given, else any free
    // one; taken: "port P is in use (by another process)") and hand it the
    // listening socket. Bound where worker 0 itself would bind it.
    *held = net::listen_on(net::bind_host_for(rv.addr, cfg.bind_any), cfg.port);
    rv.port = net::local_port(held->get());
    // A torch.distributed store cannot adopt that socket: MASTER_PORT is a
    // port of its own (picked, racy: torch's listener), PUSHPULL_MASTER_PORT
    // the held one.
    rv.master_addr = rv.addr;
    do
      rv.master_port = net::pick_unused_port(rv.addr);
    while (rv.master_port == rv.port);
    return rv;
  }
  // Worker 0 is started by ssh, mpirun or srun, possibly on another host: the
  // launcher cannot hand it a socket. A port free here now, which worker 0
  // binds a moment later (racy, see docs/launch.md; --port chooses it).
  if (rv.port == 0) rv.port = net::pick_unused_port(cfg.hosts.empty() ? rv.addr : "0.0.0.0");
  return rv;
}

Options scheduler_options(const LaunchConfig& cfg, const LaunchContext& ctx) {
  // The job's secret, decided in prepare(), so reading the environment does
  // not go looking for (or create) the per-user secret file.
  Environment env = ctx.env;
  if (!cfg.job_secret.empty()) env.set("PUSHPULL_JOB_SECRET", cfg.job_secret);
  Options o = Options::from_env(env);                // applies PUSHPULL_LOG_LEVEL
  if (cfg.verbose) set_log_level(LogLevel::kDebug);  // --verbose wins over the environment
  o.cluster.role = Role::kScheduler;
  o.cluster.num_servers = cfg.num_servers;
  o.cluster.num_workers = cfg.num_workers;
  o.cluster.root_uri = cfg.host_ip;
  o.cluster.root_port = cfg.port;
  o.net.job_id = cfg.job_id;
  o.net.job_secret = cfg.job_secret;
  if (!cfg.interface.empty()) o.net.interface = cfg.interface;
  if (cfg.timeout_s > 0) {
    o.cluster.heartbeat_timeout = Millis(int64_t(cfg.timeout_s * 1000));
    o.cluster.startup_timeout = o.cluster.heartbeat_timeout;
  }
  return o;
}

std::vector<ChildSpec> child_specs(const LaunchConfig& cfg, const LaunchContext& ctx,
                                   const Rendezvous& rv, const std::vector<ProcessSpec>& plan) {
  std::vector<ChildSpec> specs;
  if (cfg.launcher == LauncherKind::kLocal || cfg.launcher == LauncherKind::kSsh) {
    for (const auto& p : plan) {
      ChildSpec s;
      s.label = p.label();
      s.essential = p.role == Role::kWorker;
      s.log_path = log_path(cfg, file_name(s.label));
      s.host = p.host;
      s.role = p.role;
      s.rank = p.rank;
      if (cfg.launcher == LauncherKind::kLocal) {
        s.argv = p.argv;
        s.env = merged_env(ctx.env, p.env);
        s.workdir = cfg.workdir;
      } else {
        s.argv = ssh_argv(cfg, p);
        s.env = merged_env(ctx.env, {});
        s.stop_by_closing_stdin = true;
        s.stdin_data = ssh_stdin(p.env);  // the credentials: never on a command line
      }
      specs.push_back(std::move(s));
    }
    return specs;
  }
  ChildSpec s;
  // Credentials travel in mpirun's / srun's environment, never in argv.
  s.env = merged_env(ctx.env, launcher_env(cfg, rv));
  if (cfg.launcher == LauncherKind::kMpi) {
    s.label = "mpirun";
    s.argv = mpirun_argv(cfg, rv, geteuid() == 0);
  } else {
    s.label = "srun";
    std::string conf = fmt::format("{}/.pushpull-{}.srun.conf", cfg.workdir, cfg.job_id);
    auto srun = srun_command(cfg, rv, conf);
    // A command file at a predictable name: written private, never through
    // a symlink or over another user's file (base/private_file.h).
    base::write_private_file(conf, srun.multi_prog, "srun configuration", /*durable=*/false);
    s.argv = srun.argv;
  }
  s.log_path = log_path(cfg, s.label);
  specs.push_back(std::move(s));
  return specs;
}

// rsync the working directory to every host, one host after the other (two
// "hosts" may share a file system).
int sync_hosts(SignalGuard& signals, const LaunchConfig& cfg, const LaunchContext& ctx) {
  for (const auto& h : cfg.hosts) {
    PP_INFO("syncing {} to {}:{}", ctx.cwd, h.host, cfg.sync_dst_dir);
    ChildSpec s;
    s.label = "rsync " + h.host;
    s.argv = rsync_argv(cfg, h, ctx.cwd, cfg.sync_dst_dir);
    s.env = merged_env(ctx.env, {});
    SupervisorSettings st;
    st.grace = Millis(int64_t(cfg.grace_s * 1000));
    auto out = supervise(signals, {std::move(s)}, st);
    if (out.exit_code != 0) {
      PP_ERROR("syncing to {} failed ({}): nothing was started", h.host, out.reason);
      return out.exit_code;
    }
  }
  return 0;
}

}  // namespace

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

int run_launch(const LaunchConfig& cfg_in, const LaunchContext& ctx) {
  LaunchConfig cfg = cfg_in;
  if (ctx.dry_run) {
    auto rv = choose_rendezvous(cfg, true, nullptr);
    print_plan(std::cout, cfg, rv, make_plan(cfg, rv), geteuid() == 0);
    return 0;
  }
  SignalGuard signals;  // before the scheduler's threads exist
  if (!cfg.log_dir.empty()) {
    base::make_private_dirs(cfg.log_dir, "--log-dir");
  }
  if (!cfg.sync_dst_dir.empty())
    if (int rc = sync_hosts(signals, cfg, ctx); rc != 0) return rc;

  std::unique_ptr<EmbeddedScheduler> scheduler;
  net::Fd rendezvous_listener;  // -s 0, local: worker 0's, until it is started
  net::Fd reserved;             // no embedded scheduler: its port, held
  Rendezvous rv = choose_rendezvous(cfg, false, &rendezvous_listener);
  if (cfg.num_servers > 0) {
    if (ctx.scheduler_factory) {
      scheduler = ctx.scheduler_factory(scheduler_options(cfg, ctx));
      scheduler->allow_worker_restarts(cfg.max_restarts > 0);
      // The advertised address only: a loopback job stays on loopback, a
      // multi-host one on the interface it hands out (PUSHPULL_BIND_ANY=1:
      // every interface).
      std::string bind = cfg.bind_any ? "" : cfg.host_ip;
      rv.port = scheduler->start(cfg.host_ip, bind, cfg.port);
      while (rv.master_port == rv.port)  // never the scheduler's port (docs/launch.md)
        rv.master_port = net::pick_unused_port(cfg.hosts.empty() ? rv.master_addr : "0.0.0.0");
      PP_INFO("scheduler listening on {}:{}{}", bind.empty() ? "*" : bind, rv.port,
              bind.empty() ? " (PUSHPULL_BIND_ANY=1)" : "");
    } else {
      // Held (bound, not listening) for the job's life, so no other program
      // is handed it meanwhile.
      reserved = net::reserve_port(cfg.host_ip, rv.port);
      rv.port = net::local_port(reserved.get());
      PP_WARN(
          "this build has no embedded scheduler (the cluster layer is not linked): nothing "
          "listens on {}:{} (held, connections refused); the processes must not need a "
          "scheduler",
          rv.addr, rv.port);
    }
  }
  JobTimeline timeline(cfg, ctx.env);  // before the plan: adds PUSHPULL_TIMELINE_CLOCK
  auto plan = make_plan(cfg, rv);
  if (cfg.verbose) print_plan(std::cerr, cfg, rv, plan, geteuid() == 0);

  SupervisorSettings settings;
  settings.grace = Millis(int64_t(cfg.grace_s * 1000));
  settings.service_deadline = Millis(int64_t((cfg.timeout_s > 0 ? cfg.timeout_s : 30) * 1000));
  settings.max_restarts = cfg.max_restarts;
  SupervisorHooks hooks;
  int restarts_left = cfg.max_restarts;
  std::map<std::pair<Role, int>, int> restarted;  // (role, rank) -> restarts so far
  if (scheduler) {
    hooks.scheduler = [&]() -> SchedulerState {
      auto st = scheduler->status();
      if (!st) return {};
      if (st->is_ok()) return {SchedulerState::Kind::kSucceeded, ""};
      return {SchedulerState::Kind::kFailed, st->message()};
    };
    hooks.on_exit = [&](const ChildSpec& spec, const ChildResult& r) {
      if (spec.role == Role::kWorker || spec.role == Role::kServer)
        scheduler->process_exited(spec.role, spec.rank, r.exited ? r.code : 0,
                                  r.exited ? 0 : r.code);
    };
    hooks.survivable = [&](const ChildSpec& spec, const ChildResult& r) {
      // A running worker the scheduler lost more often than it was restarted
      // (stopped, unreachable) is killed, then restarted.
      if (spec.role == Role::kWorker)
        return !r.ended && cfg.max_restarts > 0 &&
               scheduler->worker_losses(spec.rank) > restarted[{spec.role, spec.rank}];
      // A failed-over server; not its restarted process, which rejoins.
      return scheduler->failed_over(spec.role, spec.rank) &&
             (r.ended || cfg.max_restarts == 0 ||
              scheduler->server_losses(spec.rank) > restarted[{spec.role, spec.rank}]);
    };
    if (cfg.max_restarts > 0)
      hooks.restart = [&](ChildSpec& spec, const ChildResult& r) {
        // Once the job failed nothing is restarted: a process that ended
        // because of the failure is a consequence, not a fault to repair
        // (before, the launcher logged restarts after "job failed").
        if (scheduler->job_failed()) return false;
        // Workers, and servers the job went on without (failed over: they
        // rejoin). The scheduler may not have seen a server's connection
        // close yet: its exit, told first, fails it over (or fails the job).
        if (spec.role == Role::kServer) {
          if (!scheduler->failed_over(spec.role, spec.rank))
            scheduler->process_exited(spec.role, spec.rank, r.exited ? r.code : 0,
                                      r.exited ? 0 : r.code);
          if (!scheduler->failed_over(spec.role, spec.rank)) return false;
        }
        if (spec.role != Role::kWorker && spec.role != Role::kServer) return false;
        if (restarts_left <= 0) {
          PP_ERROR("{} (pid {}) ended with {}; no restarts left (--max-restarts {})", spec.label,
                   r.pid, describe_status(r.exited, r.code), cfg.max_restarts);
          return false;
        }
        --restarts_left;
        ++restarted[{spec.role, spec.rank}];
        scheduler->process_restarting(spec.role, spec.rank, r.exited ? r.code : 0,
                                      r.exited ? 0 : r.code);
        PP_WARN("{} (pid {}) ended with {}; restarting it with the same rank (restart {} of {})",
                spec.label, r.pid, describe_status(r.exited, r.code),
                cfg.max_restarts - restarts_left, cfg.max_restarts);
        return true;
      };
  }
  auto specs = child_specs(cfg, ctx, rv, plan);
  if (rendezvous_listener.valid()) {
    // Worker 0 inherits its rendezvous listener (net::take_inherited_listener);
    // the supervisor closes our copy once it has started.
    for (auto& spec : specs)
      if (spec.role == Role::kWorker && spec.rank == 0) {
        spec.env.push_back(fmt::format("{}={}", net::kListenFdVariable, rendezvous_listener.get()));
        spec.pass_fd = rendezvous_listener.release();
        break;
      }
  }
  const auto started = std::filesystem::file_time_type::clock::now();
  auto outcome = supervise(signals, std::move(specs), settings, hooks);
  if (cfg.launcher == LauncherKind::kSlurm)
    std::filesystem::remove(fmt::format("{}/.pushpull-{}.srun.conf", cfg.workdir, cfg.job_id));
  if (scheduler) {
    // Every node has exited: the scheduler cannot learn anything more, it
    // only needs a moment to see the last ones leave.
    if (outcome.exit_code == 0 && !scheduler->wait(Millis(2000)))
      PP_WARN(
          "the scheduler did not see every node leave (did they all call shutdown?): stopping it");
    scheduler->stop();
  }
  timeline.merge(signals, cfg, plan);  // F from every process's file, clocks aligned
  if (outcome.exit_code != 0) {
    // The last word: the root cause, then what followed from it.
    std::string text = fmt::format("job failed: {}", outcome.reason);
    if (!outcome.consequences.empty())
      text += "\n  consequences: " + fmt::format("{}", fmt::join(outcome.consequences, ", "));
    text += flight_recorder_note(cfg, ctx.env, plan, started);
    PP_ERROR("{}", text);
  }
  return outcome.exit_code;
}

}  // namespace pushpull::launch
