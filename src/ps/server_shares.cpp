// SPDX-License-Identifier: Apache-2.0
#include "ps/server_shares.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::ps {
namespace {

std::vector<double> parse_list(const std::string& setting, size_t servers) {
  std::vector<double> out;
  size_t at = 0;
  while (at <= setting.size()) {
    size_t comma = setting.find(',', at);
    if (comma == std::string::npos) comma = setting.size();
    const std::string item = setting.substr(at, comma - at);
    double w = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), w);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() ||
        !std::isfinite(w) || w <= 0)
      throw InvalidArgument(fmt::format(
          "PUSHPULL_PS_SERVER_WEIGHTS='{}': '{}' is not a positive number (expected auto, equal "
          "or one weight per server, e.g. 2,2,1,1)",
          setting, item));
    out.push_back(w);
    at = comma + 1;
  }
  if (out.size() != servers)
    throw InvalidArgument(
        fmt::format("PUSHPULL_PS_SERVER_WEIGHTS='{}' has {} weights but the job has {} servers",
                    setting, out.size(), servers));
  return out;
}

}  // namespace

double spare_host_fraction(int n, int k) {
  if (n <= 1 || k <= 0) return 0;
  const double nn = n, kk = k;
  // From k = n on, the spare hosts alone carry the value at the worker
  // links' rate (n M / k <= M): the fraction reaches 1 there.
  return std::min(1.0, 2 * kk * (nn - 1) / (nn * nn + kk * nn - 2 * kk));
}

std::vector<double> server_weights(const std::string& setting, const cluster::AddressBook& book) {
  const size_t servers = book.servers.size();
  if (setting == "equal" || servers <= 1) return {};
  if (setting != "auto") return parse_list(setting, servers);
  std::set<std::string> worker_hosts;
  for (const auto& w : book.workers)
    worker_hosts.insert(w.host);
  std::map<std::string, int> on_spare, on_worker;  // host -> its servers
  for (const auto& s : book.servers)
    ++(worker_hosts.count(s.host) ? on_worker : on_spare)[s.host];
  if (on_spare.empty() || on_worker.empty()) return {};
  const int n = static_cast<int>(worker_hosts.size());
  const int k = static_cast<int>(on_spare.size());
  const double spare = spare_host_fraction(n, k);
  std::vector<double> out;
  out.reserve(servers);
  for (const auto& s : book.servers) {
    auto it = on_spare.find(s.host);
    out.push_back(it != on_spare.end() ? spare / k / it->second
                                       : (1 - spare) / n / on_worker.at(s.host));
  }
  return out;
}

std::vector<double> link_scales(const std::vector<double>& weights) {
  double sum = 0;
  for (double w : weights)
    sum += w;
  if (weights.empty() || sum <= 0) return {};
  std::vector<double> out;
  out.reserve(weights.size());
  for (double w : weights)
    out.push_back(std::clamp(std::sqrt(w * static_cast<double>(weights.size()) / sum), 0.125, 8.0));
  return out;
}

}  // namespace pushpull::ps
