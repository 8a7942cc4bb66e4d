// SPDX-License-Identifier: Apache-2.0
// Metrics: per-process counters (bytes, operations, failures) written as JSON
// lines (docs/timeline.md, "Metrics").
//
// PUSHPULL_METRICS_PORT=P also turns them on and serves them to Prometheus
// (metrics_http.h, docs/timeline.md "Prometheus"). Both settings are read
// through ObserveOptions::from_env (pushpull/options.h).
//
// Turned on by PUSHPULL_METRICS=F. The process writes F without a trailing
// ".jsonl", then ".<role><rank>.jsonl" (the timeline's naming), one line
// every PUSHPULL_METRICS_INTERVAL_MS (default 10000) from a background thread
// and a last one at exit:
//   {"ts_ms":..., "node":"worker 0", "final":false, "counters":{"collective_ops":12, ...}}
// Counters are cumulative since the process started.
//
// Cost: off, PP_METRIC_ADD is one relaxed atomic load and does not evaluate
// its value; on, one relaxed fetch_add on a process-wide counter.
//
// Thread safety: everything may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace pushpull::metrics {

enum class Counter : int {
  kCollectiveOps,         // collective ops completed on this rank
  kCollectiveFailures,    // ... that failed
  kCollectiveBytes,       // bytes of the tensors those ops executed
  kCollectiveStalls,      // stall warnings (rank 0: a tensor not every rank submitted)
  kCollectiveWaitMicros,  // microseconds callers spent waiting for collectives (wait())
  kElasticReformations,   // times an elastic group re-formed after a failure or new hosts
  kPsRequests,            // parameter-server requests sent by a worker (push, pull, init, command)
  kPsRequestFailures,     // ... that failed
  kPsBytes,               // bytes pushed or pulled by a worker
  kPsFailovers,           // fail-overs a worker saw (a server's key ranges moved to backups)
  kServerPushes,          // pushes summed by a server
  kServerRounds,          // rounds (updates) applied by a server
  kServerPulls,           // pulls answered by a server
  kPsLatePushesDropped,   // pushes a server dropped: their round closed without them (backup
                          // workers)
  // Counted always (not only with PUSHPULL_METRICS), by transport::MessageTransport:
  kNetShmBytes,   // message payload bytes sent through a same-host shared-memory ring
  kNetTcpBytes,   // ... sent over TCP between servers and workers (not to or from the scheduler)
  kNetLentBytes,  // replica bytes a backup copied straight out of a same-host primary
                  // (transport/shm/lend.h)
  kCount
};
std::string_view counter_name(Counter c);

namespace detail {
inline std::atomic<int> g_state{0};  // 0 undecided, 1 off, 2 on
inline std::atomic<int64_t> g_counters[static_cast<int>(Counter::kCount)];
bool init_from_env();
}  // namespace detail

inline bool enabled() noexcept {
  const int s = detail::g_state.load(std::memory_order_relaxed);
  if (s == 0) [[unlikely]]
    return detail::init_from_env();
  return s == 2;
}

inline void add(Counter c, int64_t v) noexcept {
  detail::g_counters[static_cast<int>(c)].fetch_add(v, std::memory_order_relaxed);
}
int64_t value(Counter c) noexcept;

// One JSON line with the current counters (what the writer appends).
std::string snapshot_line(std::string_view node, bool final);
// Writes the final line and stops the writer (also run at exit).
void shutdown();
// Every counter in the Prometheus text exposition format (0.0.4):
//   # HELP pushpull_collective_ops_total ...
//   # TYPE pushpull_collective_ops_total counter
//   pushpull_collective_ops_total{role="worker",rank="0"} 12
std::string prometheus_text(std::string_view role, std::string_view rank);
// A label value escaped as the format wants (\\, \", \n).
std::string label_escape(std::string_view v);
// Starts what the environment asks for (PUSHPULL_METRICS file,
// PUSHPULL_METRICS_PORT endpoint) if not yet decided; called where a node or
// a collective session starts, so the endpoint answers before the first op.
inline void start_from_env() noexcept {
  (void)enabled();
}

}  // namespace pushpull::metrics

// PP_METRIC_ADD(kCounter, value): adds when metrics are on; `value` is
// evaluated only then.
#define PP_METRIC_ADD(counter, value)                                    \
  (::pushpull::metrics::enabled()                                        \
       ? ::pushpull::metrics::add(::pushpull::metrics::Counter::counter, \
                                  static_cast<int64_t>(value))           \
       : void())
