// SPDX-License-Identifier: Apache-2.0
// scale_sim: the control plane of 1,024 and 4,096 ranks on a simulated
// network (tests/sim/scale_sim.h; docs/scaling.md "The control plane at
// 1,024 and 4,096 ranks"; `make simulate-scale`).
//
//   scale_sim [--ranks 1024,4096] [--servers 2] [--local-size 8]
//             [--per-message-us 100] [--engines ps,ps_mesh,full,sparse]
//
// Every engine runs twice per rank count: with a rank stopped (SIGSTOP: only
// the heartbeats can tell) and with it killed (its connections close). Prints
// one markdown table. Exit status: 0 when every run completed with the right
// values and named the victim, 1 otherwise, 2 on bad usage.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "sim/scale_sim.h"

using namespace pushpull::sim::scale;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    size_t c = s.find(',', at);
    if (c == std::string::npos) c = s.size();
    if (c > at) out.push_back(s.substr(at, c - at));
    at = c + 1;
  }
  return out;
}

// "9.51, 9.55", or why the run has none (a false alarm before the fault).
std::string detection(const Report& r) {
  if (!r.failure.empty()) return "invalid (see below)";
  return fmt::format("{:.2f}, {:.2f}", r.detect_first_s, r.detect_all_s);
}

Report run_one(const std::string& engine, Config c) {
  if (engine == "ps" || engine == "ps_mesh") {
    c.worker_mesh = engine == "ps_mesh";
    return run_ps(c);
  }
  c.topology = engine == "full" ? Topology::kFullMesh : Topology::kSparse;
  return run_collective(c);
}

}  // namespace

int main(int argc, char** argv) {
  Config base;
  std::string ranks = "1024,4096", engines = "ps,full,sparse";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fmt::print(stderr, "scale_sim: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ranks") {
      ranks = value();
    } else if (a == "--engines") {
      engines = value();
    } else if (a == "--servers") {
      base.servers = std::atoi(value().c_str());
    } else if (a == "--local-size") {
      base.local_size = std::atoi(value().c_str());
    } else if (a == "--per-message-us") {
      base.costs.per_message_us = std::strtoull(value().c_str(), nullptr, 10);
    } else {
      fmt::print(stderr,
                 "usage: scale_sim [--ranks 1024,4096] [--servers 2] [--local-size 8] "
                 "[--per-message-us 100] [--engines ps,ps_mesh,full,sparse]\n");
      return 2;
    }
  }
  if (base.servers < 1 || base.local_size < 1) {
    fmt::print(stderr, "scale_sim: --servers and --local-size must be >= 1\n");
    return 2;
  }
  fmt::print(
      "# scale_sim: {} us per message at each end, {} us latency, {:.0f} Gbit/s links, "
      "heartbeat every {} ms, timeout {} ms; PS: {} servers; {} ranks (PS: workers) per host\n",
      base.costs.per_message_us, base.costs.latency_us, base.costs.link_bytes_per_us * 8 / 1e3,
      base.heartbeat_interval_us / 1000, base.heartbeat_timeout_us / 1000, base.servers,
      base.local_size);
  fmt::print(
      "| engine | ranks | conns/rank (mean, max) | hub conns | start-up msgs/rank | start-up "
      "KB/rank | hub start-up msgs | hub start-up MB | hb msgs/rank/interval (max) | hub hb "
      "msgs/interval | hb CPU/rank | hub hb CPU | start-up (s) | 1st round (ms) | rank 0 bytes/op "
      "(1st, cached) | rank 0 msgs/op repeat (direct, tree) | rank 0 bytes/op repeat, tree | "
      "repeat "
      "negotiated (ms; direct, tree) | stopped: named, all told (s) | killed: named, all told (s) "
      "|\n");
  std::string rule = "|";
  for (int i = 0; i < 20; ++i)
    rule += "---|";
  fmt::print("{}\n", rule);
  int bad = 0;
  for (const auto& rs : split(ranks))
    for (const auto& e : split(engines)) {
      Config c = base;
      c.ranks = std::atoi(rs.c_str());
      if (c.ranks < 2) {
        fmt::print(stderr, "scale_sim: --ranks must be >= 2\n");
        return 2;
      }
      const auto t0 = std::chrono::steady_clock::now();
      c.fault = Fault::kStop;
      Report r = run_one(e, c);
      if (r.startup_s < 0) {  // nothing to measure; the same again with a kill
        fmt::print(stderr, "scale_sim: {} {} ranks: {}\n", r.engine, r.ranks, r.failure);
        fmt::print("| {} | {} | start-up not complete within {} s simulated (see below) |{}\n",
                   r.engine, r.ranks, kStartupLimitUs / 1'000'000, std::string(17, '|'));
        ++bad;
        continue;
      }
      c.fault = Fault::kKill;
      Report k = run_one(e, c);
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (const Report* x : {&r, &k})
        if (!x->failure.empty() || !x->values_ok) {
          fmt::print(stderr, "scale_sim: {} {} ranks: {}\n", x->engine, x->ranks, x->failure);
          ++bad;
        }
      const bool coll = e == "full" || e == "sparse";
      fmt::print(
          "| {} | {} | {:.1f}, {:.0f} | {:.0f} | {:.1f} | {:.1f} | {:.0f} | {:.2f} | {:.1f} | "
          "{:.0f} | {:.2f}% | {:.1f}% | {:.3f} | {:.2f} | {} | {} | {} | {} | {} | {} |\n",
          r.engine, r.ranks, r.connections.mean, r.connections.max, r.connections.hub,
          r.startup_messages.mean, r.startup_bytes.mean / 1e3, r.startup_messages.hub,
          r.startup_bytes.hub / 1e6, r.heartbeat_messages.max, r.heartbeat_messages.hub,
          100 * r.heartbeat_cpu.max, 100 * r.heartbeat_cpu.hub, r.startup_s, r.round_ms,
          coll ? fmt::format("{:.0f} KB, {:.0f} KB", r.op_bytes_hub_first / 1e3,
                             r.op_bytes_hub_cached / 1e3)
               : std::string("-"),
          coll ? fmt::format("{:.0f}, {:.0f}", r.op_messages_hub, r.op_messages_hub_tree)
               : std::string("-"),
          coll ? fmt::format("{:.1f} KB", r.op_bytes_hub_tree / 1e3) : std::string("-"),
          coll ? fmt::format("{:.2f}, {:.2f}", r.negotiate_direct_ms, r.negotiate_tree_ms)
               : std::string("-"),
          detection(r), detection(k));
      fmt::print(stderr, "# {} {} ranks: {} + {} events, {:.1f} s; stopped: \"{}\"\n", r.engine,
                 r.ranks, r.events, k.events, wall, r.verdict);
    }
  return bad ? 1 : 0;
}
