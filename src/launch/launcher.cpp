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

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/private_file.h"
#include "launch/commands.h"
#include "launch/observe.h"
#include "launch/rendezvous_ports.h"
#include "launch/supervisor.h"
#include "pushpull/error.h"
#include "pushpull/log.h"
#include "transport/socket.h"

namespace pushpull::launch {
namespace {

std::vector<std::string> merged_env(const Environment& base,
                                    const std::map<std::string, std::string>& overrides) {
  auto vars = base.vars();
  // Names a descriptor the launcher passes to one child only (run_launch):
  // never one from the launcher's own environment.
  vars.erase(transport::kListenFdVariable);
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

Options scheduler_options(const LaunchConfig& cfg, const LaunchContext& ctx) {
  // The job's secret, decided in prepare(), so reading the environment does
  // not go looking for (or create) the per-user secret file.
  Environment env = ctx.env;
  if (!cfg.job_secret.empty()) env.set("PUSHPULL_JOB_SECRET", cfg.job_secret);
  if (cfg.tls) env.set("PUSHPULL_TLS", "1");
  Options o = Options::from_env(env);                // applies PUSHPULL_LOG_LEVEL
  if (cfg.verbose) set_log_level(LogLevel::kDebug);  // --verbose wins over the environment
  o.cluster.role = Role::kScheduler;
  const int nodes = cfg.nnodes > 0 ? cfg.nnodes : 1;  // per-node mode: the whole job
  o.cluster.num_servers = cfg.num_servers * nodes;
  o.cluster.num_workers = cfg.num_workers * nodes;
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

int run_launch(const LaunchConfig& cfg_in, const LaunchContext& ctx) {
  LaunchConfig cfg = cfg_in;
  if (ctx.dry_run) {
    auto rv = choose_rendezvous(cfg, true, nullptr, nullptr);
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
  transport::Fd rendezvous_listener;  // -s 0, local: worker 0's, until it is started
  transport::Fd reserved;             // no embedded scheduler: its port, held
  transport::Fd torch_store;          // MASTER_PORT (local jobs), held for torch's store
  Rendezvous rv = choose_rendezvous(cfg, false, &rendezvous_listener, &torch_store);
  // Per-node mode: node 0's launcher hosts the scheduler, the others meet it.
  if (cfg.num_servers > 0 && (cfg.nnodes == 0 || cfg.node_rank == 0)) {
    if (ctx.scheduler_factory) {
      scheduler = ctx.scheduler_factory(scheduler_options(cfg, ctx));
      scheduler->allow_worker_restarts(cfg.max_restarts > 0);
      // The advertised address only: a loopback job stays on loopback, a
      // multi-host one on the interface it hands out (PUSHPULL_BIND_ANY=1:
      // every interface).
      std::string bind = cfg.bind_any ? "" : cfg.host_ip;
      rv.port = scheduler->start(cfg.host_ip, bind, cfg.port);
      if (rv.master_port == rv.port)  // never the scheduler's port (docs/launch.md)
        rv.master_port = torch_store_port(cfg, rv.master_addr, rv.port, &torch_store);
      PP_INFO("scheduler listening on {}:{}{}", bind.empty() ? "*" : bind, rv.port,
              bind.empty() ? " (PUSHPULL_BIND_ANY=1)" : "");
    } else {
      // Held (bound, not listening) for the job's life, so no other program
      // is handed it meanwhile.
      reserved = transport::reserve_port(cfg.host_ip, rv.port);
      rv.port = transport::local_port(reserved.get());
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
    // Worker 0 inherits its rendezvous listener (transport::take_inherited_listener);
    // the supervisor closes our copy once it has started.
    for (auto& spec : specs)
      if (spec.role == Role::kWorker && spec.rank == 0) {
        spec.env.push_back(
            fmt::format("{}={}", transport::kListenFdVariable, rendezvous_listener.get()));
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
