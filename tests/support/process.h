// SPDX-License-Identifier: Apache-2.0
// ChildProcess: runs a program as a child for multi-process tests, with its
// stdout+stderr captured to a temporary file, and guaranteed cleanup: the
// destructor SIGKILLs the child (only this PID, never by name) if it is
// still running and reaps it, so a failing test leaves nothing behind.
//
// Thread safety: one thread per object.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pushpull::test {

class ChildProcess {
 public:
  // Starts `argv[0]` (a path) with `argv` and the current environment plus `env`.
  ChildProcess(std::vector<std::string> argv, std::map<std::string, std::string> env = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Sends `sig` if the child has not been reaped yet.
  void signal(int sig);
  // Waits up to `timeout` for the child to exit. Returns its exit code, or
  // 128+signal when killed by a signal; nullopt when still running.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  bool running();
  // Everything the child wrote so far.
  std::string output() const;

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::string log_path_;
};

}  // namespace pushpull::test
