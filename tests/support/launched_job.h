// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the tests that run whole jobs through `pushpull launch`
// (tests/e2e): where the built programs are, a scratch directory removed on
// every exit path, the "rank pid" files the wrapper commands append to, and
// the closed-form workers' progress lines.
//
// Thread safety: none needed (plain functions; one TempDir per test).
#pragma once

#include <stdlib.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "support/process.h"

namespace pushpull::test {

// A program built into the build tree's bin/ (PUSHPULL_BIN_DIR).
inline std::string bin(const std::string& name) {
  return std::string(PUSHPULL_BIN_DIR) + "/" + name;
}

// The command line of `pushpull launch -n <workers> -s 0` whose workers are
// the running test binary itself, given `worker_args` (a flag its main()
// turns into a worker, then that worker's options).
inline std::vector<std::string> launch_self(int workers,
                                            const std::vector<std::string>& worker_args) {
  std::vector<std::string> argv = {bin("pushpull"),
                                   "launch",
                                   "-n",
                                   std::to_string(workers),
                                   "-s",
                                   "0",
                                   "--timeout",
                                   "120",
                                   "--",
                                   std::filesystem::read_symlink("/proc/self/exe").string()};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

// A fresh directory under the temporary directory, removed with everything
// in it when the test ends, passed or failed.
struct TempDir {
  explicit TempDir(const std::string& prefix = "pp-test") {
    std::string t = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

// The latest pid of each rank in a file of "rank pid" lines (a wrapper
// appends one at every start, so a restarted rank's last line wins).
inline std::map<int, int> read_rank_pids(const std::string& file) {
  std::ifstream in(file);
  std::map<int, int> pids;
  for (int r, p; in >> r >> p;)
    pids[r] = p;
  return pids;
}

// Random kill points per fault test: PUSHPULL_FAILOVER_TRIALS, default 2
// (the `failover-long` target runs 20).
inline int failover_trials() {
  const char* t = std::getenv("PUSHPULL_FAILOVER_TRIALS");
  return t ? std::max(1, std::atoi(t)) : 2;
}

// The last "ROUND n" a closed-form worker printed (0 before the first).
inline int last_round(const std::string& out) {
  auto at = out.rfind("ROUND ");
  return at == std::string::npos ? 0 : std::atoi(out.c_str() + at + 6);
}

// Waits until the launcher `proc`'s worker 0 finished round `round`; at the
// deadline stops the launcher (so its whole output, with the report, is
// there) and returns false.
inline bool wait_round(ChildProcess& proc, int round,
                       std::chrono::seconds limit = std::chrono::seconds(60)) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (last_round(proc.output()) >= round) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  proc.signal(SIGTERM);
  proc.wait(std::chrono::seconds(20));
  return false;
}

}  // namespace pushpull::test
