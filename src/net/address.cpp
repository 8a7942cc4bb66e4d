// SPDX-License-Identifier: Apache-2.0
#include "net/address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::net {

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

std::string choose_host(const NetOptions& opts, const std::vector<InterfaceAddress>& interfaces) {
  if (!opts.node_host.empty()) return opts.node_host;
  if (!opts.interface.empty()) {
    const InterfaceAddress* v6 = nullptr;
    for (const auto& i : interfaces) {
      if (i.name != opts.interface) continue;
      if (!i.ipv6) return i.address;
      if (v6 == nullptr) v6 = &i;
    }
    if (v6 != nullptr) return v6->address;
    std::string names;
    for (const auto& i : interfaces)
      names += (names.empty() ? "" : ", ") + i.name;
    throw InvalidArgument(fmt::format(
        "network interface '{}' (DMLC_INTERFACE / PUSHPULL_INTERFACE) has no IP address on this "
        "machine; interfaces with addresses: {}",
        opts.interface, names.empty() ? "none" : names));
  }
  for (const auto& i : interfaces)
    if (!i.ipv6 && !i.loopback && i.up) return i.address;
  return "127.0.0.1";
}

}  // namespace pushpull::net
