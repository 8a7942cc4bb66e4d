// SPDX-License-Identifier: Apache-2.0
#include "launch/guardian.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::launch {
namespace {

// The guardian's whole life (async-signal-safe calls only: it was forked
// from a process that may run other threads).
[[noreturn]] void guard(int in, pid_t* groups, size_t capacity) {
  setsid();
  int null = open("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
  }
  if (in != 3) {
    dup2(in, 3);
    in = 3;
  }
  syscall(SYS_close_range, 4u, ~0u, 0u);
  size_t count = 0;
  int32_t buf[256];
  while (true) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the launcher is gone
    for (size_t i = 0; i < size_t(n) / sizeof buf[0]; ++i) {
      if (buf[i] == 0) _exit(0);  // done: the launcher cleaned up itself
      if (count < capacity) groups[count++] = buf[i];
    }
  }
  for (size_t i = 0; i < count; ++i)
    kill(-groups[i], SIGKILL);
  _exit(0);
}

void send(int fd, int32_t value) {
  ssize_t n;
  do
    n = write(fd, &value, sizeof value);
  while (n < 0 && errno == EINTR);
}

}  // namespace

Guardian::Guardian(size_t max_groups) : max_groups_(max_groups) {
  std::vector<pid_t> groups(max_groups + 1);  // filled in by the guardian only
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0)
    throw IoError(fmt::format("cannot start the guardian: pipe: {}", std::strerror(errno)));
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(p[0]);
    close(p[1]);
    throw IoError(fmt::format("cannot start the guardian: fork: {}", std::strerror(err)));
  }
  if (pid == 0) {
    close(p[1]);
    guard(p[0], groups.data(), groups.size());
  }
  close(p[0]);
  fd_ = p[1];
  pid_ = pid;
}

Guardian::~Guardian() {
  send(fd_, 0);
  close(fd_);
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void Guardian::watch(pid_t pgid) {
  if (pgid <= 0 || watched_ >= max_groups_) return;
  ++watched_;
  send(fd_, int32_t(pgid));
}

}  // namespace pushpull::launch
