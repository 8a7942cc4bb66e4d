// SPDX-License-Identifier: Apache-2.0
// Address lists (the scheduler's address book, the collectives' rendezvous
// and elastic books) travel compactly: many ranks share a host, so a list is
// sent as a table of its distinct hosts, in order of first use, and each
// entry names its host by index (issue 38: every rank gets the whole list,
// so its size times the job's is what the hub sends).
//
// Only the canonical form is accepted (no repeated host, no unused one, new
// hosts first used in table order), so a list has exactly one encoding: the
// fuzz targets re-encode what they decode and compare.
//
// Thread safety: plain values; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "transport/wire.h"

namespace pushpull::transport {

// Writes the table of the distinct values of `hosts` (u32 count, then each
// as a string) and returns each entry's index into it.
inline std::vector<uint32_t> put_host_table(Writer& w, const std::vector<std::string_view>& hosts) {
  std::vector<std::string_view> table;
  std::unordered_map<std::string_view, uint32_t> index;
  std::vector<uint32_t> at;
  at.reserve(hosts.size());
  for (std::string_view h : hosts) {
    auto [it, fresh] = index.try_emplace(h, static_cast<uint32_t>(table.size()));
    if (fresh) table.push_back(h);
    at.push_back(it->second);
  }
  w.u<uint32_t>(static_cast<uint32_t>(table.size()));
  for (std::string_view h : table)
    w.str(h);
  return at;
}

// Reads a table written by put_host_table, then checks each entry's index
// with take() in entry order and the whole with complete().
class HostTableReader {
 public:
  // At most `max_hosts` hosts of at most `max_host_bytes` each; false on a
  // malformed or repeated host.
  bool read(Reader& r, size_t max_hosts, size_t max_host_bytes) {
    const size_t n = r.count(max_hosts, 4);
    if (!r.ok()) return false;
    hosts_.resize(n);
    std::unordered_set<std::string_view> seen;
    for (auto& h : hosts_) {
      h = r.str(max_host_bytes);
      if (!r.ok()) return false;
    }
    for (const auto& h : hosts_)
      if (!seen.insert(h).second) return false;
    return true;
  }
  // The host of the next entry, which names index `i`; nullptr when `i` is
  // out of the table or skips ahead of the first use order.
  const std::string* take(uint32_t i) {
    if (i > used_ || i >= hosts_.size()) return nullptr;
    if (i == used_) ++used_;
    return &hosts_[i];
  }
  // Every host of the table was used.
  bool complete() const { return used_ == hosts_.size(); }

 private:
  std::vector<std::string> hosts_;
  uint32_t used_ = 0;
};

}  // namespace pushpull::transport
