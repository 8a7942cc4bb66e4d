// SPDX-License-Identifier: Apache-2.0
#include "transport/address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <utility>

#include <fmt/format.h>

#include "pushpull/error.h"
#include "transport/inproc/in_process_listeners.h"

namespace pushpull::transport {

std::vector<InterfaceAddress> list_interfaces() {
  std::vector<InterfaceAddress> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    const void* src =
        fam == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr);
    inet_ntop(fam, src, buf, sizeof buf);
    InterfaceAddress a;
    a.name = i->ifa_name;
    a.address = buf;
    a.ipv6 = fam == AF_INET6;
    a.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    a.up = (i->ifa_flags & IFF_UP) != 0;
    // Link-local IPv6 addresses need a scope id to be usable; skip them.
    if (a.ipv6 && a.address.rfind("fe80", 0) == 0) continue;
    out.push_back(std::move(a));
  }
  freeifaddrs(list);
  return out;
}

std::string local_hostname() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

std::optional<std::string> route_source_address(std::string_view host) {
  std::string h(host);
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (h.empty() || getaddrinfo(h.c_str(), "9", &hints, &res) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (addrinfo* a = res; a != nullptr && !found; a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    // connect() on a UDP socket only asks the kernel for a route: nothing is sent.
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {};
      const void* src =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, src, buf, sizeof buf) != nullptr) found = buf;
    }
    ::close(fd);
  }
  freeaddrinfo(res);
  return found;
}

namespace {

bool same_host(std::string_view want, std::string_view hostname) {
  if (want == hostname) return true;
  // "node1" matches "node1.cluster.local" and the other way round.
  auto shortname = [](std::string_view s) { return s.substr(0, s.find('.')); };
  return shortname(want) == shortname(hostname) &&
         (want.find('.') == std::string_view::npos || hostname.find('.') == std::string_view::npos);
}

}  // namespace

bool is_loopback_host(std::string_view host) {
  if (host == "localhost" || host == "ip6-localhost" || host == "::1" || host == "[::1]")
    return true;
  in_addr a{};
  std::string h(host);
  return inet_pton(AF_INET, h.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

std::optional<std::string> interface_address(const std::string& name,
                                             const std::vector<InterfaceAddress>& interfaces,
                                             bool ipv4_only) {
  const InterfaceAddress* v6 = nullptr;
  for (const auto& i : interfaces) {
    if (i.name != name) continue;
    if (!i.ipv6) return i.address;
    if (v6 == nullptr) v6 = &i;
  }
  if (v6 != nullptr && !ipv4_only) return v6->address;
  return std::nullopt;
}

std::optional<std::string> pick_interface(std::string_view spec,
                                          const std::vector<InterfaceAddress>& interfaces,
                                          std::string_view hostname) {
  // Every entry is checked first, so a typo fails on every host alike.
  std::vector<std::pair<std::string_view, std::string_view>> entries;  // (host, name)
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string_view::npos) comma = spec.size();
    std::string_view entry = spec.substr(start, comma - start);
    start = comma + 1;
    std::string_view host, name = entry;
    if (auto colon = entry.find(':'); colon != std::string_view::npos) {
      host = entry.substr(0, colon);
      name = entry.substr(colon + 1);
      if (host.empty())
        throw InvalidArgument(
            fmt::format("interface list '{}': '{}' has no host before ':'", spec, entry));
    }
    if (name.empty())
      throw InvalidArgument(
          fmt::format("interface list '{}': an entry names no interface (use eth0,ens5 or "
                      "host1:eth0,host2:ens5)",
                      spec));
    entries.emplace_back(host, name);
  }
  for (const auto& [host, name] : entries) {
    if (!host.empty() && !same_host(host, hostname)) continue;
    if (interface_address(std::string(name), interfaces)) return std::string(name);
  }
  return std::nullopt;
}

std::string choose_host(const NetOptions& opts, const std::vector<InterfaceAddress>& interfaces,
                        std::string_view hostname, std::string_view toward,
                        const std::optional<std::string>& route) {
  if (!opts.node_host.empty()) return opts.node_host;
  if (!opts.interface.empty()) {
    if (auto name = pick_interface(opts.interface, interfaces, hostname))
      return *interface_address(*name, interfaces);
    std::string names;
    for (const auto& i : interfaces)
      names += (names.empty() ? "" : ", ") + i.name;
    throw InvalidArgument(fmt::format(
        "network interface '{}' (DMLC_INTERFACE / PUSHPULL_INTERFACE) selects no interface with "
        "an IP address on this machine ({}); interfaces with addresses: {}",
        opts.interface, hostname.empty() ? "no host name" : hostname,
        names.empty() ? "none" : names));
  }
  if (!toward.empty() && !is_loopback_host(toward) && route && !route->empty() &&
      !is_loopback_host(*route))
    return *route;
  for (const auto& i : interfaces)
    if (!i.ipv6 && !i.loopback && i.up) return i.address;
  return "127.0.0.1";
}

std::string choose_host(const NetOptions& opts, std::string_view toward) {
  // Toward the in-process medium: the medium too (nothing else reaches it).
  if (opts.node_host.empty() && is_in_process_host(toward)) return std::string(toward);
  std::optional<std::string> route;
  if (opts.node_host.empty() && opts.interface.empty() && !toward.empty() &&
      !is_loopback_host(toward))
    route = route_source_address(toward);
  return choose_host(opts, list_interfaces(), local_hostname(), toward, route);
}

}  // namespace pushpull::transport
