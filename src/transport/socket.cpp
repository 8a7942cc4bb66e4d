// SPDX-License-Identifier: Apache-2.0
#include "transport/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "pushpull/error.h"
#include "transport/inproc/in_process_listeners.h"

namespace pushpull::transport {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string SockAddr::to_string() const {
  if (family() == AF_UNIX)
    return in_process_port > 0 ? format_address(std::string(kInProcessHost), in_process_port)
                               : std::string(kInProcessHost);
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    return fmt::format("[{}]:{}", buf, ntohs(a->sin6_port));
  }
  auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
  inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
  return fmt::format("{}:{}", buf, ntohs(a->sin_port));
}

int SockAddr::port() const {
  if (family() == AF_UNIX) return in_process_port;
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
}

std::string format_address(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

SockAddr resolve(const std::string& host_in, int port) {
  if (is_in_process_host(host_in)) {
    SockAddr a;
    a.storage.ss_family = AF_UNIX;
    a.len = sizeof(sa_family_t);
    a.in_process_port = port;
    return a;
  }
  std::string host = host_in;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    throw InvalidArgument(
        fmt::format("cannot resolve host '{}': {}; check the address "
                    "(DMLC_PS_ROOT_URI / DMLC_NODE_HOST)",
                    host, gai_strerror(rc)));
  SockAddr a;
  std::memcpy(&a.storage, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  freeaddrinfo(res);
  return a;
}

void set_nonblocking(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

int auto_socket_buffer_bytes(int data_peers) {
  const int share = (256 << 10) / std::max(1, data_peers);
  return std::clamp(share, 32 << 10, kDefaultSocketBufferBytes);
}

void tune_socket(int fd, int buffer_bytes) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (buffer_bytes < 0) buffer_bytes = kDefaultSocketBufferBytes;
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
  }
}

void set_dead_link_timeout(int fd, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return;
  const int one = 1;
  const int probe_s = static_cast<int>(std::max<int64_t>(1, timeout.count() / 4000));
  const int probes = 4;
  const auto user_ms = static_cast<unsigned>(std::min<int64_t>(timeout.count(), INT32_MAX));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &probe_s, sizeof probe_s);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &probe_s, sizeof probe_s);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
}

namespace {
SockAddr bind_address(const std::string& host, int port) {
  // The in-process medium has no socket to bind (an AF_UNIX bind would make
  // an abstract-namespace socket every local user can reach).
  if (is_in_process_host(host))
    throw InvalidArgument(
        "the in-process medium has no socket to bind: MessageTransport::listen(\"inproc\", n) "
        "registers it");
  SockAddr addr;
  if (host.empty()) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr.storage);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons(static_cast<uint16_t>(port));
    addr.len = sizeof(sockaddr_in);
    return addr;
  }
  return resolve(host, port);
}

void bind_or_throw(int fd, const SockAddr& addr) {
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) == 0) return;
  if (errno == EADDRINUSE)
    throw IoError(fmt::format("cannot bind {}: port {} is in use (by another process)",
                              addr.to_string(), addr.port()));
  throw IoError(
      fmt::format("cannot bind {}: {}; is the port in use or the address not on "
                  "this machine?",
                  addr.to_string(), std::strerror(errno)));
}
}  // namespace

Fd reserve_port(const std::string& host, int port) {
  SockAddr addr = bind_address(host, port);
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw IoError(fmt::format("socket(): {}", std::strerror(errno)));
  bind_or_throw(fd.get(), addr);
  return fd;
}

Fd listen_on(const std::string& host, int port, int backlog) {
  SockAddr addr = bind_address(host, port);
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw IoError(fmt::format("socket(): {}", std::strerror(errno)));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  bind_or_throw(fd.get(), addr);
  if (::listen(fd.get(), backlog) != 0)
    throw IoError(fmt::format("listen on {}: {}", addr.to_string(), std::strerror(errno)));
  set_nonblocking(fd.get(), true);
  return fd;
}

int local_port(int fd) {
  SockAddr a;
  a.len = sizeof a.storage;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.len);
  return a.port();
}

std::string peer_address(int fd) {
  SockAddr a;
  a.len = sizeof a.storage;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.len) != 0) return "?";
  return a.to_string();
}

Status connect_once(const SockAddr& addr, std::chrono::milliseconds timeout, Fd* out) {
  if (addr.family() == AF_UNIX) return in_process::dial(addr.in_process_port, out);
  auto failed = [](int err) { return Status(ErrorCode::kIoError, std::strerror(err)); };
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return failed(errno);
  set_nonblocking(fd.get(), true);
  int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len);
  if (rc != 0 && errno != EINPROGRESS) return failed(errno);
  if (rc != 0) {
    pollfd p{fd.get(), POLLOUT, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, timeout.count())));
    if (n == 0) return {ErrorCode::kTimeout, "connect timed out"};
    if (n < 0) return failed(errno);
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return failed(err);
  }
  if (is_self_connection(fd.get())) {
    // Nothing listened on a loopback port inside the ephemeral range, and the
    // kernel picked that very port as our source: TCP's simultaneous open
    // connected the socket to itself. It would hold the port the listener is
    // about to bind and read back its own hello; drop it and let the caller
    // retry.
    return {ErrorCode::kIoError, "connected to itself (nothing listens there yet)"};
  }
  set_nonblocking(fd.get(), false);
  *out = std::move(fd);
  return Status::ok();
}

bool is_self_connection(int fd) {
  SockAddr local, peer;
  local.len = peer.len = sizeof local.storage;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local.storage), &local.len) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer.storage), &peer.len) != 0 ||
      local.family() == AF_UNIX)  // an in-process socketpair has two ends
    return false;
  return local.len == peer.len && local.port() == peer.port() &&
         local.to_string() == peer.to_string();
}

Status adopt_inherited_listener(const char* value, int port, Fd* out) {
  auto no = [](std::string why) { return Status(ErrorCode::kInvalidArgument, std::move(why)); };
  if (value == nullptr || *value == '\0')
    return {ErrorCode::kNotFound, fmt::format("{} is not set", kListenFdVariable)};
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || n <= 2 || n > INT32_MAX)
    return no(fmt::format("{}='{}' is not a descriptor number above 2", kListenFdVariable, value));
  const int fd = static_cast<int>(n);
  if (fcntl(fd, F_GETFD) < 0)
    return no(fmt::format("{}={}: no such open descriptor", kListenFdVariable, fd));
  int type = 0, listening = 0;
  socklen_t len = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM)
    return no(fmt::format("{}={}: not a stream socket", kListenFdVariable, fd));
  len = sizeof listening;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening == 0)
    return no(fmt::format("{}={}: not a listening socket", kListenFdVariable, fd));
  SockAddr a;
  a.len = sizeof a.storage;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.len) != 0 ||
      (a.family() != AF_INET && a.family() != AF_INET6))
    return no(fmt::format("{}={}: not a TCP socket", kListenFdVariable, fd));
  if (port != 0 && a.port() != port)
    return no(
        fmt::format("{}={}: bound to port {}, not {}", kListenFdVariable, fd, a.port(), port));
  // Ours now: no further program this process starts inherits it.
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  set_nonblocking(fd, true);
  *out = Fd(fd);
  return Status::ok();
}

Status take_inherited_listener(int port, const std::string& inherited, Fd* out) {
  static std::mutex mu;
  static bool taken = false;
  std::lock_guard lock(mu);
  if (taken) return {ErrorCode::kNotFound, "the inherited listener was taken already"};
  Status st = adopt_inherited_listener(inherited.empty() ? nullptr : inherited.c_str(), port, out);
  taken = st.is_ok();
  return st;
}

namespace {
Status wait_fd(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return {ErrorCode::kTimeout, "timed out"};
  pollfd p{fd, events, 0};
  int n = ::poll(&p, 1, static_cast<int>(left.count()));
  if (n < 0 && errno == EINTR) return Status::ok();
  if (n == 0) return {ErrorCode::kTimeout, "timed out"};
  if (n < 0) return {ErrorCode::kIoError, std::strerror(errno)};
  return Status::ok();
}
}  // namespace

Status write_all(int fd, const void* data, size_t n,
                 std::chrono::steady_clock::time_point deadline) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    if (Status st = wait_fd(fd, POLLOUT, deadline); !st) return st;
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return {ErrorCode::kIoError, std::strerror(errno)};
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::ok();
}

Status read_all(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    if (Status st = wait_fd(fd, POLLIN, deadline); !st) return st;
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r == 0) return {ErrorCode::kIoError, "connection closed by the peer"};
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return {ErrorCode::kIoError, std::strerror(errno)};
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::ok();
}

}  // namespace pushpull::transport
