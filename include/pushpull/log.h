// SPDX-License-Identifier: Apache-2.0
// Logging: one line per event on stderr,
//   "[pushpull I 12:00:00.123 worker 3] message"
// with a level letter (E W I D T) and the node's role and rank once the
// calling thread belongs to a node (set with ScopedLogContext by each node's
// threads, so nodes running as threads in one process are told apart).
//
// The level is process-wide (set once from Options::log_level, or by tests);
// each line is written with one write() call so lines from several threads or
// processes never interleave mid-line.
//
// Thread safety: all functions are safe to call from any thread.
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace pushpull {

enum class LogLevel : int { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

// Parses "error", "warning"/"warn", "info", "debug", "trace" or a digit 0-4.
bool parse_log_level(std::string_view text, LogLevel* out);
void set_log_level(LogLevel level);
LogLevel log_level();
inline bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= static_cast<int>(log_level());
}

// Writes one line at `level` (no check of the level: use the macros).
void log_line(LogLevel level, std::string_view message);

// Sets the calling thread's node label (e.g. "worker 3") for its lifetime and
// restores the previous one on destruction.
class ScopedLogContext {
 public:
  explicit ScopedLogContext(std::string label);
  ~ScopedLogContext();
  ScopedLogContext(const ScopedLogContext&) = delete;
  ScopedLogContext& operator=(const ScopedLogContext&) = delete;

 private:
  std::string previous_;
};
// The calling thread's node label ("" when none).
const std::string& log_context();

}  // namespace pushpull

#define PP_LOG(level, ...)                                                                       \
  do {                                                                                           \
    if (::pushpull::log_enabled(level)) ::pushpull::log_line(level, ::fmt::format(__VA_ARGS__)); \
  } while (0)
#define PP_ERROR(...) PP_LOG(::pushpull::LogLevel::kError, __VA_ARGS__)
#define PP_WARN(...) PP_LOG(::pushpull::LogLevel::kWarning, __VA_ARGS__)
#define PP_INFO(...) PP_LOG(::pushpull::LogLevel::kInfo, __VA_ARGS__)
#define PP_DEBUG(...) PP_LOG(::pushpull::LogLevel::kDebug, __VA_ARGS__)
#define PP_TRACE(...) PP_LOG(::pushpull::LogLevel::kTrace, __VA_ARGS__)
