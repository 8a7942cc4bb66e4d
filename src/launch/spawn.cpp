// SPDX-License-Identifier: Apache-2.0
#include "launch/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace pushpull::launch {

// argv[0] resolved against PATH from the child's environment, in the parent,
// so the forked child only calls async-signal-safe functions.
namespace {

std::string resolve(const std::string& prog, const std::vector<std::string>& env) {
  if (prog.find('/') != std::string::npos) return prog;
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& kv : env)
    if (kv.starts_with("PATH=")) path = kv.substr(5);
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string full = (dir.empty() ? "." : dir) + "/" + prog;
    struct stat st;
    if (stat(full.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(full.c_str(), X_OK) == 0)
      return full;
    start = end + 1;
  }
  return prog;  // execve reports ENOENT
}

}  // namespace

Status spawn_child(const ChildSpec& s, Spawned* c) {
  if (s.argv.empty()) return {ErrorCode::kInvalidArgument, "empty command"};
  int out[2], err[2], in[2] = {-1, -1}, status[2];
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(status, O_CLOEXEC))
    return {ErrorCode::kIoError, fmt::format("pipe: {}", std::strerror(errno))};
  Fd out_r(out[0]), out_w(out[1]), err_r(err[0]), err_w(err[1]), st_r(status[0]), st_w(status[1]);
  if (s.stop_by_closing_stdin) {
    if (pipe2(in, O_CLOEXEC))
      return {ErrorCode::kIoError, fmt::format("pipe: {}", std::strerror(errno))};
  } else {
    in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  Fd in_r(in[0]), in_w(in[1]);
  std::string path = resolve(s.argv[0], s.env);
  std::vector<char*> argv, envp;
  for (const auto& a : s.argv)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : s.env)
    envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const char* dir = s.workdir.empty() ? nullptr : s.workdir.c_str();
  pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) return {ErrorCode::kIoError, fmt::format("fork: {}", std::strerror(errno))};
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the launcher died before prctl
    dup2(in_r.get(), 0);
    dup2(out_w.get(), 1);
    dup2(err_w.get(), 2);
    // The one descriptor this child inherits (its copy only: the launcher's
    // stays close-on-exec).
    if (s.pass_fd > 2) fcntl(s.pass_fd, F_SETFD, 0);
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD})
      signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int e = 0;
    if (dir && chdir(dir) != 0) {
      e = errno;
    } else {
      execve(path.c_str(), argv.data(), envp.data());
      e = errno;
    }
    (void)!write(st_w.get(), &e, sizeof e);
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so kill(-pid) works before the child ran
  st_w.reset();
  int e = 0;
  ssize_t n;
  do
    n = read(st_r.get(), &e, sizeof e);
  while (n < 0 && errno == EINTR);
  if (n == sizeof e) {
    waitpid(pid, nullptr, 0);
    return {ErrorCode::kIoError,
            dir && e != ENOENT ? fmt::format("cannot run {} in {}: {}", path, dir, std::strerror(e))
                               : fmt::format("cannot run {}: {}", path, std::strerror(e))};
  }
  if (in_w.get() >= 0) {
    // Small (credentials): the pipe holds it whether or not the child reads yet.
    std::string_view data = s.stdin_data;
    while (!data.empty()) {
      ssize_t w = write(in_w.get(), data.data(), data.size());
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;  // it died already: its exit status will tell
      data.remove_prefix(size_t(w));
    }
  }
  c->pid = pid;
  c->stdin_w = std::move(in_w);
  c->out_r = std::move(out_r);
  c->err_r = std::move(err_r);
  fcntl(c->out_r.get(), F_SETFL, O_NONBLOCK);
  fcntl(c->err_r.get(), F_SETFL, O_NONBLOCK);
  return {};
}

}  // namespace pushpull::launch
