// SPDX-License-Identifier: Apache-2.0
// Which address a node advertises to the others (ps-lite's rules):
//   1. NetOptions::node_host when set (DMLC_NODE_HOST / PUSHPULL_NODE_HOST);
//   2. else the first address of the interface named NetOptions::interface
//      (DMLC_INTERFACE / PUSHPULL_INTERFACE), IPv4 preferred, IPv6 accepted;
//   3. else the first non-loopback IPv4 address of an interface that is up;
//   4. else 127.0.0.1.
// The interface list is a parameter so tests can feed their own.
// Thread safety: pure functions (list_interfaces reads the OS).
#pragma once

#include <string>
#include <vector>

#include "pushpull/options.h"

namespace pushpull::net {

struct InterfaceAddress {
  std::string name;     // "eth0"
  std::string address;  // numeric, no brackets
  bool ipv6 = false;
  bool loopback = false;
  bool up = true;
};

// The machine's interface addresses (getifaddrs), in the kernel's order.
std::vector<InterfaceAddress> list_interfaces();

// Throws InvalidArgument when `opts.interface` names no interface with an address.
std::string choose_host(const NetOptions& opts, const std::vector<InterfaceAddress>& interfaces);
inline std::string choose_host(const NetOptions& opts) {
  return choose_host(opts, list_interfaces());
}

}  // namespace pushpull::net
