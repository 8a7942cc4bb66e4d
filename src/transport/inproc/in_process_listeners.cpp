// SPDX-License-Identifier: Apache-2.0
#include "transport/inproc/in_process_listeners.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include <fmt/format.h>

namespace pushpull::transport::in_process {
namespace {

constexpr int kMaxPort = 65535;

struct Registry {
  std::mutex mu;  // held while a callback runs (see remove())
  std::map<int, AcceptFn> listeners;
  int next = 1;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: transports may stop during exit
  return *r;
}

}  // namespace

int add(int port, AcceptFn accept) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (port == 0) {
    // Numbers stay within a TCP port's range: address books carry them as one.
    if (r.listeners.size() >= static_cast<size_t>(kMaxPort))
      throw IoError("no free in-process port left");
    while (r.listeners.count(r.next) != 0)
      r.next = r.next % kMaxPort + 1;
    port = r.next;
    r.next = r.next % kMaxPort + 1;
  } else if (port < 0 || port > kMaxPort) {
    throw InvalidArgument(fmt::format("inproc:{}: ports are 1..{}", port, kMaxPort));
  } else if (r.listeners.count(port) != 0) {
    throw IoError(
        fmt::format("cannot listen on inproc:{}: another transport of this process "
                    "listens there",
                    port));
  }
  r.listeners.emplace(port, std::move(accept));
  return port;
}

void remove(int port) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.listeners.erase(port);
}

Status dial(int port, Fd* out) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.listeners.find(port);
  if (it == r.listeners.end())
    return {ErrorCode::kIoError,
            fmt::format("no transport of this process listens on inproc:{} (the in-process "
                        "medium reaches this process only)",
                        port)};
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    return {ErrorCode::kIoError, std::strerror(errno)};
  Fd mine(fds[0]), theirs(fds[1]);
  set_nonblocking(theirs.get(), true);
  it->second(std::move(theirs));
  *out = std::move(mine);
  return Status::ok();
}

}  // namespace pushpull::transport::in_process
