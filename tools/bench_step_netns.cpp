// SPDX-License-Identifier: Apache-2.0
#include "bench_step_netns.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_netns.h"
#include "bench_procs.h"
#include "bench_ps_netns.h"
#include "pushpull/error.h"

namespace pushpull::cli {
namespace {

// "result <impl> <ms>" from rank 0.
bool result_of(const std::string& out, const std::string& impl, double* ms) {
  std::istringstream in(out);
  std::string word, name;
  while (in >> word)
    if (word == "result" && in >> name >> *ms && name == impl) return true;
  return false;
}

std::string mb_str(double mb) {
  return mb == static_cast<int64_t>(mb) ? fmt::format("{}", static_cast<int64_t>(mb))
                                        : fmt::format("{}", mb);
}

}  // namespace

void run_step_netns(const StepNetnsArgs& a) {
  for (const auto& impl : a.impls)
    if (impl != "ddp-gloo" && impl != "ddp-pushpull")
      throw InvalidArgument(fmt::format(
          "bench step --netns: --impls {}: only ddp-gloo and ddp-pushpull run across namespace "
          "hosts (the others need `pushpull launch`, which starts one host)",
          impl));
  NetnsLab lab(a.hosts, a.rate);
  const double goodput = lab.goodput_bps(2);
  // Across hosts the ranks prove a secret (as `pushpull launch --nnodes`
  // requires); it reaches them through the environment, not argv.
  ::setenv("PUSHPULL_JOB_SECRET", random_hex(32).c_str(), 1);
  if (a.csv)
    std::printf(
        "impl,n,rate,grad_bytes,layers,step_ms,vs_ddp_gloo,paired_median,paired_min,"
        "paired_max\n");
  for (double mb : a.grad_mb) {
    std::map<std::string, std::vector<double>> got;
    for (int rep = 0; rep < a.repeats; ++rep) {
      for (const auto& impl : a.impls) {
        TempDir dir;
        ProcessGroup g;
        for (int r = 0; r < a.hosts; ++r) {  // rank 0 first: its stdout is the result
          std::vector<std::string> argv = lab.exec(r);
          argv.insert(argv.end(), {"env",
                                   fmt::format("RANK={}", r),
                                   fmt::format("WORLD_SIZE={}", a.hosts),
                                   "LOCAL_RANK=0",
                                   "LOCAL_WORLD_SIZE=1",
                                   fmt::format("MASTER_ADDR={}", lab.address(0)),
                                   "MASTER_PORT=29500",  // in host 0's own namespace: free
                                   fmt::format("PUSHPULL_NODE_HOST={}", lab.address(r)),
                                   "GLOO_SOCKET_IFNAME=eth0",
                                   "PUSHPULL_SHM=0",
                                   "OMP_NUM_THREADS=1",
                                   a.python,
                                   "-m",
                                   "pushpull.bench_step",
                                   "--impl",
                                   impl,
                                   "--grad-mb",
                                   mb_str(mb),
                                   "--layers",
                                   std::to_string(a.layers),
                                   "--batch",
                                   std::to_string(a.batch),
                                   "--steps",
                                   std::to_string(a.steps),
                                   "--warmup",
                                   std::to_string(a.warmup),
                                   "--store-dir",
                                   dir.path()});
          g.start(argv);
        }
        auto res = g.run(std::chrono::seconds(a.timeout_s));
        double ms = 0;
        if (!res.ok || !result_of(res.output, impl, &ms)) {
          std::fprintf(stderr, "bench step --netns: %s %s MiB failed: %s; left out of its row\n",
                       impl.c_str(), mb_str(mb).c_str(),
                       res.ok ? "no result line" : res.failure.c_str());
          ms = std::nan("");  // keeps the rounds aligned for the paired ratios
        }
        got[impl].push_back(ms);
      }
    }
    const double base = median(got["ddp-gloo"]);
    if (!a.csv)
      std::printf(
          "\nstep, %d ranks on %d network-namespace hosts, links %s (goodput %.3f Gbit/s), %s "
          "MiB of gradients in %d layers, batch %d, median of %d steps, median of %d "
          "interleaved run(s)\n%-14s %10s %12s   %s\n",
          a.hosts, a.hosts, a.rate.empty() ? "unshaped" : a.rate.c_str(), goodput / 1e9,
          mb_str(mb).c_str(), a.layers, a.batch, a.steps, a.repeats, "impl", "step ms",
          "vs ddp-gloo", "paired: median (min-max) over the runs");
    for (const auto& impl : a.impls) {
      const double ms = median(got[impl]);
      if (ms == 0) continue;  // every run failed
      const PairedRatio paired = paired_ratio(got[impl], got["ddp-gloo"]);
      const std::string ratio = base > 0 ? fmt::format("{:.3f}", ms / base) : "";
      if (a.csv)
        std::printf("%s,%d,%s,%llu,%d,%.3f,%s,%s\n", impl.c_str(), a.hosts, a.rate.c_str(),
                    static_cast<unsigned long long>(mb * (1 << 20)), a.layers, ms, ratio.c_str(),
                    paired_csv(paired).c_str());
      else
        std::printf("%-14s %10.2f %12s   %s\n", impl.c_str(), ms, ratio.c_str(),
                    impl == "ddp-gloo" ? "" : format_paired(paired).c_str());
    }
    std::fflush(stdout);
  }
  ::unsetenv("PUSHPULL_JOB_SECRET");
}

}  // namespace pushpull::cli
