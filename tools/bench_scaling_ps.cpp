// SPDX-License-Identifier: Apache-2.0
// `pushpull bench ps --netns N`: push+pull of one large float32 value by N
// workers on N hosts with S = 1, 2, 4, 8 parameter servers on S further hosts,
// next to pushpull's ring allreduce of the same value among the same N hosts;
// every link shaped to --rate. The runs are the step of bench_scaling.h with
// no compute and one layer, so the processes, rendezvous and timing are those
// of `bench scaling`. A row is the median over iterations (and repeats) of
// the slowest worker's time for one pushpull / allreduce.
//
// Bounds at the measured goodput B (per direction of a link) for a value of
// M bytes: the ring 2(n-1)/n M/B; a PS whose k servers are dedicated hosts
// max(1, n/k) M/B (each worker link carries M each way, each server link
// n M / k each way); BytePS's 2n(n-1)M / ((n^2 + kn - 2k)B), which also lets
// the workers' hosts serve part of the value (equal to the dedicated bound
// when k = n, below it otherwise). Each server host's link counters give
// the bytes it carried.
#include <algorithm>
#include <cstdio>
#include <map>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_netns.h"
#include "bench_scaling.h"
#include "ps/server_shares.h"

namespace pushpull::cli {
namespace {

// The mean of the (min, max) pairs of the repeats.
std::pair<double, double> mean_range(const std::vector<std::pair<double, double>>& per_repeat) {
  double lo = 0, hi = 0;
  for (auto& [a, b] : per_repeat) {
    lo += a;
    hi += b;
  }
  const double n = static_cast<double>(per_repeat.size());
  return {lo / n, hi / n};
}

}  // namespace

void run_ps_netns(const PsNetnsSettings& st) {
  const int n = st.workers;
  const int max_s =
      st.servers.empty() ? 0 : *std::max_element(st.servers.begin(), st.servers.end());
  NetnsLab lab(n + max_s, st.rate, st.queue_ms);
  const double goodput = lab.goodput_bps(2);
  BenchFlags flags;
  flags.format = st.csv ? "csv" : "table";
  BenchTable table(flags);
  StepSpec step;
  step.compute_ms = 0;
  step.layers = 1;
  step.warmup = st.warmup;
  step.steps = st.iters;
  step.grad_bytes = st.bytes;
  const double m = static_cast<double>(st.bytes);
  std::vector<RunSpec> specs;
  for (int s : st.servers) {
    if (st.dedicated) specs.push_back({"pushpull_ps", n, s, false, st.ps_replicas});
    if (st.hybrid) specs.push_back({"pushpull_ps", n, s, false, st.ps_replicas, true});
  }
  if (st.ring) specs.push_back({"pushpull_ring", n, 0, false});
  std::map<size_t, std::vector<double>> ms;  // spec -> one median per repeat
  std::map<size_t, std::vector<std::pair<double, double>>>
      per_server;  // spec -> (min, max) MB/iter
  int port = 21000;
  for (int rep = 0; rep < st.repeats; ++rep) {
    for (size_t i = 0; i < specs.size(); ++i) {
      RunResult r = run_config(lab, n, step, specs[i], st.timeout_s, ++port);
      if (!r.ok) {
        std::fprintf(stderr, "bench ps --netns: %s with %d server(s) failed: %s; row missing\n",
                     specs[i].impl.c_str(), specs[i].servers, r.failure.c_str());
        continue;
      }
      ms[i].push_back(median(r.step_ms));
      if (!r.server_rx.empty()) {
        // In + out per server, per iteration (init and warm-up included in the
        // counters: they move the value once more, spread the same way).
        double lo = 1e300, hi = 0;
        for (size_t s = 0; s < r.server_rx.size(); ++s) {
          double mb = static_cast<double>(r.server_rx[s] + r.server_tx[s]) /
                      (step.warmup + step.steps) / 1e6;
          lo = std::min(lo, mb);
          hi = std::max(hi, mb);
        }
        per_server[i].push_back({lo, hi});
      }
    }
  }
  std::vector<std::string> notes;
  double ring_us = 0;
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].impl == "pushpull_ring" && !ms[i].empty()) ring_us = median(ms[i]) * 1e3;
  auto add = [&](const std::string& impl, double us) {
    double gbps = 2.0 * m / (us * 1e-6) / 1e9;
    table.add({impl, n, st.bytes, us, gbps, gbps});
  };
  const double mb_us = goodput > 0 ? m * 8 / goodput * 1e6 : 0;  // M/B in us
  for (size_t i = 0; i < specs.size(); ++i) {
    if (ms[i].empty()) continue;
    const double us = median(ms[i]) * 1e3;
    const RunSpec& sp = specs[i];
    if (sp.impl == "pushpull_ring") {
      add("pushpull_ring", us);
      if (mb_us > 0) {
        double bound = 2.0 * (n - 1) / n * mb_us;
        add("ring_bound", bound);
        notes.push_back(fmt::format("pushpull_ring: {:.3f} s = {:.3f}x its bound {:.3f} s",
                                    us / 1e6, us / bound, bound / 1e6));
      }
      continue;
    }
    const int k = sp.servers;
    const std::string name = fmt::format("pushpull_{}{}s", sp.hybrid ? "hybrid_" : "", k);
    add(name, us);
    if (mb_us <= 0) continue;
    const double dedicated = std::max(1.0, static_cast<double>(n) / k) * mb_us;
    const double byteps = 2.0 * n * (n - 1) / (n * n + k * n - 2.0 * k) * mb_us;
    if (sp.hybrid) {
      // The spare hosts' links: n a M / k each way (ps/server_shares.h).
      const double share = 2.0 * n * ps::spare_host_fraction(n, k) * m / k;
      std::string line = fmt::format(
          "{}: {:.3f} s = {:.3f}x BytePS's bound {:.3f} s, {:.3f}x the "
          "dedicated-server bound",
          name, us / 1e6, us / byteps, byteps / 1e6, us / dedicated);
      if (ring_us > 0) line += fmt::format(", {:.3f}x the ring's time", us / ring_us);
      if (!per_server[i].empty()) {
        auto [lo, hi] = mean_range(per_server[i]);
        line += fmt::format(
            "; per spare host {:.1f}..{:.1f} MB in+out per iteration (BytePS's split: {:.1f})", lo,
            hi, share / 1e6);
      }
      notes.push_back(line);
      continue;
    }
    add(fmt::format("ps_bound_{}s", k), dedicated);
    add(fmt::format("byteps_bound_{}s", k), byteps);
    std::string line = fmt::format(
        "pushpull_{}s: {:.3f} s = {:.3f}x the dedicated-server bound {:.3f} s, {:.3f}x BytePS's "
        "bound {:.3f} s",
        k, us / 1e6, us / dedicated, dedicated / 1e6, us / byteps, byteps / 1e6);
    if (ring_us > 0) line += fmt::format(", {:.3f}x the ring's time", us / ring_us);
    if (!per_server[i].empty()) {
      auto [lo, hi] = mean_range(per_server[i]);
      line += fmt::format(
          "; per server host {:.1f}..{:.1f} MB in+out per iteration (even share: {:.1f})", lo, hi,
          2.0 * n * m / k / 1e6);
    }
    notes.push_back(line);
  }
  table.print(fmt::format(
      "push+pull of one {} float32 value, {} workers on {} hosts, servers on their own hosts "
      "(hybrid: and on the workers' hosts), "
      "links {} (iperf3 goodput {:.3f} Gbit/s); GB/s = 2 x size / time for every row; *_bound "
      "rows are times at that goodput",
      format_bytes(st.bytes), n, n, st.rate.empty() ? "unshaped" : st.rate, goodput / 1e9));
  if (!st.csv)
    for (auto& l : notes)
      std::printf("%s\n", l.c_str());
}

}  // namespace pushpull::cli
