// SPDX-License-Identifier: Apache-2.0
#include "cluster/barrier_book.h"

#include <algorithm>

namespace pushpull::cluster {

std::vector<BarrierBook::Answer> BarrierBook::arrive(uint8_t group, Member m,
                                                     transport::ConnId conn, uint64_t count,
                                                     BarrierTag tag,
                                                     const std::vector<Member>& members) {
  Group& g = groups_[group];
  // A replacement calling a barrier its predecessor already went through.
  if (tag.tracked && g.last_done && tag.key() <= *g.last_done) return {{conn, count}};
  g.waiting[m] = {conn, count, tag};
  return settle(group, members);
}

bool BarrierBook::present(const Group& g, const Member& m, const BarrierTag& at) const {
  if (g.waiting.count(m)) return true;
  if (!at.tracked || m.first != Role::kWorker) return false;
  auto p = passed_.find(m.second);
  return p != passed_.end() && p->second >= at.position;
}

std::vector<BarrierBook::Answer> BarrierBook::settle(uint8_t group,
                                                     const std::vector<Member>& members) {
  auto it = groups_.find(group);
  if (it == groups_.end() || it->second.waiting.empty()) return {};
  Group& g = it->second;
  // The barrier's place: the furthest tag among those waiting (equal in a
  // well-formed dist_sync program).
  BarrierTag at;
  for (const auto& [m, a] : g.waiting)
    if (a.tag.tracked && (!at.tracked || at.key() < a.tag.key())) at = a.tag;
  for (const Member& m : members)
    if (!present(g, m, at)) return {};
  std::vector<Answer> out;
  for (const auto& [m, a] : g.waiting)
    out.push_back({a.conn, a.count});
  g.waiting.clear();
  if (at.tracked) g.last_done = at.key();
  return out;
}

void BarrierBook::pass(int worker_rank, uint64_t position) {
  uint64_t& p = passed_[worker_rank];
  p = std::max(p, position);
}

void BarrierBook::lose(Member m) {
  for (auto& [group, g] : groups_)
    g.waiting.erase(m);
  if (m.first == Role::kWorker) passed_.erase(m.second);
}

std::vector<uint8_t> BarrierBook::waiting_groups() const {
  std::vector<uint8_t> out;
  for (const auto& [group, g] : groups_)
    if (!g.waiting.empty()) out.push_back(group);
  return out;
}

size_t BarrierBook::waiting(uint8_t group) const {
  auto it = groups_.find(group);
  return it == groups_.end() ? 0 : it->second.waiting.size();
}

}  // namespace pushpull::cluster
