// SPDX-License-Identifier: Apache-2.0
// The timeline's streaming Chrome-trace writer (see timeline.h).
#include "base/timeline.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "base/clock_sync.h"
#include "base/private_file.h"
#include "pushpull/error.h"
#include "pushpull/log.h"
#include "pushpull/options.h"
#include "pushpull/timeline.h"

namespace pushpull::timeline {
namespace {

// Written out when the buffer grows past this (bounded memory per process).
constexpr size_t kFlushBytes = 1 << 20;

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20)
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
        else
          out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

// Microseconds on the steady clock (CLOCK_MONOTONIC: the same in every
// process of a host, so per-process files line up when merged).
double micros(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

}  // namespace

Recorder::Recorder(const std::string& path) : path_(path) {
  // O_NOFOLLOW, 0600, never another user's file (base/private_file.h):
  // trace names are predictable and often in /tmp.
  file_ = base::fopen_private(path, "timeline");
  std::fputs("[\n", file_);
  buffer_.reserve(kFlushBytes + 4096);
}

Recorder::~Recorder() {
  close();
}

void Recorder::append_event(std::string_view json) {
  if (!first_) buffer_ += ",\n";
  first_ = false;
  buffer_ += json;
  if (buffer_.size() >= kFlushBytes && file_ != nullptr) {
    std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
    buffer_.clear();
  }
}

int Recorder::node_id(std::string_view node) {
  auto it = nodes_.find(node);
  if (it != nodes_.end()) return it->second;
  const int id = static_cast<int>(nodes_.size()) + 1;
  nodes_.emplace(std::string(node), id);
  std::string ev = fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":)", id);
  append_json_string(ev, node);
  ev += "}}";
  append_event(ev);
  append_event(fmt::format(
      R"({{"name":"process_sort_index","ph":"M","pid":{},"args":{{"sort_index":{}}}}})", id, id));
  return id;
}

int Recorder::lane_id(int pid, std::string_view lane) {
  auto& lanes = lanes_[pid];
  auto it = lanes.find(lane);
  if (it != lanes.end()) return it->second;
  const int id = static_cast<int>(lanes.size()) + 1;
  lanes.emplace(std::string(lane), id);
  std::string ev =
      fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":)", pid, id);
  append_json_string(ev, lane);
  ev += "}}";
  append_event(ev);
  return id;
}

void Recorder::append_span(int pid, int tid, std::string_view name, Clock::time_point begin,
                           Clock::time_point end, int64_t bytes) {
  std::string ev = R"({"name":)";
  append_json_string(ev, name);
  const double dur =
      end > begin ? std::chrono::duration<double, std::micro>(end - begin).count() : 0.0;
  fmt::format_to(std::back_inserter(ev),
                 R"(,"cat":"pushpull","ph":"X","ts":{:.3f},"dur":{:.3f},"pid":{},"tid":{})",
                 micros(begin), dur, pid, tid);
  if (bytes >= 0) fmt::format_to(std::back_inserter(ev), R"(,"args":{{"bytes":{}}})", bytes);
  ev += "}";
  append_event(ev);
}

void Recorder::span(std::string_view node, std::string_view lane, std::string_view name,
                    Clock::time_point begin, Clock::time_point end, int64_t bytes) {
  std::lock_guard lock(mu_);
  if (file_ == nullptr) return;
  const int pid = node_id(node);
  append_span(pid, lane_id(pid, lane), name, begin, end, bytes);
}

void Recorder::phase(std::string_view node, std::string_view lane, std::string_view name,
                     Clock::time_point at, int64_t bytes) {
  std::lock_guard lock(mu_);
  if (file_ == nullptr) return;
  const int pid = node_id(node);
  const int tid = lane_id(pid, lane);
  auto [it, fresh] = open_.try_emplace({pid, tid});
  if (!fresh) append_span(pid, tid, it->second.name, it->second.begin, at, it->second.bytes);
  it->second = Open{std::string(name), at, bytes};
}

void Recorder::end(std::string_view node, std::string_view lane, Clock::time_point at) {
  std::lock_guard lock(mu_);
  if (file_ == nullptr) return;
  const int pid = node_id(node);
  const int tid = lane_id(pid, lane);
  auto it = open_.find({pid, tid});
  if (it == open_.end()) return;
  append_span(pid, tid, it->second.name, it->second.begin, at, it->second.bytes);
  open_.erase(it);
}

void Recorder::async_begin(std::string_view node, std::string_view name, uint64_t id, int64_t key,
                           int64_t bytes, Clock::time_point at) {
  std::string ev = R"({"name":)";
  append_json_string(ev, name);
  std::lock_guard lock(mu_);
  if (file_ == nullptr) return;
  const int pid = node_id(node);
  fmt::format_to(std::back_inserter(ev),
                 R"(,"cat":"pushpull","ph":"b","id2":{{"local":"{:#x}"}},"ts":{:.3f},"pid":{},)"
                 R"("tid":0,"args":{{"key":{})",
                 id, micros(at), pid, key);
  if (bytes >= 0) fmt::format_to(std::back_inserter(ev), R"(,"bytes":{})", bytes);
  ev += "}}";
  open_async_[{pid, id}] = std::string(name);
  append_event(ev);
}

void Recorder::async_end(std::string_view node, uint64_t id, Clock::time_point at) {
  std::lock_guard lock(mu_);
  if (file_ == nullptr) return;
  const int pid = node_id(node);
  auto it = open_async_.find({pid, id});
  if (it == open_async_.end()) return;
  append_async_end(pid, id, it->second, at);
  open_async_.erase(it);
}

void Recorder::append_async_end(int pid, uint64_t id, std::string_view name, Clock::time_point at) {
  std::string ev = R"({"name":)";
  append_json_string(ev, name);
  fmt::format_to(std::back_inserter(ev),
                 R"(,"cat":"pushpull","ph":"e","id2":{{"local":"{:#x}"}},"ts":{:.3f},"pid":{},)"
                 R"("tid":0}})",
                 id, micros(at), pid);
  append_event(ev);
}

void Recorder::clock_offset(int64_t offset_ns, int64_t rtt_ns, int samples) {
  std::lock_guard lock(mu_);
  if (file_ == nullptr) return;
  append_event(fmt::format(
      R"({{"name":"pushpull_clock_offset","ph":"M","pid":0,"tid":0,"args":{{"offset_us":{:.3f},)"
      R"("rtt_us":{:.3f},"samples":{}}}}})",
      offset_ns / 1000.0, rtt_ns / 1000.0, samples));
}

void Recorder::instant(std::string_view node, std::string_view lane, std::string_view name,
                       Clock::time_point at) {
  std::string ev = R"({"name":)";
  append_json_string(ev, name);
  std::lock_guard lock(mu_);
  if (file_ == nullptr) return;
  const int pid = node_id(node);
  const int tid = lane_id(pid, lane);
  fmt::format_to(std::back_inserter(ev),
                 R"(,"cat":"pushpull","ph":"i","s":"t","ts":{:.3f},"pid":{},"tid":{}}})",
                 micros(at), pid, tid);
  append_event(ev);
}

void Recorder::flush() {
  std::lock_guard lock(mu_);
  if (file_ == nullptr) return;
  std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
  buffer_.clear();
  std::fflush(file_);
}

void Recorder::close() {
  std::lock_guard lock(mu_);
  if (file_ == nullptr) return;
  // Phases still open (an op in flight at exit) end now, so they show.
  const auto now = Clock::now();
  for (const auto& [ids, open] : open_)
    append_span(ids.first, ids.second, open.name, open.begin, now, open.bytes);
  open_.clear();
  for (const auto& [ids, name] : open_async_)
    append_async_end(ids.first, ids.second, name, now);
  open_async_.clear();
  std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
  buffer_.clear();
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

// ---- the process-wide timeline ----

namespace {

std::mutex g_mu;  // start/shutdown
std::atomic<Recorder*> g_recorder{nullptr};
// Recorders replaced by start() stay alive (closed) until exit: a thread may
// still hold a pointer to one while recording its last event.
std::vector<std::unique_ptr<Recorder>>& retired() {
  static auto* v = new std::vector<std::unique_ptr<Recorder>>();
  return *v;
}

void flush_at_exit() {
  shutdown();
}

struct Identity {
  std::string role;  // the named role, "rank" (only a rank is known) or "pid"
  int rank;          // the rank, else the process id
};

// Options::from_env's ObserveOptions (the only reader of the environment);
// a setting it rejects (say a PUSHPULL_METRICS_PORT that is not a number)
// throws, and the caller decides whether the timeline goes without.
Identity identity_of(const ObserveOptions& o) {
  Identity id{o.role_named ? o.role : std::string(o.rank >= 0 ? "rank" : "pid"),
              o.rank >= 0 ? o.rank : static_cast<int>(::getpid())};
  return id;
}

}  // namespace

const std::string& process_node() {
  static const std::string name = [] {
    Identity id{"pid", 0};
    try {
      id = identity_of(ObserveOptions::from_env());
    } catch (const Error&) {
      // Named "process", as without any variable; from_env's error is
      // reported by the recorder that needs the setting.
    }
    return id.role == "pid" ? std::string("process") : fmt::format("{} {}", id.role, id.rank);
  }();
  return name;
}

std::string process_file_name(const std::string& base, std::string_view role, int rank) {
  std::string stem = base;
  if (stem.size() > 5 && stem.ends_with(".json")) stem.resize(stem.size() - 5);
  return fmt::format("{}.{}{}.json", stem, role, rank);
}

void start(const std::string& path) {
  auto rec = std::make_unique<Recorder>(path);
  std::lock_guard lock(g_mu);
  static bool registered = false;
  if (!registered) {
    std::atexit(flush_at_exit);
    registered = true;
  }
  Recorder* old = g_recorder.exchange(rec.get());
  retired().push_back(std::move(rec));
  if (old != nullptr) old->close();
  detail::g_state.store(2, std::memory_order_relaxed);
}

void shutdown() {
  std::lock_guard lock(g_mu);
  detail::g_state.store(1, std::memory_order_relaxed);
  if (Recorder* r = g_recorder.load()) r->close();
}

std::string current_path() {
  std::lock_guard lock(g_mu);
  Recorder* r = g_recorder.load();
  return r != nullptr && detail::g_state.load() == 2 ? r->path() : std::string();
}

namespace detail {

bool init_from_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      const ObserveOptions o = ObserveOptions::from_env();
      if (o.timeline.empty()) {
        int expected = 0;
        g_state.compare_exchange_strong(expected, 1);
        return;
      }
      const Identity id = identity_of(o);
      start(process_file_name(o.timeline, id.role, id.rank));
      // Under `pushpull launch`: this host's clock against the launcher's,
      // for the merged file (docs/timeline.md, "One file for the job").
      const std::string& service = o.timeline_clock;
      if (!service.empty()) {
        if (auto offset = base::measure_offset(service))
          g_recorder.load()->clock_offset(offset->offset_ns, offset->rtt_ns, offset->samples);
        else
          PP_WARN(
              "timeline: the launcher's clock service {} did not answer; this file's "
              "times stay unaligned in the merged timeline",
              service);
      }
    } catch (const Error& e) {
      PP_WARN("{}; no timeline for this process", e.what());
      g_state.store(1, std::memory_order_relaxed);
    }
  });
  return g_state.load(std::memory_order_relaxed) == 2;
}

void record_span(std::string_view node, std::string_view lane, std::string_view name,
                 Clock::time_point begin, Clock::time_point end, int64_t bytes) {
  if (Recorder* r = g_recorder.load(std::memory_order_acquire))
    r->span(node, lane, name, begin, end, bytes);
}

void record_phase(std::string_view node, std::string_view lane, std::string_view name,
                  int64_t bytes) {
  if (Recorder* r = g_recorder.load(std::memory_order_acquire))
    r->phase(node, lane, name, Clock::now(), bytes);
}

void record_end(std::string_view node, std::string_view lane) {
  if (Recorder* r = g_recorder.load(std::memory_order_acquire)) r->end(node, lane, Clock::now());
}

void record_async_begin(std::string_view node, std::string_view name, uint64_t id, int64_t key,
                        int64_t bytes) {
  if (Recorder* r = g_recorder.load(std::memory_order_acquire))
    r->async_begin(node, name, id, key, bytes, Clock::now());
}

void record_async_end(std::string_view node, uint64_t id) {
  if (Recorder* r = g_recorder.load(std::memory_order_acquire))
    r->async_end(node, id, Clock::now());
}

}  // namespace detail
}  // namespace pushpull::timeline
