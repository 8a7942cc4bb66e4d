// SPDX-License-Identifier: Apache-2.0
// `pushpull bench ps`: parameter-server push+pull throughput on loopback.
//
// For each (workers N, servers S, size): a job of N workers and S servers runs
// in this process (threads, real TCP on loopback); every worker pushpulls one
// float32 key of that size, `--iters` times after a warm-up, and a barrier
// lines the workers up before each timed iteration. The figure is the median
// over iterations of the slowest worker's time; GB/s counts the bytes each
// worker pushed and pulled (2 x size: a push and a pull each move the array
// once). Single-stream iperf3 in the same run is the ceiling for 1 worker x
// 1 server. Sizes above the big-array bound are split over all servers.
// `--replicas 0,1` measures each job once per replication setting
// (PUSHPULL_PS_REPLICAS), one after the other in the same run, labelled
// pushpull_Ks_rR: the cost of the servers' backups (docs/ps.md).
#include <chrono>
#include <mutex>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_iperf.h"
#include "commands.h"
#include "kvstore/inprocess_job.h"

namespace pushpull::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  BenchFlags flags;
  std::string workers = "1,2";
  std::string servers = "1,2";
  std::string sizes = "4K,64K,1M,16M,64M";
  int iters = 10;
  int iperf_seconds = 2;
  std::string replicas;  // "" = the default setting, unlabelled
};

std::vector<int> parse_ints(const std::string& text) {
  std::vector<int> out;
  for (uint64_t v : parse_sizes(text))
    out.push_back(static_cast<int>(v));
  return out;
}

// Median seconds per pushpull (slowest worker) for each size.
std::vector<double> measure(int workers, int servers, const std::vector<uint64_t>& sizes, int iters,
                            int replicas = -1) {
  InProcessJob job{servers, workers, "dist_sync", Options{}};
  job.options.log_level = LogLevel::kWarning;
  job.options.cluster.ps_replicas = replicas;
  std::mutex mu;
  // per size, per iteration: the slowest worker's time
  std::vector<std::vector<double>> slowest(sizes.size(), std::vector<double>(iters, 0.0));
  run_inprocess_job(job, [&](KVStore& kv) {
    for (size_t s = 0; s < sizes.size(); ++s) {
      int64_t n = static_cast<int64_t>(sizes[s] / 4);
      Array grad = Array::full(Shape{n}, 1.0), out(Shape{n}, DType::kFloat32);
      kv.init(static_cast<int64_t>(s), grad.view());
      kv.pushpull(static_cast<int64_t>(s), grad.view(), out.view());  // warm-up: pools, pages
      for (int i = 0; i < iters; ++i) {
        kv.barrier();
        auto t0 = Clock::now();
        kv.pushpull(static_cast<int64_t>(s), grad.view(), out.view());
        double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        std::lock_guard lock(mu);
        slowest[s][static_cast<size_t>(i)] = std::max(slowest[s][static_cast<size_t>(i)], secs);
      }
    }
  });
  std::vector<double> out;
  for (auto& v : slowest)
    out.push_back(median(v));
  return out;
}

void run(const Settings& st) {
  set_log_level(LogLevel::kWarning);
  BenchTable table(st.flags);
  std::vector<uint64_t> sizes = parse_sizes(st.sizes);
  for (int s : parse_ints(st.servers)) {
    for (int w : parse_ints(st.workers)) {
      std::vector<int> replica_list{-1};
      if (!st.replicas.empty()) replica_list = parse_ints(st.replicas);
      for (int r : replica_list) {
        std::vector<double> secs = measure(w, s, sizes, st.iters, r);
        std::string label =
            r < 0 ? fmt::format("pushpull_{}s", s) : fmt::format("pushpull_{}s_r{}", s, r);
        for (size_t i = 0; i < sizes.size(); ++i) {
          double gbps = 2.0 * static_cast<double>(sizes[i]) / secs[i] / 1e9;
          table.add({label, w, sizes[i], secs[i] * 1e6, gbps, gbps});
        }
      }
    }
  }
  if (st.flags.peers()) {
    std::vector<double> rates;
    double moved = 0, took = 0;
    for (int i = 0; i < 3; ++i)
      if (auto r = iperf3_once(st.iperf_seconds)) {
        rates.push_back(r->first / r->second / 1e9);
        moved = r->first;
        took = r->second;
      }
    if (rates.empty()) {
      std::fprintf(stderr, "iperf3 did not run (is it installed?); no ceiling figure\n");
    } else {
      double gbps = median(rates);
      table.add({"iperf3", 1, static_cast<uint64_t>(moved), took * 1e6, gbps, gbps});
    }
  }
  table.print(
      "Parameter server push+pull per worker (GB/s = 2 x size / time; impl pushpull_Ks = K "
      "servers; n = workers)");
}

}  // namespace

void register_bench_ps(CLI::App& bench) {
  auto settings = std::make_shared<Settings>();
  auto* cmd = bench.add_subcommand("ps", "Parameter-server push+pull throughput vs iperf3");
  add_bench_flags(cmd, &settings->flags);
  cmd->add_option("-n,--workers", settings->workers, "Numbers of workers, e.g. 1,2");
  cmd->add_option("-s,--servers", settings->servers, "Numbers of servers, e.g. 1,2");
  cmd->add_option("--sizes", settings->sizes, "Array sizes in bytes, e.g. 4K..64M");
  cmd->add_option("--iters", settings->iters, "Timed iterations per size (median reported)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--iperf-seconds", settings->iperf_seconds, "Length of each iperf3 run")
      ->check(CLI::Range(1, 60));
  cmd->add_option("--replicas", settings->replicas,
                  "Backups per key range to compare, e.g. 0,1 (PUSHPULL_PS_REPLICAS; needs "
                  "at least 2 servers)");
  cmd->callback([settings] { run(*settings); });
}

}  // namespace pushpull::cli
