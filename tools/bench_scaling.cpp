// SPDX-License-Identifier: Apache-2.0
// `pushpull bench scaling`: MXNet's scaling study on simulated hosts. A
// data-parallel step with a fixed simulated compute time (bench_scaling.h)
// runs on N = 1, 2, 4, 8 worker hosts (network namespaces, links shaped with
// tc tbf) over pushpull's ring allreduce, Gloo's ring allreduce (peer),
// pushpull's parameter server with S dedicated server hosts, with the
// servers co-located on the worker hosts, and hybrid (S spare hosts plus a
// server on every worker host, BytePS's split: ps/server_shares.h). Every configuration runs as
// processes in the same lab, interleaved within each repeat; rows are medians
// over repeats.
//
// Scaling efficiency = throughput with N workers / (N x throughput of one
// worker without communication), the study's definition; the baseline is
// measured in the same run (one worker, same sleeps, no engine).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_netns.h"
#include "bench_procs.h"
#include "bench_scaling.h"
#include "commands.h"
#include "pushpull/error.h"

namespace pushpull::cli {
namespace {

struct Config {
  int netns = 0;
  std::string rate = "500mbit";
  int queue_ms = 50;
  double grad_mb = 5;
  std::string workers = "1,2,4,8";
  std::string servers = "1,2,4,8";
  std::string configs = "ring,gloo,ps,colocated";
  StepSpec step;
  int repeats = 1;
  int timeout_s = 300;
  int ps_replicas = 0;                 // RunSpec::ps_replicas
  double straggler = 1;                // RunSpec::straggler of the slowed copies
  std::string backup_workers = "0,1";  // with --straggler: PS rows for each
  BenchFlags flags;
  // internal: one worker
  ScalingWorkerArgs worker;
  uint64_t grad_bytes = 0;
};

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct Row {
  RunSpec spec;
  std::vector<double> step_ms, wait_ms, cpu;  // one per repeat
  std::vector<double> server_min_mb, server_max_mb;
};

std::string placement_of(const RunSpec& s) {
  if (s.impl != "pushpull_ps") return "none";
  return s.colocated ? "colocated" : s.hybrid ? "hybrid" : "dedicated";
}

void run_study(Config cfg) {
  if (cfg.netns < 1)
    throw InvalidArgument(
        "bench scaling needs --netns H (H >= 1 worker hosts; the benchmark makes the network "
        "namespaces, which needs root)");
  StepSpec step = cfg.step;
  step.grad_bytes = static_cast<uint64_t>(cfg.grad_mb * (1 << 20));
  if (step.grad_bytes < 4 * static_cast<uint64_t>(step.layers))
    throw InvalidArgument("--grad-mb is smaller than one float per layer");
  auto has = [&](const char* c) {
    return ("," + cfg.configs + ",").find(fmt::format(",{},", c)) != std::string::npos;
  };
  std::vector<int> ns, ss;
  for (uint64_t n : parse_sizes(cfg.workers))
    if (n >= 1 && static_cast<int>(n) <= cfg.netns) ns.push_back(static_cast<int>(n));
  for (uint64_t s : parse_sizes(cfg.servers))
    if (s >= 1 && s <= 16) ss.push_back(static_cast<int>(s));
  if (ns.empty()) throw InvalidArgument("no worker count fits --netns");
  const int max_s =
      (has("ps") || has("hybrid")) && !ss.empty() ? *std::max_element(ss.begin(), ss.end()) : 0;

  std::vector<RunSpec> specs;
  const bool gloo = cfg.flags.peers() && has("gloo");
  if (gloo && !std::filesystem::exists(self_dir() + "/pp_gloo_step"))
    std::fprintf(stderr, "bench scaling: %s/pp_gloo_step not built (Gloo missing?); no gloo rows\n",
                 self_dir().c_str());
  for (int n : ns) {
    if (has("ring")) specs.push_back({"pushpull_ring", n, 0, false});
    if (gloo && std::filesystem::exists(self_dir() + "/pp_gloo_step"))
      specs.push_back({"gloo_ring", n, 0, false});
    if (has("ps"))
      for (int s : ss)
        specs.push_back({"pushpull_ps", n, s, false, cfg.ps_replicas});
    if (has("colocated")) specs.push_back({"pushpull_ps", n, n, true, cfg.ps_replicas});
    if (has("hybrid"))
      for (int s : ss)
        specs.push_back({"pushpull_ps", n, s, false, cfg.ps_replicas, true});
  }

  if (cfg.straggler > 1) {
    // Every configuration unslowed (the reference) and with a straggler;
    // the parameter server's for each number of backup workers.
    std::vector<int> backups;
    for (uint64_t b : parse_sizes(cfg.backup_workers))
      backups.push_back(static_cast<int>(b));
    std::vector<RunSpec> all;
    for (RunSpec s : specs) {
      all.push_back(s);
      if (s.workers < 2) continue;
      s.straggler = cfg.straggler;
      if (s.impl != "pushpull_ps") {
        all.push_back(s);
        continue;
      }
      for (int b : backups)
        if (b < s.workers) {
          s.backup_workers = b;
          all.push_back(s);
        }
    }
    specs = std::move(all);
  }

  NetnsLab lab(cfg.netns + max_s, cfg.rate, cfg.queue_ms);
  const double goodput = lab.goodput_bps(2);
  FILE* info = cfg.flags.csv() ? stderr : stdout;
  const double mb = static_cast<double>(step.grad_bytes) / 1e6;
  std::fprintf(info,
               "# bench scaling: %d worker hosts + %d server hosts, links %s (iperf3 goodput "
               "%.3f Gbit/s), gradient %.2f MB in %d layers, compute %.0f ms/step, %d+%d "
               "steps, %d repeat(s), %d PS backup(s) per range; %u cores, load average %s\n",
               cfg.netns, max_s, cfg.rate.empty() ? "unshaped" : cfg.rate.c_str(), goodput / 1e9,
               mb, step.layers, step.compute_ms, step.warmup, step.steps, cfg.repeats,
               cfg.ps_replicas, std::max(1u, std::thread::hardware_concurrency()),
               load_average().c_str());
  if (goodput > 0) {
    const int n = *std::max_element(ns.begin(), ns.end());
    const double ring_ms =
        2.0 * (n - 1) / n * static_cast<double>(step.grad_bytes) * 8 / goodput * 1e3;
    std::fprintf(info,
                 "# a ring allreduce of the gradient at N=%d needs >= %.0f ms on these links "
                 "(%.2f of the compute time)\n",
                 n, ring_ms, ring_ms / step.compute_ms);
  }

  std::vector<double> baseline;
  std::vector<Row> rows(specs.size());
  int port = 20000;
  for (int rep = 0; rep < cfg.repeats; ++rep) {
    RunResult b = run_config(lab, cfg.netns, step, {"none", 1, 0, false}, cfg.timeout_s, ++port);
    if (!b.ok) throw IoError("bench scaling: the compute-only baseline failed: " + b.failure);
    baseline.push_back(b.elapsed_s * 1e3 / step.steps);
    for (size_t i = 0; i < specs.size(); ++i) {
      const RunSpec& sp = specs[i];
      rows[i].spec = sp;
      RunResult r = run_config(lab, cfg.netns, step, sp, cfg.timeout_s, ++port);
      if (!r.ok) {
        std::fprintf(stderr, "bench scaling: %s N=%d S=%d %s failed: %s; row missing\n",
                     run_label(sp).c_str(), sp.workers, sp.servers, placement_of(sp).c_str(),
                     r.failure.c_str());
        continue;
      }
      rows[i].step_ms.push_back(r.elapsed_s * 1e3 / step.steps);
      rows[i].wait_ms.push_back(r.wait_ms);
      rows[i].cpu.push_back(r.cpu_busy);
      if (!r.server_rx.empty()) {
        std::vector<double> per;
        for (size_t s = 0; s < r.server_rx.size(); ++s)
          per.push_back(static_cast<double>(r.server_rx[s] + r.server_tx[s]) /
                        (step.warmup + step.steps) / 1e6);
        rows[i].server_min_mb.push_back(*std::min_element(per.begin(), per.end()));
        rows[i].server_max_mb.push_back(*std::max_element(per.begin(), per.end()));
      }
    }
  }
  const double base_ms = median(baseline);
  const double base_sps = 1e3 / base_ms;
  std::fprintf(info, "# baseline (1 worker, no communication): %.1f ms/step; load average %s\n",
               base_ms, load_average().c_str());
  // The full table (wait, CPU, per-server bytes) always; in csv mode on
  // stderr, with the csv on stdout.
  FILE* tab = cfg.flags.csv() ? stderr : stdout;
  if (cfg.flags.csv())
    std::printf("impl,workers,servers,placement,step_ms,steps_per_s,efficiency\n");
  std::fprintf(tab, "%-24s %7s %7s %-10s %9s %11s %10s %9s %6s %s\n", "impl", "workers", "servers",
               "placement", "step_ms", "steps_per_s", "efficiency", "wait_ms", "cpu",
               "server MB/step in+out (min..max)");
  for (const Row& r : rows) {
    if (r.step_ms.empty()) continue;
    const double ms = median(r.step_ms);
    const double sps = r.spec.workers * 1e3 / ms;
    const double eff = sps / (r.spec.workers * base_sps);
    if (cfg.flags.csv())
      std::printf("%s,%d,%d,%s,%.2f,%.4f,%.4f\n", run_label(r.spec).c_str(), r.spec.workers,
                  r.spec.servers, placement_of(r.spec).c_str(), ms, sps, eff);
    std::string servers_mb =
        r.server_max_mb.empty()
            ? ""
            : fmt::format("{:.1f}..{:.1f}", median(r.server_min_mb), median(r.server_max_mb));
    std::fprintf(tab, "%-24s %7d %7d %-10s %9.1f %11.3f %9.1f%% %9.1f %5.0f%% %s\n",
                 run_label(r.spec).c_str(), r.spec.workers, r.spec.servers,
                 placement_of(r.spec).c_str(), ms, sps, eff * 100, median(r.wait_ms),
                 median(r.cpu) * 100, servers_mb.c_str());
  }
  // A straggler's cost: each slowed row against the same job unslowed.
  for (const Row& r : rows) {
    if (r.spec.straggler <= 1 || r.step_ms.empty()) continue;
    for (const Row& ref : rows)
      if (ref.spec.straggler == 1 && ref.spec.backup_workers == 0 && !ref.step_ms.empty() &&
          ref.spec.impl == r.spec.impl && ref.spec.workers == r.spec.workers &&
          ref.spec.servers == r.spec.servers && placement_of(ref.spec) == placement_of(r.spec))
        std::fprintf(tab, "# %s N=%d %s: step %.3fx the unslowed job's\n",
                     run_label(r.spec).c_str(), r.spec.workers, placement_of(r.spec).c_str(),
                     median(r.step_ms) / median(ref.step_ms));
  }
  std::fflush(stdout);
}

}  // namespace

void register_bench_scaling(CLI::App& bench) {
  auto cfg = std::make_shared<Config>();
  auto* cmd = bench.add_subcommand(
      "scaling",
      "Data-parallel step on network-namespace hosts: ring allreduce vs parameter server "
      "(MXNet's scaling study)");
  cmd->add_option("--netns", cfg->netns,
                  "Worker hosts H (network namespaces, made and removed here; needs root); "
                  "dedicated server hosts come on top")
      ->check(CLI::Range(0, 16));
  cmd->add_option("--rate", cfg->rate, "tc tbf rate of every link ('' = unshaped)")
      ->capture_default_str();
  cmd->add_option("--queue-ms", cfg->queue_ms,
                  "tbf latency: the longest a packet may queue at a port (the switch buffer)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--grad-mb", cfg->grad_mb, "Gradient size per step in MiB")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 4096.0));
  cmd->add_option("--layers", cfg->step.layers, "Tensors the gradient is split into")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--compute-ms", cfg->step.compute_ms,
                  "Simulated forward+backward time per step (sleeps)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 600000.0));
  cmd->add_option("-n,--workers", cfg->workers, "Numbers of workers (<= H)")->capture_default_str();
  cmd->add_option("-s,--servers", cfg->servers, "Numbers of dedicated server hosts")
      ->capture_default_str();
  cmd->add_option(
         "--configs", cfg->configs,
         "Which of ring,gloo,ps (dedicated servers),colocated,hybrid (-s spare server hosts "
         "plus a server on every worker host) to run")
      ->capture_default_str();
  cmd->add_option("--steps", cfg->step.steps, "Timed steps per run")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", cfg->step.warmup, "Untimed steps per run")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--ps-replicas", cfg->ps_replicas,
                  "Backups per key range in the parameter-server jobs (PUSHPULL_PS_REPLICAS; 0, "
                  "the study's unreplicated PS)")
      ->check(CLI::Range(0, 7));
  cmd->add_option("--straggler", cfg->straggler,
                  "Also run every configuration with the last worker's compute time this many "
                  "times the others' (a straggler, left out of the step time)")
      ->check(CLI::Range(1.0, 100.0));
  cmd->add_option("--backup-workers", cfg->backup_workers,
                  "With --straggler: the parameter server's rows for each of these "
                  "PUSHPULL_PS_BACKUP_WORKERS")
      ->capture_default_str();
  cmd->add_option("--repeats", cfg->repeats, "Interleaved runs of everything; rows are medians")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_option("--timeout", cfg->timeout_s, "Seconds one run may take")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  add_bench_flags(cmd, &cfg->flags);
  // Internal: one worker, started by the benchmark in its namespace.
  cmd->add_option("--worker-impl", cfg->worker.impl)->group("");
  cmd->add_option("--worker-rank", cfg->worker.rank)->group("");
  cmd->add_option("--worker-count", cfg->worker.workers)->group("");
  cmd->add_option("--worker-dir", cfg->worker.dir)->group("");
  cmd->add_option("--grad-bytes", cfg->grad_bytes)->group("");
  cmd->callback([cfg] {
    if (!cfg->worker.impl.empty()) {
      ScalingWorkerArgs w = cfg->worker;
      w.step = cfg->step;
      w.step.grad_bytes = cfg->grad_bytes;
      if (w.dir.empty() || w.workers < 1 || w.rank < 0 || w.rank >= w.workers ||
          w.step.grad_bytes == 0)
        throw InvalidArgument("bench scaling worker: inconsistent --worker-* arguments");
      if (int rc = run_scaling_worker(w); rc != 0) throw CLI::RuntimeError(rc);
      return;
    }
    run_study(*cfg);
  });
}

}  // namespace pushpull::cli
