// SPDX-License-Identifier: Apache-2.0
// Clock offsets for the merged timeline (see clock_sync.h).
#include "base/clock_sync.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::base {
namespace {

constexpr uint32_t kMagic = 0x70704353;  // "ppCS"

struct Packet {  // host byte order: both ends are pushpull on the same job's hosts
  uint32_t magic;
  uint32_t seq;
  int64_t client_ns;
  int64_t server_ns;
};

}  // namespace

int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int ClockService::start(const std::string& host) {
  fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (host.empty() || ::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
    a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const int err = errno;
    stop();
    throw IoError(fmt::format("clock service: cannot bind {}: {}", host, std::strerror(err)));
  }
  socklen_t len = sizeof a;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  stop_.store(false);
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      Packet pk{};
      sockaddr_storage from{};
      socklen_t flen = sizeof from;
      const ssize_t n =
          ::recvfrom(fd_, &pk, sizeof pk, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &flen);
      if (n != static_cast<ssize_t>(sizeof pk) || pk.magic != kMagic) continue;
      pk.server_ns = monotonic_ns();
      ::sendto(fd_, &pk, sizeof pk, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), flen);
    }
  });
  return ntohs(a.sin_port);
}

void ClockService::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::optional<ClockOffset> measure_offset(const std::string& host_port, int exchanges,
                                          std::chrono::milliseconds deadline) {
  const auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const std::string host = host_port.substr(0, colon), port = host_port.substr(colon + 1);
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return std::nullopt;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  ::freeaddrinfo(res);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    return std::nullopt;
  }
  std::optional<ClockOffset> best;
  int answered = 0;
  const int64_t end = monotonic_ns() + deadline.count() * 1000000;
  for (uint32_t seq = 1; seq <= static_cast<uint32_t>(exchanges) && monotonic_ns() < end; ++seq) {
    Packet pk{kMagic, seq, monotonic_ns(), 0};
    if (::send(fd, &pk, sizeof pk, 0) != static_cast<ssize_t>(sizeof pk)) break;
    for (;;) {  // the reply to this seq (older ones, late, are dropped)
      const int64_t wait_ms = std::min<int64_t>(100, (end - monotonic_ns()) / 1000000);
      pollfd p{fd, POLLIN, 0};
      if (wait_ms <= 0 || ::poll(&p, 1, static_cast<int>(wait_ms)) <= 0) break;
      Packet r{};
      const ssize_t n = ::recv(fd, &r, sizeof r, MSG_DONTWAIT);
      const int64_t received = monotonic_ns();
      if (n != static_cast<ssize_t>(sizeof r) || r.magic != kMagic || r.seq != seq) continue;
      ++answered;
      const int64_t rtt = received - r.client_ns;
      if (!best || rtt < best->rtt_ns)
        best = ClockOffset{r.server_ns - (r.client_ns + received) / 2, rtt, 0};
      break;
    }
  }
  ::close(fd);
  if (best) best->samples = answered;
  return best;
}

}  // namespace pushpull::base
