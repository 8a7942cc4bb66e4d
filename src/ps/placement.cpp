// SPDX-License-Identifier: Apache-2.0
#include "ps/placement.h"

#include <algorithm>
#include <cmath>

namespace pushpull::ps {

int server_of(uint64_t key_id, int num_servers) {
  // Integer keys round-robin (MXNet's choice too): a model's parameters are
  // usually numbered 0..P-1, and a hash left 16 equal layers on 8 servers
  // 3,3,3,3,1,1,1,1, so the busiest server link carried 1.5x its share.
  if (key_id < (1ull << 63)) return static_cast<int>(key_id % static_cast<uint64_t>(num_servers));
  // String keys (already a hash, top bit set): the splitmix64 finaliser.
  uint64_t z = key_id + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<int>(z % static_cast<uint64_t>(num_servers));
}

std::vector<Slice> place(uint64_t key_id, int64_t numel, int num_servers, int64_t bound,
                         const std::vector<double>& weights) {
  std::vector<Slice> slices;
  if (numel < bound || num_servers == 1 || numel == 0) {
    slices.push_back({server_of(key_id, num_servers), 0, numel});
    return slices;
  }
  if (weights.size() == static_cast<size_t>(num_servers)) {
    double total = 0;
    for (double w : weights)
      total += w;
    // Boundaries from the running sum: every worker computes the same ones
    // (same inputs, same arithmetic), and the last slice ends at numel.
    double below = 0;
    int64_t begin = 0;
    for (int s = 0; s < num_servers; ++s) {
      below += weights[static_cast<size_t>(s)];
      const int64_t end = s + 1 == num_servers
                              ? numel
                              : std::min<int64_t>(numel, std::llround(static_cast<double>(numel) *
                                                                      (below / total)));
      if (end > begin) slices.push_back({s, begin, end - begin});
      begin = std::max(begin, end);
    }
    return slices;
  }
  for (int s = 0; s < num_servers; ++s) {
    int64_t begin = numel * s / num_servers;
    int64_t end = numel * (s + 1) / num_servers;
    if (end > begin) slices.push_back({s, begin, end - begin});
  }
  return slices;
}

std::vector<Slice> chunk(const std::vector<Slice>& slices, int64_t max_count) {
  std::vector<Slice> out;
  for (const Slice& s : slices) {
    if (s.count <= max_count) {
      out.push_back(s);
      continue;
    }
    int64_t pieces = (s.count + max_count - 1) / max_count;
    for (int64_t i = 0; i < pieces; ++i) {  // even pieces, like the server split
      int64_t b = s.count * i / pieces, e = s.count * (i + 1) / pieces;
      out.push_back({s.server, s.begin + b, e - b});
    }
  }
  return out;
}

int64_t chunk_count(const std::vector<Slice>& slices, int64_t max_count, int64_t min_count,
                    int min_pieces) {
  int64_t largest = 0;
  for (const Slice& s : slices)
    largest = std::max(largest, s.count);
  int64_t want = largest / std::max(1, min_pieces);
  return std::max<int64_t>(1, std::min(max_count, std::max(min_count, want)));
}

uint64_t string_key_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h | (1ull << 63);
}

}  // namespace pushpull::ps
