// SPDX-License-Identifier: Apache-2.0
#include "collective/coordinator.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace pushpull::collective {

using transport::Clock;

uint32_t ResponseCache::find(const Spec& s) const {
  auto it = by_name_.find(s.name);
  if (it == by_name_.end() || !(specs_[it->second] == s)) return kNoCacheId;
  return it->second;
}

const Spec* ResponseCache::get(uint32_t id) const {
  return id < specs_.size() ? &specs_[id] : nullptr;
}

uint32_t ResponseCache::assign(const Spec& s) {
  if (specs_.size() >= capacity_) return kNoCacheId;
  auto id = static_cast<uint32_t>(specs_.size());
  specs_.push_back(s);
  by_name_[s.name] = id;
  return id;
}

void ResponseCache::record(uint32_t id, const Spec& s) {
  if (id != specs_.size())
    throw ProtocolError(
        fmt::format("collective: response cache id {} out of order (expected {}); ranks disagree",
                    id, specs_.size()));
  specs_.push_back(s);
  by_name_[s.name] = id;
}

Coordinator::Coordinator(int size, const CollectiveOptions& opts, ResponseCache& cache)
    : size_(size), opts_(opts), cache_(cache), joined_(static_cast<size_t>(size), false) {}

const Spec* Coordinator::first_spec(const Pending& p) {
  for (const auto& s : p.specs)
    if (s) return &*s;
  throw ProtocolError("collective: a pending tensor without a submission");  // cannot happen
}

Clock::duration Coordinator::seconds(double s) const {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

void Coordinator::submit(int rank, Spec spec, Clock::time_point now, Clock::time_point since) {
  if (spec.root < 0 || spec.root >= size_)
    throw InvalidArgument(fmt::format("collective: tensor '{}': root {} is not a rank (size {})",
                                      spec.name, spec.root, size_));
  if (!spec.includes(rank))
    throw ProtocolError(fmt::format(
        "collective: rank {} submitted tensor '{}' of a process set without it", rank, spec.name));
  auto [it, fresh] = pending_.try_emplace(spec.name);
  Pending& p = it->second;
  since = std::min(now, since);
  if (fresh) {
    p.specs.resize(static_cast<size_t>(size_));
    p.first = p.last_warn = since;
  } else if (since < p.first) {
    p.first = since;
  }
  if (p.specs[static_cast<size_t>(rank)])
    throw ProtocolError(
        fmt::format("collective: rank {} submitted tensor '{}' twice", rank, spec.name));
  std::string name = spec.name;
  p.specs[static_cast<size_t>(rank)] = std::move(spec);
  ++p.have;
  check(name, now);
}

void Coordinator::submit_cached(int rank, uint32_t id, Clock::time_point now,
                                Clock::time_point since) {
  const Spec* s = cache_.get(id);
  if (!s)
    throw ProtocolError(fmt::format("collective: rank {} announced unknown cache id {}", rank, id));
  submit(rank, *s, now, since);
}

void Coordinator::join(int rank, Clock::time_point now) {
  if (!joined_[static_cast<size_t>(rank)]) {
    joined_[static_cast<size_t>(rank)] = true;
    ++njoined_;
    last_joined_ = rank;
  }
  check_all(now);
  if (njoined_ == size_) {
    Item item;
    item.response.kind = Response::Kind::kJoinDone;
    item.response.joined.push_back(last_joined_);  // join() returns it (as Horovod)
    item.ready_at = now;
    ready_.push_back(std::move(item));
    std::fill(joined_.begin(), joined_.end(), false);
    njoined_ = 0;
  }
}

void Coordinator::check_all(Clock::time_point now) {
  std::vector<std::string> names;
  for (const auto& [name, p] : pending_)
    names.push_back(name);
  for (const auto& n : names)
    check(n, now);
}

std::vector<int> Coordinator::joined_members(const Pending& p, const Spec& spec) const {
  std::vector<int> gone;
  for (int r = 0; r < size_; ++r)
    if (!p.specs[static_cast<size_t>(r)] && joined_[static_cast<size_t>(r)] && spec.includes(r))
      gone.push_back(r);
  return gone;
}

void Coordinator::check(const std::string& name, Clock::time_point now) {
  auto it = pending_.find(name);
  if (it == pending_.end()) return;
  Pending& p = it->second;
  const Spec* any = first_spec(p);
  // An allgather or broadcast fails while a member has joined (below); it
  // fails the ranks that submitted it at once, without waiting for the other
  // members: their submissions may never come under this name (unnamed ops
  // are numbered per rank, and a joined rank's numbers fall behind).
  const bool fails_now = (any->type == OpType::kBroadcast || any->type == OpType::kAllgather) &&
                         !joined_members(p, *any).empty();
  for (int r = 0; r < size_ && !fails_now; ++r)
    if (!p.specs[static_cast<size_t>(r)] && !joined_[static_cast<size_t>(r)] && any->includes(r))
      return;
  Item item;
  item.ready_at = now;
  const Spec* first = nullptr;
  bool agree = true;
  for (const auto& s : p.specs) {
    if (!s) continue;
    if (!first) first = &*s;
    agree = agree && first->compatible(*s);
  }
  if (!agree) {
    std::vector<std::string> each;
    for (int r = 0; r < size_; ++r) {
      const auto& s = p.specs[static_cast<size_t>(r)];
      if (s)
        each.push_back(fmt::format("rank {}: {}", r, s->describe()));
      else if (joined_[static_cast<size_t>(r)])
        each.push_back(fmt::format("rank {}: joined", r));
    }
    item.response.kind = Response::Kind::kError;
    item.response.code = ErrorCode::kInvalidArgument;
    item.response.message = fmt::format(
        "collective: tensor '{}' was submitted differently by the ranks ({}); every rank must "
        "submit the same op, dtype, shape (allgather: all but the first dimension), reduction "
        "and root under one name",
        name, fmt::join(each, "; "));
    item.response.tensors.push_back(ResponseTensor{name, kNoCacheId, false, {}});
  } else if (auto gone = joined_members(p, *first);
             !gone.empty() &&
             (first->type == OpType::kBroadcast || first->type == OpType::kAllgather)) {
    // As Horovod: a joined rank has no rows to gather and may be a broadcast's
    // root, so both fail on every rank that submitted them (reductions go on).
    item.response.kind = Response::Kind::kError;
    item.response.code = ErrorCode::kInvalidArgument;
    item.response.message = fmt::format(
        "collective: {} '{}' while rank(s) [{}] have joined: allgather and broadcast are not "
        "supported with join (as in Horovod); call them before join(), or let every rank "
        "join first",
        op_type_name(first->type), name, fmt::join(gone, ", "));
    item.response.tensors.push_back(ResponseTensor{name, kNoCacheId, false, {}});
  } else {
    item.spec = *first;
    for (int r = 0; r < size_; ++r) {
      const auto& s = p.specs[static_cast<size_t>(r)];
      if (!s) item.response.joined.push_back(r);
      if (first->type == OpType::kAllgather)
        item.response.rows.push_back(!s ? 0 : s->shape.ndim() == 0 ? 1 : s->shape[0]);
    }
  }
  pending_.erase(it);
  ready_.push_back(std::move(item));
}

ResponseTensor Coordinator::tensor_of(const Spec& s) {
  ResponseTensor t;
  t.name = s.name;
  t.cache_id = cache_.find(s);
  if (t.cache_id == kNoCacheId) {
    t.cache_id = cache_.assign(s);
    t.has_spec = true;
    t.spec = s;
  }
  return t;
}

std::vector<Response> Coordinator::poll(Clock::time_point now, std::vector<StallReport>* stalls) {
  std::vector<Response> out;
  // Stalls: tensors some ranks submitted and others did not.
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    auto age = now - p.first;
    std::vector<int> missing;
    const Spec* any = first_spec(p);
    for (int r = 0; r < size_; ++r)
      if (!p.specs[static_cast<size_t>(r)] && !joined_[static_cast<size_t>(r)] && any->includes(r))
        missing.push_back(r);
    double waited = std::chrono::duration<double>(age).count();
    if (opts_.stall_shutdown_seconds > 0 && age >= seconds(opts_.stall_shutdown_seconds)) {
      Response err;
      err.kind = Response::Kind::kError;
      err.code = ErrorCode::kTimeout;
      err.message = fmt::format(
          "collective: tensor '{}' stalled for {:.1f} s waiting for ranks [{}], which never "
          "submitted it (PUSHPULL_STALL_SHUTDOWN_SECONDS={}); check that every rank runs the "
          "same sequence of collectives",
          it->first, waited, fmt::join(missing, ", "), opts_.stall_shutdown_seconds);
      err.tensors.push_back(ResponseTensor{it->first, kNoCacheId, false, {}});
      out.push_back(std::move(err));
      it = pending_.erase(it);
      continue;
    }
    if (now - p.last_warn >= seconds(opts_.stall_warning_seconds)) {
      p.last_warn = now;
      stalls->push_back(StallReport{it->first, missing, waited});
    }
    ++it;
  }
  if (!out.empty() || ready_.empty()) {
    // Errors go out at once; ready items keep their own schedule below.
    if (ready_.empty()) return out;
  }
  // Waiting only helps small allreduces (they may fuse with ones still being
  // submitted). Anything else ready sends the whole batch at once: a large
  // allreduce (runs alone, from its own memory), another op (never fused), an
  // error, or a completed join.
  size_t ready_bytes = 0;
  bool urgent = false;
  for (const auto& i : ready_) {
    ready_bytes += i.spec.bytes();
    urgent = urgent || !fusible(i);
  }
  bool due = urgent || pending_.empty() ||
             now - ready_.front().ready_at >= seconds(opts_.cycle_time_ms / 1000) ||
             ready_bytes >= opts_.fusion_threshold_bytes;
  if (!due) return out;
  for (size_t i = 0; i < ready_.size();) {
    Item& item = ready_[i];
    if (item.response.kind != Response::Kind::kExecute) {
      out.push_back(std::move(item.response));
      ++i;
      continue;
    }
    Response r = std::move(item.response);
    r.tensors.push_back(tensor_of(item.spec));
    size_t bytes = item.spec.bytes();
    size_t j = i + 1;
    if (fusible(item)) {
      while (j < ready_.size()) {
        const Item& nx = ready_[j];
        if (!fusible(nx) || nx.spec.dtype != item.spec.dtype ||
            nx.spec.reduction != item.spec.reduction || nx.spec.postscale != item.spec.postscale ||
            nx.response.joined != r.joined ||
            bytes + nx.spec.bytes() > opts_.fusion_threshold_bytes)
          break;
        bytes += nx.spec.bytes();
        r.tensors.push_back(tensor_of(nx.spec));
        ++j;
      }
    }
    out.push_back(std::move(r));
    i = j;
  }
  ready_.clear();
  return out;
}

bool Coordinator::fusible(const Item& item) const {
  return item.response.kind == Response::Kind::kExecute && item.spec.type == OpType::kAllreduce &&
         item.spec.bytes() < kZeroCopyAllreduceBytes;
}

Clock::time_point Coordinator::next_deadline(Clock::time_point now) const {
  auto next = now + std::chrono::seconds(3600);
  if (!ready_.empty())
    next = std::min(next, ready_.front().ready_at + seconds(opts_.cycle_time_ms / 1000));
  for (const auto& [name, p] : pending_) {
    next = std::min(next, p.last_warn + seconds(opts_.stall_warning_seconds));
    if (opts_.stall_shutdown_seconds > 0)
      next = std::min(next, p.first + seconds(opts_.stall_shutdown_seconds));
  }
  return next;
}

}  // namespace pushpull::collective
