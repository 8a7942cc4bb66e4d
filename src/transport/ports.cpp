// SPDX-License-Identifier: Apache-2.0
// Ports chosen for listeners pushpull cannot hand a socket to (transport/socket.h):
// picked and released (pick_unused_port, racy), or held by a reservation
// such a listener can bind beside (reserve_port_shared).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "pushpull/error.h"
#include "transport/socket.h"

namespace pushpull::transport {
namespace {

[[noreturn]] void in_use(const SockAddr& addr) {
  throw IoError(fmt::format("cannot bind {}: port {} is in use (by another process)",
                            addr.to_string(), addr.port()));
}

}  // namespace

Fd reserve_port_shared(const std::string& host, int port) {
  int one = 1;
  if (host.empty()) {
    // The IPv6 wildcard, dual-stack, where the host has IPv6: it also keeps
    // off an IPv6-only bind, which one on 0.0.0.0 would let through.
    SockAddr any6;
    auto* a = reinterpret_cast<sockaddr_in6*>(&any6.storage);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    any6.len = sizeof(sockaddr_in6);
    Fd fd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int v6only = 0;
    if (fd.valid() &&
        setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only) == 0 &&
        setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&any6.storage), any6.len) == 0)
      return fd;
    if (errno == EADDRINUSE) in_use(any6);
  }
  SockAddr addr = resolve(host.empty() ? "0.0.0.0" : host, port);
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw IoError(fmt::format("socket(): {}", std::strerror(errno)));
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0) {
    if (errno == EADDRINUSE) in_use(addr);
    throw IoError(fmt::format("cannot bind {}: {}", addr.to_string(), std::strerror(errno)));
  }
  return fd;
}

namespace {
// The lowest port of the kernel's ephemeral range (connect()'s source ports).
int lowest_ephemeral_port() {
  int lowest = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int lo = 0, hi = 0;
    if (std::fscanf(f, "%d %d", &lo, &hi) == 2 && lo > 0 && hi >= lo) lowest = lo;
    std::fclose(f);
  }
  return lowest;
}

// Binds a probe socket to host:port; returns the port bound (0: failed).
int probe_bind(const std::string& host, int port) {
  SockAddr addr;
  try {
    addr = resolve(host.empty() ? "0.0.0.0" : host, port);
  } catch (const std::exception&) {
    addr = resolve("0.0.0.0", port);
  }
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return 0;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr.storage), addr.len) != 0) return 0;
  return local_port(fd.get());
}
}  // namespace

int pick_unused_port(const std::string& host) {
  const int lo = lowest_ephemeral_port();
  constexpr int kLowest = 10000;  // above the ports services usually own
  if (lo > kLowest + 1000) {
    std::random_device seed;
    std::mt19937 rng(seed());
    std::uniform_int_distribution<int> pick(kLowest, lo - 1);
    for (int attempt = 0; attempt < 64; ++attempt)
      if (int port = probe_bind(host, pick(rng)); port != 0) return port;
  }
  if (int port = probe_bind(host, 0); port != 0) return port;
  throw IoError(
      fmt::format("cannot find a free port on {} (pass --port)", host.empty() ? "*" : host));
}

}  // namespace pushpull::transport
