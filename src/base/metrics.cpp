// SPDX-License-Identifier: Apache-2.0
// The metrics writer thread (see metrics.h).
#include "base/metrics.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "base/private_file.h"
#include "base/timeline.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull::metrics {
namespace {

struct Writer {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::FILE* file = nullptr;
  std::thread thread;
  std::chrono::milliseconds interval{10000};
};

Writer& writer() {
  static auto* w = new Writer();  // lives until exit; the thread may outlive statics
  return *w;
}

void write_line(Writer& w, bool final) {
  const std::string line = snapshot_line(timeline::process_node(), final) + "\n";
  std::fwrite(line.data(), 1, line.size(), w.file);
  std::fflush(w.file);
}

void flush_at_exit() {
  shutdown();
}

}  // namespace

std::string_view counter_name(Counter c) {
  switch (c) {
    case Counter::kCollectiveOps:
      return "collective_ops";
    case Counter::kCollectiveFailures:
      return "collective_failures";
    case Counter::kCollectiveBytes:
      return "collective_bytes";
    case Counter::kPsRequests:
      return "ps_requests";
    case Counter::kPsRequestFailures:
      return "ps_request_failures";
    case Counter::kPsBytes:
      return "ps_bytes";
    case Counter::kServerPushes:
      return "server_pushes";
    case Counter::kServerRounds:
      return "server_rounds";
    case Counter::kServerPulls:
      return "server_pulls";
    case Counter::kPsLatePushesDropped:
      return "ps_late_pushes_dropped";
    case Counter::kNetShmBytes:
      return "net_shm_bytes";
    case Counter::kNetTcpBytes:
      return "net_tcp_bytes";
    case Counter::kNetLentBytes:
      return "net_lent_bytes";
    case Counter::kCount:
      break;
  }
  return "unknown";
}

int64_t value(Counter c) noexcept {
  return detail::g_counters[static_cast<int>(c)].load(std::memory_order_relaxed);
}

std::string snapshot_line(std::string_view node, bool final) {
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  std::string out = fmt::format(R"({{"ts_ms":{},"node":"{}","final":{},"counters":{{)", now, node,
                                final ? "true" : "false");
  for (int i = 0; i < static_cast<int>(Counter::kCount); ++i)
    fmt::format_to(std::back_inserter(out), R"({}"{}":{})", i ? "," : "",
                   counter_name(static_cast<Counter>(i)), value(static_cast<Counter>(i)));
  out += "}}";
  return out;
}

void shutdown() {
  Writer& w = writer();
  std::thread t;
  {
    std::lock_guard lock(w.mu);
    if (w.file == nullptr || w.stop) return;
    w.stop = true;
    t = std::move(w.thread);
  }
  w.cv.notify_all();
  if (t.joinable()) t.join();
  std::lock_guard lock(w.mu);
  write_line(w, true);
  std::fclose(w.file);
  w.file = nullptr;
  detail::g_state.store(1, std::memory_order_relaxed);
}

namespace detail {

bool init_from_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* base = std::getenv("PUSHPULL_METRICS");
    if (base == nullptr || *base == '\0') {
      g_state.store(1, std::memory_order_relaxed);
      return;
    }
    std::string stem = base;
    if (stem.size() > 6 && stem.ends_with(".jsonl")) stem.resize(stem.size() - 6);
    // The timeline's naming: F.worker0.jsonl, F.server1.jsonl, F.pid<N>.jsonl.
    const std::string& node = timeline::process_node();  // "worker 0", or "process"
    std::string tag;
    for (char c : node)
      if (c != ' ') tag.push_back(c);
    if (node == "process") tag = fmt::format("pid{}", ::getpid());
    const std::string path = fmt::format("{}.{}.jsonl", stem, tag);
    Writer& w = writer();
    if (const char* ms = std::getenv("PUSHPULL_METRICS_INTERVAL_MS"); ms && std::atoi(ms) > 0)
      w.interval = std::chrono::milliseconds(std::atoi(ms));
    // O_NOFOLLOW, 0600, never another user's file (base/private_file.h).
    try {
      w.file = base::fopen_private(path, "metrics");
    } catch (const IoError& e) {
      w.file = nullptr;
      PP_WARN("{}; no metrics for this process", e.what());
    }
    if (w.file == nullptr) {
      g_state.store(1, std::memory_order_relaxed);
      return;
    }
    w.thread = std::thread([&w] {
      std::unique_lock lock(w.mu);
      while (!w.cv.wait_for(lock, w.interval, [&] { return w.stop; }))
        write_line(w, false);
    });
    std::atexit(flush_at_exit);
    g_state.store(2, std::memory_order_relaxed);
  });
  return g_state.load(std::memory_order_relaxed) == 2;
}

}  // namespace detail
}  // namespace pushpull::metrics
