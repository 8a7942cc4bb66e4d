// SPDX-License-Identifier: Apache-2.0
// Private to the elastic launcher (elastic_driver.cpp, elastic_driver_workers.cpp):
// the Driver that runs an elastic job and the state it keeps per worker and
// host. Not thread-safe: the Driver lives on the launcher's main thread and
// owns its workers, the rendezvous server and the signal guard.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/private_file.h"
#include "collective/elastic_rendezvous.h"
#include "launch/elastic_discovery.h"
#include "launch/elastic_driver.h"
#include "launch/line_splitter.h"
#include "launch/spawn.h"
#include "launch/supervisor.h"

namespace pushpull::launch::elastic_detail {

using Clock = std::chrono::steady_clock;
namespace ce = collective::elastic;

// A worker's log file, opened through base/private_file.h (O_NOFOLLOW,
// created 0600, never another user's file); closed on destruction.
class PrivateLog {
 public:
  explicit PrivateLog(const std::string& path) : f_(base::fopen_private(path, "log file")) {}
  ~PrivateLog() { std::fclose(f_); }
  PrivateLog(const PrivateLog&) = delete;
  PrivateLog& operator=(const PrivateLog&) = delete;
  PrivateLog& operator<<(std::string_view s) {
    std::fwrite(s.data(), 1, s.size(), f_);
    return *this;
  }
  PrivateLog& operator<<(char c) {
    std::fputc(c, f_);
    return *this;
  }

 private:
  std::FILE* f_;
};

struct Worker {
  std::string id;
  std::string host;
  Spawned proc;
  LineSplitter out_lines, err_lines;
  std::unique_ptr<PrivateLog> log;
  bool stopping = false;  // asked to stop by the launcher (not a failure of its own)
  Clock::time_point stop_sent{};
  bool killed = false;
  std::string label() const { return "worker " + id; }
};

struct HostState {
  HostEntry entry;
  int blocked = 0;  // slots whose worker failed and was not replaced
};

inline std::string describe_exit(int status) {
  if (WIFEXITED(status)) return describe_status(true, WEXITSTATUS(status));
  return describe_status(false, WTERMSIG(status));
}
inline int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class Driver {
 public:
  Driver(const LaunchConfig& cfg, const ElasticConfig& ec, const LaunchContext& ctx)
      : cfg_(cfg), ec_(ec), ctx_(ctx) {}

  int run();

 private:
  void update_hosts(const std::vector<HostEntry>& found);
  void spawn_missing();
  void spawn_on(const std::string& host);
  void pump_output(int timeout_ms);
  void reap();
  void on_exit(Worker& w, int status);
  void stop(Worker& w, bool kill_now);
  void stop_all();
  bool check_min_workers();
  int live() const;
  int live_on(const std::string& host) const;
  void emit(Worker& w, bool err, std::string_view line);
  void fail(int code, const std::string& why);

  const LaunchConfig& cfg_;
  const ElasticConfig& ec_;
  const LaunchContext& ctx_;
  std::unique_ptr<SignalGuard> signals_;
  std::unique_ptr<ce::RendezvousServer> server_;
  std::string server_addr_;
  std::map<std::string, HostState> hosts_;  // by host name
  std::vector<std::string> host_order_;     // discovery order
  std::map<pid_t, std::unique_ptr<Worker>> workers_;
  int next_id_ = 0;
  int restarts_used_ = 0;
  bool finishing_ = false;  // a worker exited 0: training is over
  bool failed_after_finish_ = false;
  int successes_ = 0;
  std::string last_failure_;
  int last_failure_code_ = 1;
  std::optional<Clock::time_point> below_min_since_;
  std::optional<int> result_;
  std::string result_reason_;
  int signalled_ = 0;
};

}  // namespace pushpull::launch::elastic_detail
