// SPDX-License-Identifier: Apache-2.0
// The flight recorder (see flight_recorder.h).
#include "base/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/private_file.h"
#include "pushpull/error.h"
#include "pushpull/log.h"
#include "pushpull/options.h"

namespace pushpull::flight {
namespace {

int64_t now_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Slot {
  std::atomic<bool> busy{false};
  uint64_t id = 0;  // 0: empty
  std::string_view kind;
  char name[kNameBytes] = {};
  int64_t bytes = -1;
  State state = State::kQueued;
  int64_t queued_us = 0, started_us = 0, ended_us = 0;
};

class SlotLock {
 public:
  explicit SlotLock(Slot& s) noexcept : s_(s) {
    while (s_.busy.exchange(true, std::memory_order_acquire))
      std::this_thread::yield();
  }
  ~SlotLock() { s_.busy.store(false, std::memory_order_release); }
  SlotLock(const SlotLock&) = delete;
  SlotLock& operator=(const SlotLock&) = delete;

 private:
  Slot& s_;
};

struct Ring {
  Ring(int size, std::string d, std::string t)
      : slots(static_cast<size_t>(size)), dir(std::move(d)), tag(std::move(t)) {}
  std::vector<Slot> slots;
  std::atomic<uint64_t> next{0};
  std::string dir, tag;
  std::mutex dump_mu;  // one dump at a time
  std::chrono::steady_clock::time_point last_dump{};
};

std::atomic<int> g_state{0};  // 0 undecided, 1 off, 2 on
std::atomic<Ring*> g_ring{nullptr};
std::mutex g_start_mu;
int g_pipe[2] = {-1, -1};

std::vector<std::unique_ptr<Ring>>& retired() {  // replaced rings stay alive until exit
  static auto* v = new std::vector<std::unique_ptr<Ring>>();
  return *v;
}

void on_sigusr1(int) {
  const int saved = errno;
  const char c = 1;
  [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &c, 1);
  errno = saved;
}

// SIGUSR1 → the pipe → this thread → dump(). Only when nobody else owns the signal.
void install_sigusr1() {
  struct sigaction old {};
  if (::sigaction(SIGUSR1, nullptr, &old) != 0 || old.sa_handler != SIG_DFL ||
      (old.sa_flags & SA_SIGINFO) != 0)
    return;
  if (::pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return;
  std::thread([] {
    for (;;) {
      pollfd p{g_pipe[0], POLLIN, 0};
      if (::poll(&p, 1, 1000) <= 0) continue;  // 1 s tick; nothing to stop: lives until exit
      char buf[64];
      while (::read(g_pipe[0], buf, sizeof buf) > 0) {
      }
      dump("SIGUSR1");
    }
  }).detach();
  struct sigaction sa {};
  sa.sa_handler = on_sigusr1;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
}

void json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

std::string ms_or_null(int64_t us) {
  return us == 0 ? std::string("null") : fmt::format("{:.3f}", us / 1000.0);
}

}  // namespace

std::string_view state_name(State s) {
  switch (s) {
    case State::kQueued:
      return "queued";
    case State::kStarted:
      return "started";
    case State::kDone:
      return "done";
    case State::kFailed:
      return "failed";
  }
  return "unknown";
}

void start(int size, std::string dir, std::string tag) {
  std::lock_guard lock(g_start_mu);
  std::unique_ptr<Ring> ring;
  if (size > 0) ring = std::make_unique<Ring>(size, std::move(dir), std::move(tag));
  Ring* r = ring.get();
  // Ids go on from the replaced ring's: an update() of an operation recorded
  // there never lands on a new operation here.
  if (Ring* old = g_ring.load(std::memory_order_acquire); old && r)
    r->next.store(old->next.load(std::memory_order_relaxed), std::memory_order_relaxed);
  if (ring) retired().push_back(std::move(ring));
  g_ring.store(r, std::memory_order_release);
  g_state.store(r ? 2 : 1, std::memory_order_release);
}

void start_from_env() noexcept {
  if (g_state.load(std::memory_order_acquire) != 0) return;
  static std::once_flag once;
  std::call_once(once, [] {
    ObserveOptions o;
    try {
      o = ObserveOptions::from_env();
    } catch (const Error& e) {
      PP_WARN("{}; no flight recorder for this process", e.what());
      g_state.store(1, std::memory_order_release);
      return;
    }
    std::string tag = o.role == "process" ? "pid" : o.role;
    tag += std::to_string(o.rank >= 0 && o.role != "process" ? o.rank : ::getpid());
    try {
      start(o.flight_recorder_size, o.flight_recorder_dir, tag);
      if (o.flight_recorder_size > 0) install_sigusr1();
    } catch (const std::exception& e) {
      PP_WARN("flight recorder: {}; off for this process", e.what());
      g_state.store(1, std::memory_order_release);
    }
  });
}

uint64_t record(std::string_view kind, std::string_view name, int64_t bytes, State state) noexcept {
  if (g_state.load(std::memory_order_relaxed) != 2) {
    if (g_state.load(std::memory_order_acquire) != 0) return 0;
    start_from_env();
  }
  Ring* r = g_ring.load(std::memory_order_acquire);
  if (r == nullptr) return 0;
  const uint64_t seq = r->next.fetch_add(1, std::memory_order_relaxed);
  Slot& s = r->slots[seq % r->slots.size()];
  const int64_t t = now_us();
  SlotLock lock(s);
  s.id = seq + 1;
  s.kind = kind;
  const size_t n = std::min(name.size(), kNameBytes - 1);
  std::memcpy(s.name, name.data(), n);
  s.name[n] = '\0';
  s.bytes = bytes;
  s.state = state;
  s.queued_us = t;
  s.started_us = state == State::kQueued ? 0 : t;
  s.ended_us = state == State::kDone || state == State::kFailed ? t : 0;
  return seq + 1;
}

void update(uint64_t id, State state) noexcept {
  if (id == 0) return;
  Ring* r = g_ring.load(std::memory_order_acquire);
  if (r == nullptr) return;
  Slot& s = r->slots[(id - 1) % r->slots.size()];
  const int64_t t = now_us();
  SlotLock lock(s);
  if (s.id != id) return;  // reused by a newer operation
  s.state = state;
  if (state == State::kStarted) s.started_us = t;
  if (state == State::kDone || state == State::kFailed) s.ended_us = t;
}

std::string to_json(std::string_view reason) {
  Ring* r = g_ring.load(std::memory_order_acquire);
  const int64_t now = now_us();
  std::string out = "{\"process\":";
  json_string(out, r ? r->tag : "");
  fmt::format_to(std::back_inserter(out), ",\"pid\":{},\"reason\":", ::getpid());
  json_string(out, reason);
  fmt::format_to(std::back_inserter(out), ",\"dumped_unix_ms\":{:.3f},\"operations\":[",
                 now / 1000.0);
  if (r != nullptr) {
    const uint64_t end = r->next.load(std::memory_order_acquire);
    const uint64_t size = r->slots.size();
    bool first = true;
    for (uint64_t seq = end > size ? end - size : 0; seq < end; ++seq) {
      Slot& s = r->slots[seq % size];
      std::string name;
      std::string_view kind;
      int64_t bytes, q, st, e;
      State state;
      {
        SlotLock lock(s);
        if (s.id != seq + 1) continue;  // not written yet, or already reused
        name = s.name;
        kind = s.kind;
        bytes = s.bytes;
        state = s.state;
        q = s.queued_us, st = s.started_us, e = s.ended_us;
      }
      out += first ? "\n" : ",\n";
      first = false;
      fmt::format_to(std::back_inserter(out), "{{\"seq\":{},\"kind\":", seq);
      json_string(out, kind);
      out += ",\"name\":";
      json_string(out, name);
      fmt::format_to(std::back_inserter(out),
                     ",\"bytes\":{},\"state\":\"{}\",\"queued_unix_ms\":{},\"started_unix_ms\":{},"
                     "\"ended_unix_ms\":{},\"age_ms\":{:.3f}}}",
                     bytes, state_name(state), ms_or_null(q), ms_or_null(st), ms_or_null(e),
                     (now - q) / 1000.0);
    }
  }
  out += "\n]}\n";
  return out;
}

std::string dump_path() {
  Ring* r = g_ring.load(std::memory_order_acquire);
  if (r == nullptr) return {};
  return fmt::format("{}{}pushpull-flight.{}.json", r->dir, r->dir.empty() ? "" : "/", r->tag);
}

std::string dump(std::string_view reason) noexcept {
  start_from_env();
  Ring* r = g_ring.load(std::memory_order_acquire);
  if (r == nullptr) return {};
  try {
    std::unique_lock lock(r->dump_mu, std::try_to_lock);
    if (!lock.owns_lock()) return {};  // another thread is dumping right now
    const auto now = std::chrono::steady_clock::now();
    if (reason != "SIGUSR1") {  // a failure cascade writes one file; SIGUSR1 always does
      if (r->last_dump.time_since_epoch().count() != 0 &&
          now - r->last_dump < std::chrono::seconds(1))
        return {};
      r->last_dump = now;
    }
    const std::string path = dump_path();
    base::write_private_file(path, to_json(reason), "flight recorder dump", /*durable=*/false);
    PP_WARN("flight recorder: wrote its last operations (up to {}) to {} ({})", r->slots.size(),
            path, reason);
    return path;
  } catch (const std::exception& e) {
    PP_WARN("flight recorder: no dump: {}", e.what());
    return {};
  }
}

}  // namespace pushpull::flight
