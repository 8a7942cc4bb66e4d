// SPDX-License-Identifier: Apache-2.0
// `pushpull bench backup`: backup workers in dist_sync (docs/ps.md "Backup
// workers") against a straggler, on loopback.
//
// A job of N workers (default 8) and S servers runs in this process
// (threads, real TCP or same-host shared memory on loopback, as `bench ps`).
// Each worker's step is a compute phase (a sleep of --step-ms) then a
// pushpull of one float32 key of --size bytes; the last rank is the
// straggler, sleeping --slow-factor times as long. Three jobs per repeat,
// interleaved so they share the machine's load:
//   unslowed   nobody slowed, b = 0
//   slowed_b0  the straggler slowed, b = 0 (every round waits for it)
//   slowed_b1  the straggler slowed, b = --backup (default 1)
// The figure is worker 0's median step time (worker 0 is never the
// straggler) over the rounds after --warmup, then the median over repeats;
// ratio lines pair each repeat's slowed job with its unslowed one. With
// backup workers the straggler falls behind by a round every 1/(factor - 1)
// rounds, so PUSHPULL_PS_BACKUP_MAX_LATE is set to the number of rounds
// (--max-late to change): the figure is the step of the workers that are not
// late, not the job's end (the straggler still runs its own rounds at its
// own pace; "job" lines).
#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "bench_common.h"
#include "commands.h"
#include "kvstore/inprocess_job.h"
#include "pushpull/log.h"

namespace pushpull::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  BenchFlags flags;
  int workers = 8;
  int servers = 1;
  std::string size = "1M";
  int step_ms = 20;
  double slow_factor = 2.0;
  int backup = 1;
  int rounds = 30;
  int warmup = 3;
  int repeats = 3;
  int max_late = 0;  // 0: the number of rounds
};

struct Result {
  double step_s = 0;       // worker 0's median step
  double straggler_s = 0;  // the straggler's median step
  double job_s = 0;        // the whole job's training time (slowest worker)
};

Result measure(const Settings& st, uint64_t bytes, bool slowed, int backup) {
  InProcessJob job{st.servers, st.workers, "dist_sync", Options::from_env()};
  job.options.log_level = LogLevel::kWarning;
  job.options.kvstore.ps_backup_workers = backup;
  job.options.kvstore.ps_backup_max_late = st.max_late > 0 ? st.max_late : std::max(1, st.rounds);
  std::mutex mu;
  std::vector<double> steps0, straggler;
  double job_s = 0;
  run_inprocess_job(job, [&](KVStore& kv) {
    const int64_t n = static_cast<int64_t>(bytes / 4);
    Array grad = Array::full(Shape{n}, 1.0), out(Shape{n}, DType::kFloat32);
    kv.init(0, grad.view());
    kv.set_optimizer(OptimizerSpec::parse("test:rescale_grad=0.001"));
    kv.barrier();
    const bool me_slow = slowed && kv.rank() == kv.num_workers() - 1;
    const auto sleep =
        std::chrono::duration<double, std::milli>(st.step_ms * (me_slow ? st.slow_factor : 1.0));
    std::vector<double> mine;
    const auto start = Clock::now();
    for (int k = 0; k < st.warmup + st.rounds; ++k) {
      const auto t0 = Clock::now();
      std::this_thread::sleep_for(sleep);
      kv.pushpull(0, grad.view(), out.view());
      if (k >= st.warmup) mine.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    std::lock_guard lock(mu);
    job_s = std::max(job_s, took);
    if (kv.rank() == 0) steps0 = mine;
    if (kv.rank() == kv.num_workers() - 1) straggler = mine;
  });
  return {median(steps0), median(straggler), job_s};
}

void run(const Settings& st) {
  set_log_level(LogLevel::kWarning);  // the jobs' nodes log their start at info
  const uint64_t bytes = parse_sizes(st.size).front();
  const char* names[] = {"unslowed", "slowed_b0", nullptr};
  const std::string b_name = fmt::format("slowed_b{}", st.backup);
  std::vector<std::vector<Result>> runs(3);
  for (int rep = 0; rep < st.repeats; ++rep) {
    runs[0].push_back(measure(st, bytes, false, 0));
    runs[1].push_back(measure(st, bytes, true, 0));
    runs[2].push_back(measure(st, bytes, true, st.backup));
    if (!st.flags.csv())
      std::fprintf(stderr, "repeat %d: worker 0 step %.2f / %.2f / %.2f ms\n", rep + 1,
                   runs[0].back().step_s * 1e3, runs[1].back().step_s * 1e3,
                   runs[2].back().step_s * 1e3);
  }
  BenchTable table(st.flags);
  auto field = [](const std::vector<Result>& rs, double Result::*f) {
    std::vector<double> v;
    for (const Result& r : rs)
      v.push_back(r.*f);
    return v;
  };
  for (int i = 0; i < 3; ++i) {
    const double s = median(field(runs[i], &Result::step_s));
    table.add({i < 2 ? names[i] : b_name, st.workers, bytes, s * 1e6, 2.0 * bytes / s / 1e9,
               2.0 * bytes / s / 1e9});
  }
  table.print(fmt::format(
      "Worker 0's step (sleep {} ms + pushpull), {} workers x {} servers, the last worker slowed "
      "{}x; median of {} rounds, median of {} repeats",
      st.step_ms, st.workers, st.servers, st.slow_factor, st.rounds, st.repeats));
  const auto base = field(runs[0], &Result::step_s);
  for (int i = 1; i < 3; ++i) {
    PairedRatio r = paired_ratio(field(runs[i], &Result::step_s), base);
    std::printf("ratio %s / unslowed: worker 0's step %s\n", i < 2 ? names[i] : b_name.c_str(),
                format_paired(r).c_str());
  }
  for (int i = 0; i < 3; ++i)
    std::printf("job %s: straggler's step %.2f ms, whole job %.3f s (medians)\n",
                i < 2 ? names[i] : b_name.c_str(),
                median(field(runs[i], &Result::straggler_s)) * 1e3,
                median(field(runs[i], &Result::job_s)));
}

}  // namespace

void register_bench_backup(CLI::App& bench) {
  auto st = std::make_shared<Settings>();
  auto* cmd = bench.add_subcommand("backup", "Backup workers in dist_sync against a straggler");
  add_bench_flags(cmd, &st->flags);
  cmd->add_option("-n,--workers", st->workers, "Workers")->check(CLI::Range(2, 64));
  cmd->add_option("-s,--servers", st->servers, "Servers")->check(CLI::Range(1, 16));
  cmd->add_option("--size", st->size, "Key size in bytes, e.g. 1M");
  cmd->add_option("--step-ms", st->step_ms, "Compute time of a step (a sleep)")
      ->check(CLI::Range(0, 10000));
  cmd->add_option("--slow-factor", st->slow_factor, "The straggler's compute, times --step-ms")
      ->check(CLI::Range(1.0, 100.0));
  cmd->add_option("--backup", st->backup, "Backup workers of the third job")
      ->check(CLI::Range(1, 63));
  cmd->add_option("--rounds", st->rounds, "Timed rounds per job")->check(CLI::Range(1, 10000));
  cmd->add_option("--warmup", st->warmup, "Untimed rounds first")->check(CLI::Range(0, 1000));
  cmd->add_option("--repeats", st->repeats, "Interleaved repeats")->check(CLI::Range(1, 100));
  cmd->add_option("--max-late", st->max_late,
                  "PUSHPULL_PS_BACKUP_MAX_LATE of the backup job (0: the number of rounds)")
      ->check(CLI::Range(0, 100000));
  cmd->callback([st] { run(*st); });
}

}  // namespace pushpull::cli
