// SPDX-License-Identifier: Apache-2.0
#include "collective/negotiation_tree.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

namespace pushpull::collective {

using transport::Clock;

namespace {

uint32_t millis(Clock::duration d) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  return static_cast<uint32_t>(std::clamp<int64_t>(ms, 0, UINT32_MAX));
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

void check_child(int me, int child, int size) {
  if (child <= 0 || child >= size || tree_parent(child) != me)
    throw ProtocolError(fmt::format(
        "collective: negotiation message from rank {}, not a child of rank {}", child, me));
}

void check_rank(int child, int r, int size) {
  if (r < child || r >= subtree_end(child, size))
    throw ProtocolError(fmt::format(
        "collective: rank {} announced for rank {}, outside its negotiation subtree", child, r));
}

const Spec& spec_of(const ResponseCache& cache, int child, uint32_t id) {
  const Spec* s = cache.get(id);
  if (!s)
    throw ProtocolError(
        fmt::format("collective: rank {} announced unknown cache id {}", child, id));
  return *s;
}

}  // namespace

int tree_parent(int rank) {
  return rank <= 0 ? -1 : rank & (rank - 1);
}

int subtree_end(int rank, int size) {
  if (rank == 0) return size;
  return static_cast<int>(std::min<int64_t>(size, int64_t{rank} + (rank & -rank)));
}

std::vector<int> tree_children(int rank, int size) {
  std::vector<int> out;
  const int64_t span = rank == 0 ? size : (rank & -rank);
  for (int64_t d = 1; d < span && rank + d < size; d *= 2)
    out.push_back(static_cast<int>(rank + d));
  return out;
}

TreeAggregator::TreeAggregator(int rank, int size, const CollectiveOptions& opts,
                               const ResponseCache& cache)
    : rank_(rank),
      size_(size),
      end_(subtree_end(rank, size)),
      cache_(cache),
      joined_(static_cast<size_t>(end_ - rank_), false) {
  // Half the stall warning (or shutdown) time: rank 0 then still reports the
  // stall on time, from the held time each rank-by-rank entry carries.
  double limit = opts.stall_warning_seconds;
  if (opts.stall_shutdown_seconds > 0) limit = std::min(limit, opts.stall_shutdown_seconds);
  hold_ = seconds(std::max(limit, 0.0) / 2);
}

void TreeAggregator::submit(const Spec& spec, Clock::time_point now) {
  uint32_t id = cache_.find(spec);
  if (id != kNoCacheId) return add(rank_, id, now, now);
  auto it = held_.find(spec.name);
  if (it == held_.end()) {
    // A marker: later submissions of this name go up rank by rank, so the
    // Coordinator sees any disagreement at once.
    Held h;
    h.first = now;
    h.passing = true;
    held_.emplace(spec.name, std::move(h));
  } else if (!it->second.passing) {
    flush(it, now);
  }
  out_.specs.push_back(UpSpec{rank_, spec});
}

void TreeAggregator::join(Clock::time_point /*now*/) {
  mark_joined(rank_);
}

void TreeAggregator::receive(int child, const Upward& up, Clock::time_point now) {
  check_child(rank_, child, size_);
  for (const auto& s : up.specs) {
    check_rank(child, s.rank, size_);
    auto it = held_.find(s.spec.name);
    if (it == held_.end()) {
      Held h;
      h.first = now;
      h.passing = true;
      held_.emplace(s.spec.name, std::move(h));
    } else if (!it->second.passing) {
      flush(it, now);
    }
    out_.specs.push_back(s);
  }
  const int end = subtree_end(child, size_);
  for (const auto& c : up.cached) {
    const Spec& spec = spec_of(cache_, child, c.id);
    for (int32_t r : c.ranks)
      check_rank(child, r, size_);
    if (!c.whole) {
      const auto since = now - std::chrono::milliseconds(c.held_ms);
      for (int32_t r : c.ranks)
        pass(r, c.id, since, now);  // the child gave up holding it: so do we
      continue;
    }
    for (int r = child; r < end; ++r)
      if (spec.includes(r) && std::find(c.ranks.begin(), c.ranks.end(), r) == c.ranks.end())
        add(r, c.id, now, now);
  }
  for (int32_t r : up.joins) {
    check_rank(child, r, size_);
    mark_joined(r);
  }
}

void TreeAggregator::add(int r, uint32_t id, Clock::time_point since, Clock::time_point now) {
  const Spec& spec = spec_of(cache_, r, id);
  if (!spec.includes(r)) return pass(r, id, since, now);  // the Coordinator rejects it
  auto [it, fresh] = held_.try_emplace(spec.name);
  Held& h = it->second;
  if (fresh) {
    h.id = id;
    h.have.assign(static_cast<size_t>(end_ - rank_), false);
    h.first = since;
  }
  if (h.passing || h.id != id || h.have[static_cast<size_t>(r - rank_)])
    return pass(r, id, since, now);
  h.have[static_cast<size_t>(r - rank_)] = true;
  h.first = std::min(h.first, since);
  settle(it);
}

void TreeAggregator::pass(int r, uint32_t id, Clock::time_point since, Clock::time_point now) {
  const Spec* spec = cache_.get(id);
  if (spec) {
    auto it = held_.find(spec->name);
    if (it != held_.end()) {
      if (!it->second.passing) flush(it, now);
      Held& h = it->second;
      if (h.id == id && !h.have.empty()) {
        if (h.have[static_cast<size_t>(r - rank_)]) {
          // A second submission: up as it is (the Coordinator rejects it).
        } else {
          h.have[static_cast<size_t>(r - rank_)] = true;
        }
      }
    } else {
      Held h;
      h.first = since;
      h.passing = true;
      held_.emplace(spec->name, std::move(h));
    }
  }
  const uint32_t held = millis(now - since);
  if (!out_.cached.empty() && !out_.cached.back().whole && out_.cached.back().id == id &&
      out_.cached.back().held_ms == held) {
    out_.cached.back().ranks.push_back(r);
    return;
  }
  out_.cached.push_back(UpCached{id, false, held, {r}});
}

void TreeAggregator::flush(Iter it, Clock::time_point now) {
  Held& h = it->second;
  h.passing = true;
  UpCached c{h.id, false, millis(now - h.first), {}};
  for (size_t i = 0; i < h.have.size(); ++i)
    if (h.have[i]) c.ranks.push_back(rank_ + static_cast<int>(i));
  if (!c.ranks.empty()) out_.cached.push_back(std::move(c));
}

void TreeAggregator::settle(Iter it) {
  Held& h = it->second;
  if (h.passing) return;
  const Spec& spec = *cache_.get(h.id);
  UpCached c{h.id, true, 0, {}};
  for (int r = rank_; r < end_; ++r) {
    if (!spec.includes(r) || h.have[static_cast<size_t>(r - rank_)]) continue;
    if (!joined_[static_cast<size_t>(r - rank_)]) return;  // still waiting for r
    c.ranks.push_back(r);
  }
  out_.cached.push_back(std::move(c));
  held_.erase(it);
}

void TreeAggregator::mark_joined(int r) {
  joined_[static_cast<size_t>(r - rank_)] = true;
  out_.joins.push_back(r);
  for (auto it = held_.begin(); it != held_.end();) {
    auto next = std::next(it);
    settle(it);
    it = next;
  }
}

void TreeAggregator::passed_down(const std::vector<Response>& rs) {
  for (const auto& r : rs) {
    for (const auto& t : r.tensors)
      held_.erase(t.name);
    if (r.kind == Response::Kind::kJoinDone) std::fill(joined_.begin(), joined_.end(), false);
  }
}

Upward TreeAggregator::take(Clock::time_point now) {
  for (auto& [name, h] : held_)
    if (!h.passing && now - h.first >= hold_) flush(held_.find(name), now);
  return std::exchange(out_, Upward{});
}

Clock::time_point TreeAggregator::next_deadline(Clock::time_point now) const {
  auto next = now + std::chrono::hours(1);
  for (const auto& [name, h] : held_)
    if (!h.passing) next = std::min(next, h.first + hold_);
  return next;
}

void deliver(Coordinator& coordinator, const ResponseCache& cache, int child, int size,
             const Upward& up, Clock::time_point now) {
  check_child(0, child, size);
  for (const auto& s : up.specs) {
    check_rank(child, s.rank, size);
    coordinator.submit(s.rank, s.spec, now);
  }
  const int end = subtree_end(child, size);
  for (const auto& c : up.cached) {
    const Spec& spec = spec_of(cache, child, c.id);
    for (int32_t r : c.ranks)
      check_rank(child, r, size);
    if (!c.whole) {
      const auto since = now - std::chrono::milliseconds(c.held_ms);
      for (int32_t r : c.ranks)
        coordinator.submit_cached(r, c.id, now, since);
      continue;
    }
    for (int r = child; r < end; ++r)
      if (spec.includes(r) && std::find(c.ranks.begin(), c.ranks.end(), r) == c.ranks.end())
        coordinator.submit_cached(r, c.id, now);
  }
  for (int32_t r : up.joins) {
    check_rank(child, r, size);
    coordinator.join(r, now);
  }
}

}  // namespace pushpull::collective
