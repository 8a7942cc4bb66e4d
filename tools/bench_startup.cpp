// SPDX-License-Identifier: Apache-2.0
// `pushpull bench startup` (docs/scaling.md "Start-up"): how the time to
// create a store grows with the job. For every rank count and engine it runs
// `pushpull launch -n N [-s S] -- pp_startup_probe <type> <dir>` on this
// host (real processes: the launcher, its scheduler, the servers, N probes);
// each probe creates the store, pushpulls one 4-float key, checks the value
// and writes its times (bench/startup_probe.cpp). A run's creation time is the
// slowest rank's (the job can train once every rank has its store); its job
// time is the launcher's wall time from spawn to exit. Engines and rank
// counts are interleaved within each repeat; rows are medians over repeats;
// per engine, the exponent of a least-squares fit of log(time) on log(ranks).
//
// An engine whose run fails or passes --timeout at some rank count is not run
// again at that or a larger count (its row says how many runs it kept: 0/1).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_procs.h"
#include "bench_startup.h"
#include "commands.h"
#include "pushpull/error.h"

namespace pushpull::cli {
namespace {

struct Config {
  std::string ranks = "8,16,32,64,128,256";
  std::string engines = "ps,collective";
  int servers = 2;
  int repeats = 3;
  int timeout_s = 300;
  BenchFlags flags;
};

struct Run {
  bool ok = false;
  double create_s = 0, pushpull_s = 0, job_s = 0;
  std::string failure;
};

Run run_once(const StartupEngine& e, int n, int timeout_s) {
  Run res;
  TempDir dir;
  ProcessGroup g;
  // A collective rank that exits while a peer's engine still runs may make
  // that peer dump its flight recorder: into the run's directory, not ours.
  std::vector<std::string> argv = {"env",
                                   "PUSHPULL_LOG_LEVEL=warning",
                                   "PUSHPULL_FLIGHT_RECORDER_DIR=" + dir.path(),
                                   self_exe(),
                                   "launch",
                                   "-n",
                                   std::to_string(n),
                                   "-s",
                                   std::to_string(e.servers),
                                   "--timeout",
                                   std::to_string(timeout_s),
                                   "--",
                                   self_dir() + "/pp_startup_probe",
                                   e.kvstore,
                                   dir.path()};
  if (e.worker_mesh) argv.push_back("--worker-mesh");
  const auto t0 = std::chrono::steady_clock::now();
  g.start(argv);
  // The launcher ends the job at its own deadline; this one only catches a
  // launcher that hangs.
  auto r = g.run(std::chrono::seconds(timeout_s + 30));
  res.job_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.ok) {
    res.failure = r.failure;
    return res;
  }
  for (int rank = 0; rank < n; ++rank) {
    std::ifstream f(fmt::format("{}/result.{}", dir.path(), rank));
    double c = 0, p = 0;
    if (!(f >> c >> p)) {
      res.failure = fmt::format("rank {} wrote no result", rank);
      return res;
    }
    res.create_s = std::max(res.create_s, c);
    res.pushpull_s = std::max(res.pushpull_s, p);
  }
  res.ok = true;
  return res;
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

void run_bench(const Config& cfg) {
  std::vector<int> ranks;
  for (uint64_t n : parse_sizes(cfg.ranks)) {
    if (n < 2 || n > 4096) throw InvalidArgument("bench startup: --ranks must be within 2..4096");
    ranks.push_back(static_cast<int>(n));
  }
  std::vector<StartupEngine> engines;
  for (size_t at = 0; at <= cfg.engines.size();) {
    size_t comma = cfg.engines.find(',', at);
    if (comma == std::string::npos) comma = cfg.engines.size();
    if (comma > at)
      engines.push_back(startup_engine(cfg.engines.substr(at, comma - at), cfg.servers));
    at = comma + 1;
  }
  if (engines.empty()) throw InvalidArgument("bench startup: no engine in --engines");
  if (!std::filesystem::exists(self_dir() + "/pp_startup_probe"))
    throw NotFound(fmt::format("bench startup: {}/pp_startup_probe is not built", self_dir()));
  FILE* info = cfg.flags.csv() ? stderr : stdout;
  std::fprintf(info,
               "# bench startup: ranks %s, engines %s (PS: %d servers), %d repeat(s), timeout %d "
               "s; %u cores, load average %s\n",
               cfg.ranks.c_str(), cfg.engines.c_str(), cfg.servers, cfg.repeats, cfg.timeout_s,
               std::max(1u, std::thread::hardware_concurrency()), load_average().c_str());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Samples {
    std::vector<double> create, pushpull, job;
  };
  std::map<std::pair<size_t, int>, Samples> samples;
  std::vector<int> stopped_at(engines.size(), 0);  // 0: still running every count
  for (int rep = 0; rep < cfg.repeats; ++rep)
    for (int n : ranks)
      for (size_t e = 0; e < engines.size(); ++e) {
        if (stopped_at[e] > 0 && n >= stopped_at[e]) continue;
        Run r = run_once(engines[e], n, cfg.timeout_s);
        auto& s = samples[{e, n}];
        if (!r.ok) {
          std::fprintf(stderr,
                       "bench startup: %s at %d ranks failed (%s); not run again at this or "
                       "larger counts\n",
                       engines[e].name.c_str(), n, r.failure.c_str());
          if (stopped_at[e] == 0 || n < stopped_at[e]) stopped_at[e] = n;
          s.create.push_back(nan), s.pushpull.push_back(nan), s.job.push_back(nan);
          continue;
        }
        if (!cfg.flags.csv())
          std::fprintf(stderr, "# repeat %d: %s %d ranks: create %.3f s, job %.3f s\n", rep + 1,
                       engines[e].name.c_str(), n, r.create_s, r.job_s);
        s.create.push_back(r.create_s), s.pushpull.push_back(r.pushpull_s),
            s.job.push_back(r.job_s);
      }
  if (cfg.flags.csv())
    std::printf("kind,engine,ranks,create_s,pushpull_s,job_s,runs\n");
  else
    std::printf("%-11s %6s %12s %12s %10s %6s\n", "engine", "ranks", "create (s)", "pushpull (s)",
                "job (s)", "runs");
  for (size_t e = 0; e < engines.size(); ++e) {
    std::vector<double> xs, creates, jobs;
    for (int n : ranks) {
      auto it = samples.find({e, n});
      if (it == samples.end()) continue;
      int runs = 0;
      for (double c : it->second.create)
        runs += std::isfinite(c) ? 1 : 0;
      const double c = runs ? median(it->second.create) : nan;
      const double p = runs ? median(it->second.pushpull) : nan;
      const double j = runs ? median(it->second.job) : nan;
      xs.push_back(n), creates.push_back(c), jobs.push_back(j);
      if (cfg.flags.csv())
        std::printf("row,%s,%d,%.4f,%.4f,%.4f,%d\n", engines[e].name.c_str(), n, c, p, j, runs);
      else
        std::printf("%-11s %6d %12.3f %12.4f %10.3f %3d/%zu\n", engines[e].name.c_str(), n, c, p, j,
                    runs, it->second.create.size());
    }
    const LogLogFit fc = fit_loglog(xs, creates), fj = fit_loglog(xs, jobs);
    if (cfg.flags.csv())
      std::printf("fit,%s,%d,%.3f,,%.3f,%d\n", engines[e].name.c_str(), fc.points, fc.exponent,
                  fj.exponent, fc.points);
    else
      std::printf(
          "fit %-8s create ~ ranks^%.2f (r2 %.3f), job ~ ranks^%.2f (r2 %.3f), over %d counts\n",
          engines[e].name.c_str(), fc.exponent, fc.r2, fj.exponent, fj.r2, fc.points);
  }
}

}  // namespace

void register_bench_startup(CLI::App& bench) {
  auto cfg = std::make_shared<Config>();
  auto* cmd = bench.add_subcommand(
      "startup",
      "Store creation time against the number of ranks: real processes on this host "
      "(pushpull launch + a C++ probe), medians and the fitted exponent per engine");
  cmd->add_option("--ranks", cfg->ranks, "Rank counts: a list (8,16,32) or a range (8..256)");
  cmd->add_option("--engines", cfg->engines,
                  "ps (dist_sync), ps_mesh (dist_sync with the old worker mesh), collective "
                  "(dist_sync_allreduce, -s 0)");
  cmd->add_option("-s,--servers", cfg->servers, "Servers of the PS jobs")->check(CLI::Range(1, 64));
  cmd->add_option("--repeats", cfg->repeats, "Runs per engine and rank count (medians)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--timeout", cfg->timeout_s, "Seconds a run may take (the launcher's --timeout)")
      ->check(CLI::Range(5, 3600));
  add_bench_flags(cmd, &cfg->flags);
  cmd->callback([cfg] { run_bench(*cfg); });
}

}  // namespace pushpull::cli
