// SPDX-License-Identifier: Apache-2.0
// mesh_partners (tcp_transport.h): which pairs of ranks the collectives
// connect at start-up. A pure function of the ranks' hosts, so every rank
// computes the same symmetric relation without talking to anyone.
#include <algorithm>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/schedule.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::transport {
namespace {

// Halving-doubling's partners of `r` among `n` (algorithms.h): the fold
// partner of the ranks beyond the largest power of two, then XOR partners.
void halving_doubling_partners(int r, int n, std::set<int>& out) {
  const HalvingDoublingShape shape = halving_doubling_shape(r, n);
  if (shape.folds(r)) out.insert(r ^ 1);
  if (shape.newrank < 0) return;
  for (int mask = 1; mask < shape.p; mask *= 2)
    out.insert(shape.real(shape.newrank ^ mask));
}

}  // namespace

std::vector<int> mesh_partners(int rank, const std::vector<std::string>& hosts) {
  const int n = static_cast<int>(hosts.size());
  std::set<int> out;
  if (n <= kFullMeshUpTo) {
    for (int r = 0; r < n; ++r)
      out.insert(r);
    out.erase(rank);
    return {out.begin(), out.end()};
  }
  for (int d = 1; d < n; d *= 2) {
    out.insert((rank + d) % n);
    out.insert((rank - d % n + n) % n);
  }
  halving_doubling_partners(rank, n, out);
  // The hosts, ordered by their lowest rank (hierarchical.cpp's order).
  std::unordered_map<std::string, size_t> index;
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < n; ++r) {
    auto [it, added] = index.emplace(hosts[static_cast<size_t>(r)], groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(r);
  }
  const auto& mine = groups[index.at(hosts[static_cast<size_t>(rank)])];
  bool uniform = groups.size() >= 2 && mine.size() >= 2;
  for (const auto& g : groups)
    uniform = uniform && g.size() == mine.size();
  // A small host's ranks; with the same number of ranks on every host
  // (where the hierarchical allreduce may run), the host's ranks and this
  // rank's cross-host group too: that allreduce takes the streams only when
  // every pair of its subgroup has one, and every member must decide alike.
  if (mine.size() <= static_cast<size_t>(kMaxLocalMesh) || uniform)
    out.insert(mine.begin(), mine.end());
  if (uniform) {
    const auto at = std::find(mine.begin(), mine.end(), rank) - mine.begin();
    for (const auto& g : groups)
      out.insert(g[static_cast<size_t>(at)]);
  }
  out.erase(rank);
  return {out.begin(), out.end()};
}

}  // namespace pushpull::transport
