// SPDX-License-Identifier: Apache-2.0
// The blocking helpers of transport/tls.h (the connectors' side): poll() on the
// link's socket between non-blocking steps, bounded by a deadline.
#include <poll.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "transport/tls.h"

namespace pushpull::transport {
namespace {

Status wait_fd(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now())
                  .count();
  if (left <= 0) return {ErrorCode::kTimeout, "timed out"};
  pollfd p{fd, events, 0};
  int n = ::poll(&p, 1, static_cast<int>(left));
  if (n < 0 && errno != EINTR) return {ErrorCode::kIoError, std::strerror(errno)};
  return Status::ok();
}

// What libssl or the socket said, for a failed send or receive.
Status link_error(const TlsLink& link) {
  return {ErrorCode::kIoError, link.error().empty() ? std::strerror(errno) : link.error()};
}

}  // namespace

Status tls_handshake(TlsLink& link, std::chrono::steady_clock::time_point deadline) {
  while (true) {
    auto step = link.handshake();
    // Refused (a wrong key, not TLS at all) is the peer's doing: no retry helps.
    if (step == TlsLink::Step::kFailed)
      return {link.refused() ? ErrorCode::kProtocolError : ErrorCode::kIoError,
              link.error().empty() ? std::string("TLS handshake failed") : link.error()};
    const bool pending = link.output_pending();
    if (step == TlsLink::Step::kDone && !pending) return Status::ok();
    if (pending && link.flush() < 0)
      return {ErrorCode::kIoError, fmt::format("send failed: {}", std::strerror(errno))};
    if (step == TlsLink::Step::kDone && !link.output_pending()) return Status::ok();
    if (Status st = wait_fd(link.fd(), link.output_pending() ? POLLOUT : POLLIN, deadline); !st)
      return {st.code(), fmt::format("TLS handshake: {}", st.message())};
  }
}

Status tls_write_all(TlsLink& link, const void* data, size_t n,
                     std::chrono::steady_clock::time_point deadline) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0 || link.output_pending()) {
    ssize_t w = n > 0 ? link.send(p, n) : link.flush();
    if (w < 0 && errno != EAGAIN && errno != EINTR) return link_error(link);
    if (n > 0 && w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (n == 0 && w == 1) break;
    if (Status st = wait_fd(link.fd(), POLLOUT, deadline); !st) return st;
  }
  return Status::ok();
}

Status tls_read_all(TlsLink& link, void* data, size_t n,
                    std::chrono::steady_clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = link.recv(p, n);
    if (r == 0) return {ErrorCode::kIoError, "connection closed by the peer"};
    if (r < 0) {
      if (errno != EAGAIN && errno != EINTR) return link_error(link);
      if (Status st = wait_fd(link.fd(), POLLIN, deadline); !st) return st;
      continue;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::ok();
}

}  // namespace pushpull::transport
