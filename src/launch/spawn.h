// SPDX-License-Identifier: Apache-2.0
// Starting one child process for the supervisor: fork + execve with its own
// process group, PR_SET_PDEATHSIG(SIGKILL), pipes for stdout and stderr and
// (for ssh clients) stdin, all other fds closed on exec.
//
// Thread safety: spawn_child may be called from any thread, but the death
// signal is tied to the calling thread (see supervisor.h).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>

#include "launch/supervisor.h"
#include "pushpull/error.h"

namespace pushpull::launch {

// Owns one file descriptor; closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(o.release());
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

struct Spawned {
  pid_t pid = -1;
  Fd stdin_w;  // write end of the child's stdin (stop_by_closing_stdin), else empty
  Fd out_r;    // non-blocking read ends of its stdout and stderr
  Fd err_r;
};

// Starts `spec` (argv[0] searched in the child's PATH) and fills `out`, or
// returns why it could not start (IoError; InvalidArgument for an empty
// command): an exec failure is reported through a close-on-exec pipe, so a
// missing program is known before this returns.
Status spawn_child(const ChildSpec& spec, Spawned* out);

}  // namespace pushpull::launch
