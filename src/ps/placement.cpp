// SPDX-License-Identifier: Apache-2.0
#include "ps/placement.h"

namespace pushpull::ps {

int server_of(uint64_t key_id, int num_servers) {
  // splitmix64 finaliser: consecutive keys spread evenly over the servers.
  uint64_t z = key_id + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<int>(z % static_cast<uint64_t>(num_servers));
}

std::vector<Slice> place(uint64_t key_id, int64_t numel, int num_servers, int64_t bound) {
  std::vector<Slice> slices;
  if (numel < bound || num_servers == 1 || numel == 0) {
    slices.push_back({server_of(key_id, num_servers), 0, numel});
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

uint64_t string_key_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h | (1ull << 63);
}

}  // namespace pushpull::ps
