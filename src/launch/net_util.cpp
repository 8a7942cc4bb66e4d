// SPDX-License-Identifier: Apache-2.0
// Small address helpers of the launcher: this host's addresses.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "launch/launcher.h"
#include "transport/address.h"

namespace pushpull::launch {

std::string first_ipv4_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "127.0.0.1";
  std::string found = "127.0.0.1";
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN];
    auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf)) {
      found = buf;
      break;
    }
  }
  freeifaddrs(list);
  return found;
}

std::optional<std::string> interface_ipv4_address(const std::string& spec) {
  const auto interfaces = transport::list_interfaces();
  auto name = transport::pick_interface(spec, interfaces, transport::local_hostname());
  if (!name) return std::nullopt;
  return transport::interface_address(*name, interfaces, /*ipv4_only=*/true);
}

std::string address_toward(const std::string& host) {
  if (is_loopback_host(host)) return "127.0.0.1";  // every node on this host
  if (auto a = transport::route_source_address(host); a && !is_loopback_host(*a)) return *a;
  return first_ipv4_address();
}

bool wait_until_resolvable(const std::string& host, std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  auto delay = std::chrono::milliseconds(100);
  while (true) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) == 0) {
      freeaddrinfo(res);
      return true;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(delay, deadline - now));
    delay = std::min(delay * 2, std::chrono::milliseconds(2000));
  }
}

}  // namespace pushpull::launch
