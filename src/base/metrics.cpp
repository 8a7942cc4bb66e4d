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

#include "base/metrics_http.h"
#include "base/private_file.h"
#include "base/timeline.h"
#include "pushpull/error.h"
#include "pushpull/log.h"
#include "pushpull/options.h"

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

// The JSON-lines writer of PUSHPULL_METRICS; false when the file cannot be opened.
bool start_writer(const ObserveOptions& o) {
  std::string stem = o.metrics_file;
  if (stem.size() > 6 && stem.ends_with(".jsonl")) stem.resize(stem.size() - 6);
  // The timeline's naming: F.worker0.jsonl, F.server1.jsonl, F.pid<N>.jsonl.
  const std::string& node = timeline::process_node();  // "worker 0", or "process"
  std::string tag;
  for (char c : node)
    if (c != ' ') tag.push_back(c);
  if (node == "process") tag = fmt::format("pid{}", ::getpid());
  const std::string path = fmt::format("{}.{}.jsonl", stem, tag);
  Writer& w = writer();
  w.interval = std::chrono::milliseconds(o.metrics_interval_ms);
  // O_NOFOLLOW, 0600, never another user's file (base/private_file.h).
  try {
    w.file = base::fopen_private(path, "metrics");
  } catch (const IoError& e) {
    w.file = nullptr;
    PP_WARN("{}; no metrics file for this process", e.what());
  }
  if (w.file == nullptr) return false;
  w.thread = std::thread([&w] {
    std::unique_lock lock(w.mu);
    while (!w.cv.wait_for(lock, w.interval, [&] { return w.stop; }))
      write_line(w, false);
  });
  std::atexit(flush_at_exit);
  return true;
}

// One line of help per counter (the Prometheus # HELP text).
std::string_view counter_help(Counter c) {
  switch (c) {
    case Counter::kCollectiveOps:
      return "Collective operations completed on this rank.";
    case Counter::kCollectiveFailures:
      return "Collective operations that failed.";
    case Counter::kCollectiveBytes:
      return "Bytes of the tensors collective operations executed.";
    case Counter::kCollectiveStalls:
      return "Stall warnings: a tensor some ranks submitted and others did not, for the stall "
             "time.";
    case Counter::kCollectiveWaitMicros:
      return "Microseconds callers spent waiting for collective operations to complete.";
    case Counter::kElasticReformations:
      return "Times an elastic group re-formed (a member failed, or hosts were added).";
    case Counter::kPsFailovers:
      return "Fail-overs a worker saw: a failed server's key ranges moved to their backups.";
    case Counter::kPsRequests:
      return "Parameter-server requests sent by a worker.";
    case Counter::kPsRequestFailures:
      return "Parameter-server requests that failed.";
    case Counter::kPsBytes:
      return "Bytes pushed or pulled by a worker.";
    case Counter::kServerPushes:
      return "Pushes summed by a server.";
    case Counter::kServerRounds:
      return "Rounds (updates) applied by a server.";
    case Counter::kServerPulls:
      return "Pulls answered by a server.";
    case Counter::kPsLatePushesDropped:
      return "Pushes a server dropped because their round closed without them (backup workers).";
    case Counter::kNetShmBytes:
      return "Payload bytes sent through a same-host shared-memory ring.";
    case Counter::kNetTcpBytes:
      return "Payload bytes sent over TCP between servers and workers.";
    case Counter::kNetLentBytes:
      return "Replica bytes a backup copied out of a same-host primary.";
    case Counter::kCount:
      break;
  }
  return "";
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
    case Counter::kCollectiveStalls:
      return "collective_stall_warnings";
    case Counter::kCollectiveWaitMicros:
      return "collective_wait_us";
    case Counter::kElasticReformations:
      return "elastic_reformations";
    case Counter::kPsFailovers:
      return "ps_failovers";
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

std::string prometheus_text(std::string_view role, std::string_view rank) {
  std::string out;
  const std::string labels =
      fmt::format(R"({{role="{}",rank="{}"}})", label_escape(role), label_escape(rank));
  for (int i = 0; i < static_cast<int>(Counter::kCount); ++i) {
    const auto c = static_cast<Counter>(i);
    const std::string name = fmt::format("pushpull_{}_total", counter_name(c));
    fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} counter\n{}{} {}\n", name,
                   counter_help(c), name, name, labels, value(c));
  }
  return out;
}

std::string label_escape(std::string_view v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\' || ch == '"') out.push_back('\\');
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(ch);
  }
  return out;
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
    ObserveOptions o;
    try {
      o = ObserveOptions::from_env();
    } catch (const Error& e) {
      PP_WARN("{}; no metrics for this process", e.what());
      g_state.store(1, std::memory_order_relaxed);
      return;
    }
    bool on = false;
    if (o.metrics_port > 0) {
      // The endpoint (docs/timeline.md, "Prometheus"): role and rank labels.
      const std::string role = o.role, rank = o.rank >= 0 ? std::to_string(o.rank) : "";
      auto* server = new MetricsServer([role, rank] { return prometheus_text(role, rank); });
      try {
        server->start(o.bind_host, o.metrics_port + o.port_index);
        PP_DEBUG("metrics: serving http://{}:{}/metrics", o.bind_host, server->port());
        on = true;  // lives until exit, like the counters it reads
      } catch (const IoError& e) {
        PP_WARN("{}; no Prometheus endpoint for this process", e.what());
        delete server;
      }
    }
    if (!o.metrics_file.empty() && start_writer(o)) on = true;
    g_state.store(on ? 2 : 1, std::memory_order_relaxed);
  });
  return g_state.load(std::memory_order_relaxed) == 2;
}

}  // namespace detail
}  // namespace pushpull::metrics
