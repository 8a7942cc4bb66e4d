// SPDX-License-Identifier: Apache-2.0
#include "bench_ps_netns.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_netns.h"
#include "bench_procs.h"
#include "pushpull/error.h"
#include "pushpull/kvstore.h"

namespace pushpull::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v)
    s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace

std::string random_hex(size_t bytes) {
  std::random_device rd;
  std::string out;
  for (size_t i = 0; i < bytes; ++i)
    out += fmt::format("{:02x}", rd() & 0xff);
  return out;
}

void run_ps_node(const std::vector<uint64_t>& sizes, const std::vector<std::string>& compressions,
                 int iters, const std::string& out_dir) {
  Options options = Options::from_env();
  options.log_level = LogLevel::kWarning;
  // Servers and the scheduler serve here and exit; only workers return.
  auto kv = create_kvstore("dist_sync", options);
  const size_t types = compressions.size();
  // secs[t][s][i]
  std::vector<std::vector<std::vector<double>>> secs(
      types, std::vector<std::vector<double>>(sizes.size(), std::vector<double>(iters, 0.0)));
  for (size_t s = 0; s < sizes.size(); ++s) {
    const auto n = static_cast<int64_t>(sizes[s] / 4);
    Array grad = Array::full(Shape{n}, 1.0), out(Shape{n}, DType::kFloat32);
    auto key = [&](size_t t) { return static_cast<int64_t>(s * types + t); };
    for (size_t t = 0; t < types; ++t) {
      kv->init(key(t), grad.view());
      kv->set_gradient_compression({{"type", compressions[t]}});
      kv->pushpull(key(t), grad.view(), out.view());  // warm-up
    }
    for (int i = 0; i < iters; ++i)
      for (size_t t = 0; t < types; ++t) {  // interleaved: the same conditions for each
        kv->set_gradient_compression({{"type", compressions[t]}});
        kv->barrier();
        auto t0 = Clock::now();
        kv->pushpull(key(t), grad.view(), out.view());
        secs[t][s][static_cast<size_t>(i)] =
            std::chrono::duration<double>(Clock::now() - t0).count();
      }
  }
  kv->barrier();
  const std::string path = fmt::format("{}/times.{}", out_dir, kv->rank());
  {
    std::ofstream f(path + ".tmp");
    for (size_t t = 0; t < types; ++t)
      for (size_t s = 0; s < sizes.size(); ++s)
        for (int i = 0; i < iters; ++i)
          f << compressions[t] << " " << sizes[s] << " " << i << " "
            << fmt::format("{:.9f}", secs[t][s][static_cast<size_t>(i)]) << "\n";
    if (!f) throw IoError(fmt::format("bench ps: cannot write {}", path));
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

std::vector<PsNetnsRow> run_ps_netns(const PsNetnsArgs& a, double* goodput_bps) {
  NetnsLab lab(a.hosts, a.rate);
  *goodput_bps = lab.goodput_bps(2);
  TempDir dir;
  // The job's secret reaches the children through the environment they
  // inherit (not their command lines); namespaces other than loopback need it.
  ::setenv("PUSHPULL_JOB_SECRET", random_hex(32).c_str(), 1);
  const std::string job = fmt::format("bench-ps-{}", ::getpid());
  const int port = 9400;  // inside host 0's own namespace: always free
  std::vector<std::string> sizes;
  for (uint64_t b : a.sizes)
    sizes.push_back(std::to_string(b));
  auto node = [&](int host, const char* role) {
    std::vector<std::string> argv = lab.exec(host);
    argv.insert(argv.end(), {"env",
                             fmt::format("DMLC_ROLE={}", role),
                             fmt::format("DMLC_PS_ROOT_URI={}", lab.address(0)),
                             fmt::format("DMLC_PS_ROOT_PORT={}", port),
                             fmt::format("DMLC_NUM_SERVER={}", a.hosts),
                             fmt::format("DMLC_NUM_WORKER={}", a.hosts),
                             fmt::format("DMLC_NODE_HOST={}", lab.address(host)),
                             fmt::format("PUSHPULL_JOB_ID={}", job),
                             self_exe(),
                             "bench",
                             "ps",
                             "--ps-node",
                             "--ps-out",
                             dir.path(),
                             "--sizes",
                             join(sizes),
                             "--iters",
                             std::to_string(a.iters),
                             "--compression",
                             join(a.compressions)});
    return argv;
  };
  {
    ProcessGroup g;
    g.start(node(0, "scheduler"));
    for (int h = 0; h < a.hosts; ++h) {
      g.start(node(h, "server"));
      g.start(node(h, "worker"));
    }
    auto res = g.run(std::chrono::seconds(a.timeout_s));
    ::unsetenv("PUSHPULL_JOB_SECRET");
    if (!res.ok) throw IoError(fmt::format("bench ps --netns: the job failed: {}", res.failure));
  }
  // (compression, bytes, iteration) -> the slowest worker's seconds.
  std::map<std::tuple<std::string, uint64_t, int>, double> slowest;
  for (int r = 0; r < a.hosts; ++r) {
    std::ifstream f(fmt::format("{}/times.{}", dir.path(), r));
    if (!f) throw IoError(fmt::format("bench ps --netns: worker {} wrote no times", r));
    std::string comp;
    uint64_t bytes;
    int i;
    double secs;
    while (f >> comp >> bytes >> i >> secs) {
      double& slot = slowest[{comp, bytes, i}];
      slot = std::max(slot, secs);
    }
  }
  std::vector<PsNetnsRow> rows;
  for (const auto& comp : a.compressions)
    for (uint64_t bytes : a.sizes) {
      std::vector<double> v;
      for (int i = 0; i < a.iters; ++i)
        if (auto it = slowest.find({comp, bytes, i}); it != slowest.end()) v.push_back(it->second);
      if (!v.empty()) rows.push_back({comp, bytes, median(v) * 1e6});
    }
  return rows;
}

}  // namespace pushpull::cli
