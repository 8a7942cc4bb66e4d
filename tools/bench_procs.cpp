// SPDX-License-Identifier: Apache-2.0
#include "bench_procs.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "launch/launcher.h"
#include "pushpull/error.h"
#include "pushpull/options.h"

extern char** environ;

namespace pushpull::cli {

ProcessGroup::~ProcessGroup() {
  kill_all();
  if (out_fd_ >= 0) ::close(out_fd_);
}

// The benchmark is the launcher of its processes: like `pushpull launch`, it
// gives them one job secret (through the environment only), so pushpull's
// nodes authenticate each other also when they run in network namespaces.
static void ensure_job_secret() {
  static const bool done = [] {
    const auto s = Environment::current().get("PUSHPULL_JOB_SECRET");
    if (!s || s->empty()) ::setenv("PUSHPULL_JOB_SECRET", launch::make_job_secret().c_str(), 1);
    return true;
  }();
  (void)done;
}

void ProcessGroup::start(const std::vector<std::string>& argv) {
  ensure_job_secret();
  int pipe_fds[2] = {-1, -1};
  const bool capture = pids_.empty();
  if (capture && ::pipe2(pipe_fds, O_CLOEXEC) != 0)
    throw IoError(fmt::format("bench: pipe(): {}", std::strerror(errno)));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (capture)
    posix_spawn_file_actions_adddup2(&fa, pipe_fds[1], 1);
  else
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (capture) ::close(pipe_fds[1]);
  if (rc != 0) {
    if (capture) ::close(pipe_fds[0]);
    throw IoError(fmt::format("bench: cannot start {}: {}", argv[0], std::strerror(rc)));
  }
  if (capture) out_fd_ = pipe_fds[0];
  pids_.push_back(pid);
  names_.push_back(argv[0]);
}

ProcessGroup::Result ProcessGroup::run(std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + timeout;
  Result res;
  std::vector<bool> reaped(pids_.size(), false);
  size_t left = pids_.size();
  bool eof = out_fd_ < 0;
  while (left > 0 || !eof) {
    auto now = clock::now();
    if (now >= deadline) {
      res.failure = fmt::format("did not finish within {} s", timeout.count() / 1000);
      break;
    }
    if (!eof) {
      pollfd p{out_fd_, POLLIN, 0};
      int wait_ms = static_cast<int>(std::min<int64_t>(
          50, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count()));
      if (::poll(&p, 1, wait_ms) > 0) {
        char buf[4096];
        ssize_t r = ::read(out_fd_, buf, sizeof buf);
        if (r > 0)
          res.output.append(buf, static_cast<size_t>(r));
        else if (r == 0 || errno != EINTR)
          eof = true;
      }
    } else {
      ::poll(nullptr, 0, 20);  // sleep a little between reaps (no spinning)
    }
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (reaped[i]) continue;
      int status = 0;
      pid_t r = ::waitpid(pids_[i], &status, WNOHANG);
      if (r != pids_[i]) continue;
      reaped[i] = true;
      --left;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && res.failure.empty())
        res.failure =
            WIFEXITED(status)
                ? fmt::format("{} (#{}) exited with status {}", names_[i], i, WEXITSTATUS(status))
                : fmt::format("{} (#{}) died of signal {}", names_[i], i, WTERMSIG(status));
    }
    if (!res.failure.empty()) break;
  }
  for (size_t i = 0; i < pids_.size(); ++i)
    if (reaped[i]) pids_[i] = -1;
  kill_all();
  res.ok = res.failure.empty();
  return res;
}

void ProcessGroup::kill_all() {
  for (pid_t& pid : pids_) {
    if (pid <= 0) continue;
    ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    pid = -1;
  }
}

TempDir::TempDir() {
  const char* base = "/tmp";
  std::string tmpl = std::string(base) + "/pushpull-bench-XXXXXX";
  if (!::mkdtemp(tmpl.data()))
    throw IoError(
        fmt::format("bench: cannot create a directory under {}: {}", base, std::strerror(errno)));
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("pushpull") : p.string();
}

std::string self_dir() {
  return std::filesystem::path(self_exe()).parent_path().string();
}

}  // namespace pushpull::cli
