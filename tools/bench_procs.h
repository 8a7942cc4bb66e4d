// SPDX-License-Identifier: Apache-2.0
// Child processes for multi-process benchmarks (`pushpull bench allreduce`):
// a group of programs started together, the first one's stdout captured, all
// reaped before the group is destroyed.
//
// Ownership: a ProcessGroup owns the PIDs it started; run() waits for them up
// to a deadline and then SIGKILLs only those PIDs (never anything else), so a
// hung peer cannot hang the benchmark. The destructor kills and reaps any
// child still running (e.g. when an exception unwinds).
// Thread safety: none (one thread uses a group).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace pushpull::cli {

class ProcessGroup {
 public:
  ProcessGroup() = default;
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts argv[0] (a path, or a name looked up in PATH) with `argv`. The first program started has
  // its stdout captured; the others' stdout goes to /dev/null. stderr is inherited. Throws IoError
  // when the program cannot be started.
  void start(const std::vector<std::string>& argv);

  struct Result {
    bool ok = false;      // every child exited with status 0 before the deadline
    std::string output;   // the first child's stdout
    std::string failure;  // what went wrong, when !ok
  };
  // Reads the captured output and reaps every child, killing all of them at
  // `timeout` or as soon as one fails.
  Result run(std::chrono::milliseconds timeout);

 private:
  void kill_all();
  std::vector<pid_t> pids_;
  std::vector<std::string> names_;
  int out_fd_ = -1;
};

// A fresh empty directory under $TMPDIR or /tmp (removed with its files by
// the destructor); for Gloo's FileStore and the pushpull workers' rendezvous.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Directory of the running executable (/proc/self/exe), where the peer
// drivers are built.
std::string self_dir();
std::string self_exe();

}  // namespace pushpull::cli
