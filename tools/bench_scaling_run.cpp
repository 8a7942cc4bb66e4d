// SPDX-License-Identifier: Apache-2.0
// One run of one configuration of `pushpull bench scaling` on a NetnsLab: the
// processes of the job, each in its host namespace, configured through the
// environment (`env VAR=... pushpull ...` after `ip netns exec NS`), then the
// workers' result files, the server hosts' link counters and the machine's
// CPU use over the run.
#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "bench_netns.h"
#include "bench_procs.h"
#include "bench_scaling.h"

namespace pushpull::cli {
namespace {

// ip netns exec NS env VARS... PROGRAM ARGS...
std::vector<std::string> in_ns(const NetnsLab& lab, int host, const std::vector<std::string>& env,
                               const std::vector<std::string>& argv) {
  auto out = lab.exec(host);
  out.push_back("env");
  out.insert(out.end(), env.begin(), env.end());
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

// Per-step durations and the elapsed / wait lines of one worker's file.
bool read_result(const std::string& path, std::vector<double>* steps, double* elapsed, double* wait,
                 double* cpu) {
  std::ifstream f(path);
  if (!f) return false;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string word;
    if (line.rfind("elapsed ", 0) == 0) {
      in >> word >> *elapsed;
    } else if (line.rfind("wait ", 0) == 0) {
      in >> word >> *wait;
    } else if (line.rfind("cpu ", 0) == 0) {
      double busy = 0, total = 0;
      if (in >> word >> busy >> total && total > 0) *cpu = busy / total;
    } else if (!line.empty()) {
      double ms = 0;
      if (in >> ms) steps->push_back(ms);
    }
  }
  return *elapsed > 0;
}

}  // namespace

std::pair<uint64_t, uint64_t> cpu_jiffies() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  uint64_t v[8] = {};
  f >> cpu;
  for (auto& x : v)
    f >> x;
  // user nice system idle iowait irq softirq steal
  const uint64_t idle = v[3] + v[4];
  uint64_t total = 0;
  for (auto x : v)
    total += x;
  return {total - idle, total};
}

std::string run_label(const RunSpec& s) {
  std::string out = s.impl;
  if (s.backup_workers > 0) out += fmt::format("_b{}", s.backup_workers);
  if (s.straggler > 1) out += fmt::format("_slow{}x", s.straggler);
  return out;
}

RunResult run_config(const NetnsLab& lab, int worker_hosts, const StepSpec& step,
                     const RunSpec& spec, int timeout_s, int port) {
  RunResult res;
  TempDir dir;
  ProcessGroup g;
  const std::string exe = self_exe();
  const std::vector<std::string> quiet = {"PUSHPULL_LOG_LEVEL=warning"};
  std::vector<int> server_hosts;
  const int slow_rank = spec.straggler > 1 && spec.workers > 1 ? spec.workers - 1 : -1;
  auto step_of = [&](int r) {
    StepSpec s = step;
    if (r == slow_rank) s.compute_ms *= spec.straggler;
    return s;
  };
  auto worker_cmd = [&](int r) {
    auto argv = worker_argv(spec.impl, r, spec.workers, dir.path(), step_of(r));
    argv.insert(argv.begin(), exe);
    return argv;
  };
  if (spec.impl == "pushpull_ring" || spec.impl == "none") {
    for (int r = 0; r < spec.workers; ++r) {
      std::vector<std::string> env = {fmt::format("RANK={}", r),
                                      fmt::format("WORLD_SIZE={}", spec.workers),
                                      fmt::format("LOCAL_RANK=0"),
                                      "LOCAL_WORLD_SIZE=1",
                                      fmt::format("MASTER_ADDR={}", lab.address(0)),
                                      fmt::format("MASTER_PORT={}", port),
                                      fmt::format("PUSHPULL_NODE_HOST={}", lab.address(r)),
                                      quiet[0]};
      g.start(in_ns(lab, r, env, worker_cmd(r)));
    }
  } else if (spec.impl == "gloo_ring") {
    const std::string gloo = self_dir() + "/pp_gloo_step";
    for (int r = 0; r < spec.workers; ++r) {
      auto argv = lab.exec(r);
      argv.insert(argv.end(), {gloo, std::to_string(r), std::to_string(spec.workers), dir.path(),
                               lab.address(r), fmt::format("{}", step_of(r).compute_ms),
                               std::to_string(step.grad_bytes), std::to_string(step.layers),
                               std::to_string(step.warmup), std::to_string(step.steps)});
      g.start(argv);
    }
  } else if (spec.impl == "pushpull_ps") {
    const int total_servers = spec.hybrid ? spec.servers + spec.workers : spec.servers;
    auto job_env = [&](const char* role, int host) {
      return std::vector<std::string>{
          fmt::format("DMLC_ROLE={}", role),
          fmt::format("DMLC_PS_ROOT_URI={}", lab.address(0)),
          fmt::format("DMLC_PS_ROOT_PORT={}", port),
          fmt::format("DMLC_NUM_SERVER={}", total_servers),
          fmt::format("DMLC_NUM_WORKER={}", spec.workers),
          fmt::format("PUSHPULL_NODE_HOST={}", lab.address(host)),
          fmt::format("PUSHPULL_PS_REPLICAS={}", spec.ps_replicas),
          fmt::format("PUSHPULL_PS_BACKUP_WORKERS={}", spec.backup_workers),
          quiet[0]};
    };
    // The scheduler only carries control messages: it shares worker host 0.
    g.start(in_ns(lab, 0, job_env("scheduler", 0), {exe, "scheduler"}));
    for (int s = 0; s < total_servers; ++s) {
      // Hybrid: the spare hosts' servers first, then one per worker host
      // (only the spare hosts' links are counted: a worker host's carries
      // its worker's bytes too).
      const bool spare = !spec.colocated && s < spec.servers;
      const int host = spare ? worker_hosts + s : spec.hybrid ? s - spec.servers : s;
      if (spare || spec.colocated) server_hosts.push_back(host);
      g.start(in_ns(lab, host, job_env("server", host), {exe, "server"}));
    }
    for (int r = 0; r < spec.workers; ++r) {
      auto env = job_env("worker", r);
      env.push_back(fmt::format("PUSHPULL_RANK={}", r));
      g.start(in_ns(lab, r, env, worker_cmd(r)));
    }
  } else {
    res.failure = fmt::format("unknown impl {}", spec.impl);
    return res;
  }
  std::vector<std::pair<uint64_t, uint64_t>> before;
  for (int h : server_hosts)
    before.push_back(lab.link_bytes(h));
  auto run = g.run(std::chrono::seconds(timeout_s));
  for (size_t i = 0; i < server_hosts.size(); ++i) {
    auto after = lab.link_bytes(server_hosts[i]);
    res.server_rx.push_back(after.first - before[i].first);
    res.server_tx.push_back(after.second - before[i].second);
  }
  if (!run.ok) {
    res.failure = run.failure;
    return res;
  }
  std::vector<std::vector<double>> steps(static_cast<size_t>(spec.workers));
  for (int r = 0; r < spec.workers; ++r) {
    double elapsed = 0, wait = 0, cpu = 0;
    if (!read_result(fmt::format("{}/result.{}", dir.path(), r), &steps[static_cast<size_t>(r)],
                     &elapsed, &wait, &cpu)) {
      res.failure = fmt::format("worker {} wrote no result", r);
      return res;
    }
    if (r == slow_rank) continue;  // its own pace is not the job's
    res.elapsed_s = std::max(res.elapsed_s, elapsed);
    res.wait_ms = std::max(res.wait_ms, wait);
    if (r == 0) res.cpu_busy = cpu;
  }
  for (size_t i = 0; i < steps[0].size(); ++i) {
    double slowest = 0;
    for (int r = 0; r < spec.workers; ++r)
      if (r != slow_rank && i < steps[static_cast<size_t>(r)].size())
        slowest = std::max(slowest, steps[static_cast<size_t>(r)][i]);
    res.step_ms.push_back(slowest);
  }
  res.ok = true;
  return res;
}

}  // namespace pushpull::cli
