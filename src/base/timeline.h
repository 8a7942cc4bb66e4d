// SPDX-License-Identifier: Apache-2.0
// Timeline: a Chrome trace (chrome://tracing, https://ui.perfetto.dev) of what
// a process spent its time on — per tensor the collective engine's phases,
// per key the parameter server's (docs/timeline.md).
//
// Turned on by PUSHPULL_TIMELINE=F (or Horovod's HOROVOD_TIMELINE=F; `pushpull
// launch --timeline-filename F` sets it for every process). Each process then
// writes its own file: F without a trailing ".json", then ".<role><rank>.json"
// (F = trace.json gives trace.worker0.json, trace.server1.json, ...), role and
// rank from the launcher's (or mpirun's, torchrun's, Slurm's) environment
// variables. `pushpull launch` merges them into F when the job ends, the
// hosts' clocks aligned (docs/timeline.md); scripts/timeline-merge.py merges
// files by hand.
//
// In the trace a pushpull node (worker 0, server 1, ...) is a "process" lane
// and each tensor or key a "thread" lane inside it, so several nodes sharing
// one process (the in-process tests) still get lanes of their own.
//
// Cost: when off, an event site is one relaxed atomic load (enabled()); the
// lane and name arguments of PP_TIMELINE_SPAN are not even evaluated. When on,
// an event is formatted into a buffer under a mutex and the buffer is written
// out every few thousand events and at exit (std::atexit) or shutdown().
//
// Thread safety: every function may be called from any thread. Ownership: the
// process-wide recorder lives until exit; Recorder objects own their file.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace pushpull::timeline {

using Clock = std::chrono::steady_clock;

// Writes one trace file (JSON array format: "[", events, "]"). Usable on its
// own (tests, tools); the process-wide one is behind enabled()/record().
class Recorder {
 public:
  // Opens `path` for writing; throws IoError when it cannot.
  explicit Recorder(const std::string& path);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  ~Recorder();  // close()

  // A complete event ("ph":"X") from `begin` to `end` on lane `lane` of node
  // `node` (e.g. "worker 0"). `bytes` >= 0 adds args.bytes.
  void span(std::string_view node, std::string_view lane, std::string_view name,
            Clock::time_point begin, Clock::time_point end, int64_t bytes = -1);
  // An instant event ("ph":"i").
  void instant(std::string_view node, std::string_view lane, std::string_view name,
               Clock::time_point at);
  // Phases of a lane that start and end in different places (a tensor queued
  // in submit(), negotiated in the engine thread, executed later): phase()
  // ends the lane's open phase, if any, at `at` and opens `name`; end() ends
  // it. One open phase per lane.
  void phase(std::string_view node, std::string_view lane, std::string_view name,
             Clock::time_point at, int64_t bytes = -1);
  void end(std::string_view node, std::string_view lane, Clock::time_point at);
  // Overlapping operations of one node (a worker's parameter-server requests,
  // in flight by the hundred): Chrome "async" events, matched by `id` within
  // the node, drawn on tracks of their own. args: key, bytes (>= 0 shown).
  void async_begin(std::string_view node, std::string_view name, uint64_t id, int64_t key,
                   int64_t bytes, Clock::time_point at);
  void async_end(std::string_view node, uint64_t id, Clock::time_point at);
  // A metadata event "pushpull_clock_offset" (args offset_us, rtt_us,
  // samples): add offset_us to this file's times to get the launcher's clock
  // (base/clock_sync.h); the launcher's merge applies it.
  void clock_offset(int64_t offset_ns, int64_t rtt_ns, int samples);
  // Writes the buffered events to the file (the file stays open).
  void flush();
  // Flushes, ends the JSON array and closes the file; later events are dropped.
  void close();
  const std::string& path() const { return path_; }

 private:
  // Lane ids, with their metadata events emitted on first use. Under mu_.
  int node_id(std::string_view node);
  int lane_id(int pid, std::string_view lane);
  void append_event(std::string_view json);  // under mu_
  void append_span(int pid, int tid, std::string_view name, Clock::time_point begin,
                   Clock::time_point end, int64_t bytes);  // under mu_
  void append_async_end(int pid, uint64_t id, std::string_view name,
                        Clock::time_point at);  // under mu_
  struct Open {
    std::string name;
    Clock::time_point begin;
    int64_t bytes;
  };

  std::mutex mu_;
  std::string path_;
  std::FILE* file_ = nullptr;
  std::string buffer_;
  bool first_ = true;
  std::map<std::string, int, std::less<>> nodes_;
  std::map<int, std::map<std::string, int, std::less<>>> lanes_;  // per node id
  std::map<std::pair<int, int>, Open> open_;                      // (pid, tid) -> phase
  std::map<std::pair<int, uint64_t>, std::string> open_async_;    // (pid, id) -> name
};

namespace detail {
// 0: not yet decided (first enabled() reads the environment), 1: off, 2: on.
inline std::atomic<int> g_state{0};
bool init_from_env();
void record_span(std::string_view node, std::string_view lane, std::string_view name,
                 Clock::time_point begin, Clock::time_point end, int64_t bytes);
void record_phase(std::string_view node, std::string_view lane, std::string_view name,
                  int64_t bytes = -1);
void record_end(std::string_view node, std::string_view lane);
void record_async_begin(std::string_view node, std::string_view name, uint64_t id, int64_t key,
                        int64_t bytes);
void record_async_end(std::string_view node, uint64_t id);
}  // namespace detail

// True when this process records a timeline: one relaxed load once decided.
inline bool enabled() noexcept {
  const int s = detail::g_state.load(std::memory_order_relaxed);
  if (s == 0) [[unlikely]]
    return detail::init_from_env();
  return s == 2;
}

// Starts the process-wide timeline explicitly, writing `path` as given (no
// role/rank suffix); replaces one started before. Throws IoError.
void start(const std::string& path);
// Flushes and closes the process-wide timeline; recording stops.
void shutdown();
// The file the process-wide timeline writes ("" when off).
std::string current_path();
// The per-process file name for base name `base` (see the top of this file).
std::string process_file_name(const std::string& base, std::string_view role, int rank);

// This process's node name for lanes ("worker 0", "server 1"; "rank 3" or
// "process" when the environment does not say), from the same variables as
// the file name. For hooks that do not know their node's identity.
const std::string& process_node();

// Records a span on the process-wide timeline (no-op when off).
inline void span(std::string_view node, std::string_view lane, std::string_view name,
                 Clock::time_point begin, Clock::time_point end, int64_t bytes = -1) {
  if (enabled()) detail::record_span(node, lane, name, begin, end, bytes);
}

// RAII span from construction to destruction. Built by PP_TIMELINE_SPAN,
// which skips evaluating its arguments when the timeline is off.
class Span {
 public:
  static Span off() { return Span(); }
  static Span on(std::string node, std::string lane, std::string_view name, int64_t bytes = -1) {
    return Span(std::move(node), std::move(lane), name, bytes);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  ~Span() {
    if (active_) detail::record_span(node_, lane_, name_, begin_, Clock::now(), bytes_);
  }

 private:
  Span() = default;
  Span(std::string node, std::string lane, std::string_view name, int64_t bytes)
      : active_(true),
        node_(std::move(node)),
        lane_(std::move(lane)),
        name_(name),
        bytes_(bytes),
        begin_(Clock::now()) {}
  bool active_ = false;
  std::string node_, lane_;
  std::string_view name_;  // a string literal at every call site
  int64_t bytes_ = -1;
  Clock::time_point begin_{};
};

}  // namespace pushpull::timeline

#define PP_TIMELINE_CAT2(a, b) a##b
#define PP_TIMELINE_CAT(a, b) PP_TIMELINE_CAT2(a, b)
// PP_TIMELINE_SPAN(node, lane, "phase"[, bytes]): a span of the enclosing
// scope. `node` and `lane` are evaluated only when the timeline is on;
// "phase" must be a string literal (or outlive the scope).
// PP_TIMELINE_PHASE(node, lane, "phase"[, bytes]): the lane's open phase ends
// and "phase" begins (Recorder::phase); PP_TIMELINE_END(node, lane) ends it.
#define PP_TIMELINE_PHASE(node, lane, ...)                                       \
  (::pushpull::timeline::enabled()                                               \
       ? ::pushpull::timeline::detail::record_phase((node), (lane), __VA_ARGS__) \
       : void())
#define PP_TIMELINE_END(node, lane)                                                           \
  (::pushpull::timeline::enabled() ? ::pushpull::timeline::detail::record_end((node), (lane)) \
                                   : void())
// PP_TIMELINE_ASYNC_BEGIN(node, "name", id, key, bytes) / _END(node, id):
// an operation that overlaps others of its node (Recorder::async_begin).
#define PP_TIMELINE_ASYNC_BEGIN(node, name, id, key, bytes)                                     \
  (::pushpull::timeline::enabled()                                                              \
       ? ::pushpull::timeline::detail::record_async_begin((node), (name), (id), (key), (bytes)) \
       : void())
#define PP_TIMELINE_ASYNC_END(node, id)                                                           \
  (::pushpull::timeline::enabled() ? ::pushpull::timeline::detail::record_async_end((node), (id)) \
                                   : void())
#define PP_TIMELINE_SPAN(node, lane, ...)                                   \
  ::pushpull::timeline::Span PP_TIMELINE_CAT(pp_timeline_span_, __LINE__) = \
      ::pushpull::timeline::enabled()                                       \
          ? ::pushpull::timeline::Span::on((node), (lane), __VA_ARGS__)     \
          : ::pushpull::timeline::Span::off()
