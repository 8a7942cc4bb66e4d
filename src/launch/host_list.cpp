// SPDX-License-Identifier: Apache-2.0
#include "launch/host_list.h"

#include <filesystem>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::launch {
namespace {

constexpr int kMaxSlots = 1 << 20;

int parse_slots(std::string_view text, std::string_view entry) {
  int v = 0;
  bool ok = !text.empty() && text.size() <= 7;
  for (char c : text) {
    ok = ok && c >= '0' && c <= '9';
    if (ok) v = v * 10 + (c - '0');
  }
  if (!ok || v < 1 || v > kMaxSlots)
    throw InvalidArgument(fmt::format("-H: '{}': slots must be a number from 1 to {} (host:slots)",
                                      entry, kMaxSlots));
  return v;
}

}  // namespace

std::vector<HostEntry> parse_host_list(std::string_view list) {
  std::vector<HostEntry> hosts;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view entry = list.substr(start, comma - start);
    start = comma + 1;
    if (entry.empty())
      throw InvalidArgument(fmt::format("-H '{}': empty host in the list (host:slots,...)", list));
    HostEntry e;
    std::string_view host = entry, slots;
    if (entry.front() == '[') {
      auto close = entry.find(']');
      if (close == std::string_view::npos || close == 1)
        throw InvalidArgument(fmt::format("-H: '{}': missing ']' after an IPv6 address", entry));
      host = entry.substr(1, close - 1);
      auto rest = entry.substr(close + 1);
      if (!rest.empty()) {
        if (rest.front() != ':')
          throw InvalidArgument(fmt::format("-H: '{}': expected ':slots' after ']'", entry));
        slots = rest.substr(1);
        if (slots.empty()) slots = "x";  // "[v6]:" is an error
      }
    } else if (auto colon = entry.find(':'); colon != std::string_view::npos) {
      if (entry.find(':', colon + 1) != std::string_view::npos)
        throw InvalidArgument(fmt::format(
            "-H: '{}': an IPv6 address must be written in brackets, e.g. [fe80::1]:2", entry));
      host = entry.substr(0, colon);
      slots = entry.substr(colon + 1);
      if (slots.empty()) slots = "x";
    }
    if (host.empty()) throw InvalidArgument(fmt::format("-H: '{}': empty host name", entry));
    for (char c : host)
      if (c == ' ' || c == '\t' || c == '=' || c == '#')
        throw InvalidArgument(fmt::format("-H: '{}': not a host name", entry));
    e.host = std::string(host);
    if (!slots.empty()) e.slots = parse_slots(slots, entry);
    hosts.push_back(std::move(e));
    if (comma == list.size()) break;
  }
  return hosts;
}

std::vector<HostEntry> read_hosts(const std::string& arg) {
  std::error_code ec;
  if (std::filesystem::exists(arg, ec) || arg.find('/') != std::string::npos)
    return read_hostfile(arg);
  return parse_host_list(arg);
}

}  // namespace pushpull::launch
