// SPDX-License-Identifier: Apache-2.0
// The blocking helpers of net/tls.h (the connectors' side): poll() on the
// link's socket between non-blocking steps, bounded by a deadline.
#include <poll.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "net/tls.h"

namespace pushpull::net {
namespace {

bool wait_fd(int fd, short events, std::chrono::steady_clock::time_point deadline,
             std::string* error) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now())
                  .count();
  if (left <= 0) {
    *error = "timed out";
    return false;
  }
  pollfd p{fd, events, 0};
  int n = ::poll(&p, 1, static_cast<int>(left));
  if (n < 0 && errno != EINTR) {
    *error = std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace

bool tls_handshake(TlsLink& link, std::chrono::steady_clock::time_point deadline,
                   std::string* error) {
  while (true) {
    auto step = link.handshake();
    if (step == TlsLink::Step::kFailed) {
      *error = link.error();
      return false;
    }
    const bool pending = link.output_pending();
    if (step == TlsLink::Step::kDone && !pending) return true;
    if (pending && link.flush() < 0) {
      *error = fmt::format("send failed: {}", std::strerror(errno));
      return false;
    }
    if (step == TlsLink::Step::kDone && !link.output_pending()) return true;
    if (!wait_fd(link.fd(), link.output_pending() ? POLLOUT : POLLIN, deadline, error)) {
      *error = fmt::format("TLS handshake: {}", *error);
      return false;
    }
  }
}

bool tls_write_all(TlsLink& link, const void* data, size_t n,
                   std::chrono::steady_clock::time_point deadline, std::string* error) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0 || link.output_pending()) {
    ssize_t w = n > 0 ? link.send(p, n) : link.flush();
    if (w < 0 && errno != EAGAIN && errno != EINTR) {
      *error = link.error().empty() ? std::strerror(errno) : link.error();
      return false;
    }
    if (n > 0 && w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (n == 0 && w == 1) break;
    if (!wait_fd(link.fd(), POLLOUT, deadline, error)) return false;
  }
  return true;
}

bool tls_read_all(TlsLink& link, void* data, size_t n,
                  std::chrono::steady_clock::time_point deadline, std::string* error) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = link.recv(p, n);
    if (r == 0) {
      *error = "connection closed by the peer";
      return false;
    }
    if (r < 0) {
      if (errno != EAGAIN && errno != EINTR) {
        *error = link.error().empty() ? std::strerror(errno) : link.error();
        return false;
      }
      if (!wait_fd(link.fd(), POLLIN, deadline, error)) return false;
      continue;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace pushpull::net
