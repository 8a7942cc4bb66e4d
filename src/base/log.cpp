// SPDX-License-Identifier: Apache-2.0
#include "pushpull/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>

namespace pushpull {
namespace {
// The one piece of process-wide state in the library: where and how much to
// log is a property of the process (its stderr), not of a node.
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
thread_local std::string t_context;
}  // namespace

bool parse_log_level(std::string_view t, LogLevel* out) {
  if (t == "error" || t == "ERROR" || t == "0")
    *out = LogLevel::kError;
  else if (t == "warning" || t == "warn" || t == "WARNING" || t == "1")
    *out = LogLevel::kWarning;
  else if (t == "info" || t == "INFO" || t == "2")
    *out = LogLevel::kInfo;
  else if (t == "debug" || t == "DEBUG" || t == "3")
    *out = LogLevel::kDebug;
  else if (t == "trace" || t == "TRACE" || t == "4")
    *out = LogLevel::kTrace;
  else
    return false;
  return true;
}

void set_log_level(LogLevel level) {
  g_level.store(static_cast<int>(level));
}
LogLevel log_level() {
  return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed));
}

void log_line(LogLevel level, std::string_view message) {
  static constexpr char kLetters[] = "EWIDT";
  auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&secs, &tm);
  std::string line =
      fmt::format("[pushpull {} {:02}:{:02}:{:02}.{:03}{}{}] ", kLetters[static_cast<int>(level)],
                  tm.tm_hour, tm.tm_min, tm.tm_sec, ms, t_context.empty() ? "" : " ", t_context);
  line.append(message);
  if (line.empty() || line.back() != '\n') line.push_back('\n');
  // One write() per line: atomic for pipes up to PIPE_BUF, and never split by
  // another thread's buffered output.
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

ScopedLogContext::ScopedLogContext(std::string label) : previous_(std::move(t_context)) {
  t_context = std::move(label);
}
ScopedLogContext::~ScopedLogContext() {
  t_context = std::move(previous_);
}
const std::string& log_context() {
  return t_context;
}

}  // namespace pushpull
