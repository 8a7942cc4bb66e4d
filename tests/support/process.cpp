// SPDX-License-Identifier: Apache-2.0
#include "support/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace pushpull::test {

ChildProcess::ChildProcess(std::vector<std::string> argv, std::map<std::string, std::string> env) {
  char tmpl[] = "/tmp/pushpull-child-XXXXXX";
  int log_fd = mkstemp(tmpl);
  if (log_fd < 0) throw std::runtime_error("mkstemp failed");
  log_path_ = tmpl;
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto name = kv.substr(0, kv.find('='));
    if (!env.count(name)) envs.push_back(kv);
  }
  for (auto& [k, v] : env)
    envs.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (auto& a : argv)
    cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : envs)
    cenv.push_back(e.data());
  cenv.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // Die with the test even if it crashes before its destructors run.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  ::close(log_fd);
}

ChildProcess::~ChildProcess() {
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
  }
  if (!log_path_.empty()) ::unlink(log_path_.c_str());
}

void ChildProcess::signal(int sig) {
  if (!reaped_ && pid_ > 0) ::kill(pid_, sig);
}

std::optional<int> ChildProcess::wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reaped_) {
    pid_t r = waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

bool ChildProcess::running() {
  return !wait(std::chrono::milliseconds(0)).has_value();
}

std::string ChildProcess::output() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace pushpull::test
