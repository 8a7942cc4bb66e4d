// SPDX-License-Identifier: Apache-2.0
// Which address a node advertises to the others (ps-lite's rules, and the
// route to the peer it meets first):
//   1. NetOptions::node_host when set (DMLC_NODE_HOST / PUSHPULL_NODE_HOST);
//   2. else the interface NetOptions::interface names (DMLC_INTERFACE /
//      PUSHPULL_INTERFACE), its first address, IPv4 preferred, IPv6
//      accepted. The value is one name (`eth0`), a list whose first existing
//      entry wins (`eth0,ens5`), or per host (`host1:eth0,host2:ens5`: an
//      entry `host:` applies only on the machine of that host name, short or
//      full; entries without one apply everywhere), mixed as needed;
//   3. else the source address of the route toward `toward` (the scheduler
//      or the rendezvous: a UDP socket connected there, its getsockname),
//      unless `toward` is empty or a loopback address;
//   4. else the first non-loopback IPv4 address of an interface that is up;
//   5. else 127.0.0.1.
// The interface list, host name and route are parameters so tests can feed
// their own.
// Thread safety: pure functions (list_interfaces, route_source_address and
// the convenience overload read the OS).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pushpull/options.h"

namespace pushpull::transport {

struct InterfaceAddress {
  std::string name;     // "eth0"
  std::string address;  // numeric, no brackets
  bool ipv6 = false;
  bool loopback = false;
  bool up = true;
};

// "localhost", "ip6-localhost", "::1" (bracketed or not) or an IPv4 address
// in 127.0.0.0/8: the one loopback test of the launcher, the rendezvous and
// address selection (a name is not resolved).
bool is_loopback_host(std::string_view host);

// The machine's interface addresses (getifaddrs), in the kernel's order.
std::vector<InterfaceAddress> list_interfaces();

// This machine's host name (gethostname), "" when it has none.
std::string local_hostname();

// The address this machine sends from toward `host` (a name or a numeric
// address): the kernel's route choice, read from a connected UDP socket (no
// packet is sent). nullopt when `host` does not resolve or has no route.
std::optional<std::string> route_source_address(std::string_view host);

// The interface `spec` (see rule 2 above) selects on the machine called
// `hostname` with `interfaces`: its name, or nullopt when no entry applies
// to this host or none names an interface with an address. Throws
// InvalidArgument on a malformed spec (an empty entry, host or name).
std::optional<std::string> pick_interface(std::string_view spec,
                                          const std::vector<InterfaceAddress>& interfaces,
                                          std::string_view hostname);

// The address of interface `name` (IPv4 preferred; `ipv4_only`: IPv4 only).
std::optional<std::string> interface_address(const std::string& name,
                                             const std::vector<InterfaceAddress>& interfaces,
                                             bool ipv4_only = false);

// The address to advertise (the rules above). `route` is the source address
// toward `toward` (route_source_address), consulted only under rule 3.
// Throws InvalidArgument when `opts.interface` selects no interface here.
std::string choose_host(const NetOptions& opts, const std::vector<InterfaceAddress>& interfaces,
                        std::string_view hostname = {}, std::string_view toward = {},
                        const std::optional<std::string>& route = std::nullopt);
// The same on this machine; `toward`: the peer met first ("" when none).
std::string choose_host(const NetOptions& opts, std::string_view toward = {});

}  // namespace pushpull::transport
