// SPDX-License-Identifier: Apache-2.0
#include "ps/server_store.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <utility>

#include <fmt/format.h>

#include "base/metrics.h"
#include "base/timeline.h"
#include "compress/compressor.h"
#include "ps/checkpoint.h"
#include "ps/protocol.h"
#include "ps/server_store_entry.h"
#include "pushpull/checked.h"
#include "pushpull/kernels.h"
#include "pushpull/log.h"

namespace pushpull::ps {

using namespace server_store_detail;

ServerStore::ServerStore(ServerStoreConfig config, ServerResponder& responder)
    : config_(config),
      responder_(responder),
      value_pool_(8, config.lendable_values),
      executor_(std::max(1, config.threads), fmt::format("pp-server{}", config.server_rank)) {}

ServerStore::~ServerStore() = default;

ServerStore::Entry* ServerStore::find(const PartId& part) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(part);
  return it == entries_.end() ? nullptr : it->second.get();
}

bool ServerStore::has_keys() const {
  std::lock_guard lock(mu_);
  return !entries_.empty();
}

std::shared_ptr<Optimizer> ServerStore::optimizer() const {
  std::lock_guard lock(mu_);
  return optimizer_;
}

void ServerStore::fail(const RequestMeta& m, const Status& s) {
  responder_.reply(m, s, DType::kFloat32, {});
}

void ServerStore::init(const RequestMeta& m, PartId part, std::string name, Payload value,
                       int home) {
  executor_.submit(shard_of(part), [this, m, part, name = std::move(name), value, home]() mutable {
    Entry* made = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = entries_.find(part);
      if (it != entries_.end() && it->second->from_replica && it->second->name == name) {
        // Worker 0 re-sent its init after a fail-over: this backup has it.
        Entry& e = *it->second;
        if (e.replicating) {
          e.init_acks.push_back(m);
        } else {
          responder_.reply(m, Status::ok(), DType::kFloat32, {});
        }
        return;
      }
      if (it != entries_.end() && it->second->restored) {
        Entry& e = *it->second;
        const ArrayView& v = e.value.view;
        if (e.name != name || v.dtype != value.view.dtype || !(v.shape == value.view.shape)) {
          responder_.reply(
              m,
              Status(
                  ErrorCode::kInvalidArgument,
                  fmt::format("init of key {} ({}) does not match checkpoint '{}', which holds "
                              "key {} ({}) under this id: resume with the same program and "
                              "layout (servers, workers, and all on one host or not: that "
                              "sets the chunks)",
                              name, value.view.describe(), restored_from_, e.name, v.describe())),
              DType::kFloat32, {});
          return;
        }
        // Resumed: the checkpoint's value stands; the backups get it now.
        e.restored = false;
        made = &e;
      } else if (it != entries_.end()) {
        std::string what = it->second->name == name
                               ? fmt::format("key {} is already initialised", name)
                               : fmt::format("keys {} and {} have the same id {}; rename one",
                                             it->second->name, name, part.key);
        responder_.reply(m, Status(ErrorCode::kAlreadyExists, what), DType::kFloat32, {});
        return;
      }
      if (!made) {
        auto e = std::make_unique<Entry>();
        e->name = name;
        // A copy, aligned for the kernels (the request's bytes follow the key's name).
        e->value = fresh(value.view.shape, value.view.dtype, lending_pool());
        if (value.view.nbytes())
          std::memcpy(e->value.view.data, value.view.data, value.view.nbytes());
        e->merged_dtype = is_half(e->value.view.dtype) ? DType::kFloat32 : e->value.view.dtype;
        e->size_for(config_.num_workers);
        e->home = home >= 0 ? home : config_.server_rank;
        made = e.get();
        entries_.emplace(part, std::move(e));
      }
    }
    made->init_acks.push_back(m);
    publish(part, *made);
  });
}

void ServerStore::push(const RequestMeta& m, PartId part, Payload grad, bool compressed,
                       uint32_t seq24) {
  executor_.submit(shard_of(part), [this, m, part, grad = std::move(grad), compressed, seq24] {
    Entry* e = find(part);
    if (!e)
      return fail(m, Status(ErrorCode::kNotFound,
                            fmt::format("push to key id {} that was never initialised", part.key)));
    if (m.worker < 0 || m.worker >= config_.num_workers)
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("push from unknown worker {}", m.worker)));
    const ArrayView& v = e->value.view;
    if (!compressed && (grad.view.dtype != v.dtype || grad.view.numel() != v.numel()))
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("push to key {}: got {}, the key holds {}", e->name,
                                        grad.view.describe(), v.describe())));
    if (!config_.sync && !optimizer())
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("dist_async push to key {} before set_optimizer: an "
                                        "asynchronous store needs an optimizer on the servers",
                                        e->name)));
    uint64_t seq = 0;
    if (seq24 != 0) {
      seq = unwrap_seq(seq24, e->last_seq[m.worker] + 1);
      if (seq <= e->applied_seq[m.worker]) {
        // Applied (and replicated) already: a worker re-sent the push of an
        // unfinished round after a fail-over. Counting it again would be wrong.
        PP_DEBUG("duplicate push {} of key {} from worker {} dropped", seq, e->name, m.worker);
        if (m.pull_back) return pull_when_applied(*e, m, {});
        return responder_.reply(m, Status::ok(), DType::kFloat32, {});
      }
      if (seq <= e->last_seq[m.worker] && e->rejoined[m.worker] && adopt(*e, m, seq)) return;
      if (seq <= e->last_seq[m.worker])
        return fail(m, Status(ErrorCode::kProtocolError,
                              fmt::format("push {} of key {} from worker {} arrived twice", seq,
                                          e->name, m.worker)));
      e->last_seq[m.worker] = seq;
    }
    // This worker is a round ahead, or the round is being replicated: hold it.
    if ((config_.sync && e->pushed[m.worker]) || e->replicating) {
      if (e->held_by[m.worker] >= config_.max_queued_per_worker)
        return fail(m, Status(ErrorCode::kProtocolError,
                              fmt::format("push to key {}: worker {} already has {} pushes held "
                                          "for later rounds",
                                          e->name, m.worker, e->held_by[m.worker])));
      e->received[m.worker]++;
      e->held_by[m.worker]++;
      e->held.push_back({m, grad, compressed, seq});
      return;
    }
    e->received[m.worker]++;
    try {
      apply_push(*e, grad, compressed);
    } catch (...) {
      e->received[m.worker]--;
      return fail(m, Status::from_current_exception());
    }
    e->pushed[m.worker] = 1;
    e->round_pushes.push_back(m);
    e->round_seqs.push_back(seq);
    // Async: every push is a round of its own.
    if (!config_.sync || ++e->pushed_this_round == config_.num_workers) apply_round(part, *e);
  });
}

// Adds one worker's push into the round's sum.
void ServerStore::apply_push(Entry& e, const Payload& grad, bool compressed) {
  PP_TIMELINE_SPAN(timeline::process_node(), e.name, "SUM", grad.view.nbytes());  // timeline hook
  PP_METRIC_ADD(kServerPushes, 1);                                                // metrics hook
  const ArrayView& v = e.value.view;
  const size_t n = static_cast<size_t>(v.numel());
  const bool first = e.pushed_this_round == 0;
  if (first && is_half(v.dtype)) {
    if (e.merged32.empty()) e.merged32 = Array(v.shape, DType::kFloat32);
    e.merged = Payload{e.merged32.view(), nullptr};
  }
  if (compressed) {  // any type of compress/compressor.h: decoded into the sum
    if (!is_floating(v.dtype))
      throw InvalidArgument(
          fmt::format("gradient compression needs a floating-point key; {} holds {}", e.name,
                      dtype_name(v.dtype)));
    if (first && !is_half(v.dtype)) e.merged = fresh(v.shape, e.merged_dtype, lending_pool());
    if (first) std::memset(e.merged.view.data, 0, n * dtype_size(e.merged_dtype));
    const std::span<const std::byte> bytes{static_cast<const std::byte*>(grad.view.data),
                                           grad.view.nbytes()};
    Status decoded;
    if (e.merged_dtype == DType::kFloat32) {
      decoded = compress::decode_add(bytes, e.merged.view.as<float>(), n);
    } else {  // float64 keys: decoded in float32, added in float64
      std::vector<float> part(n, 0.0f);
      std::vector<double> wide(n);
      decoded = compress::decode_add(bytes, part.data(), n);
      if (decoded.is_ok()) {
        convert(DType::kFloat64, wide.data(), DType::kFloat32, part.data(), n);
        reduce_sum(DType::kFloat64, e.merged.view.data, wide.data(), n);
      }
    }
    if (!decoded.is_ok())
      throw ProtocolError(fmt::format("push to key {}: {}", e.name, decoded.message()));
    return;
  }
  if (first && e.merged_dtype == v.dtype) {
    e.merged = grad;  // adopt the received buffer: no copy
    return;
  }
  if (first) {
    convert(DType::kFloat32, e.merged.view.data, v.dtype, grad.view.data, n);
  } else if (e.merged_dtype == v.dtype) {
    reduce_sum(v.dtype, e.merged.view.data, grad.view.data, n);
  } else {  // a 16-bit push into the float32 sum, in blocks on the stack
    constexpr size_t kBlock = 4096;
    alignas(64) float tmp[kBlock];
    for (size_t i = 0; i < n; i += kBlock) {
      size_t k = std::min(kBlock, n - i);
      convert(DType::kFloat32, tmp, v.dtype,
              static_cast<const std::byte*>(grad.view.data) + i * dtype_size(v.dtype), k);
      reduce_sum(DType::kFloat32, e.merged.view.as<float>() + i, tmp, k);
    }
  }
}

void ServerStore::apply_round(const PartId& part, Entry& e) {
  PP_TIMELINE_SPAN(timeline::process_node(), e.name, "UPDATE");  // timeline hook
  PP_METRIC_ADD(kServerRounds, 1);                               // metrics hook
  Status status;
  try {
    const size_t n = static_cast<size_t>(e.value.view.numel());
    if (auto opt = optimizer()) {
      if (!e.restored_states.empty()) {
        opt->merge_states(e.restored_states, restored_from_);
        e.restored_states.clear();
      }
      if (e.value_shared() && e.merged.owner && !e.merged.read_only &&
          e.merged.view.dtype == e.value.view.dtype) {
        // Out of place, into the round's sum (ours: an adopted push or a
        // fresh buffer), which becomes the value: no copy of the held one.
        opt->update(state_key(part), e.value.view, e.merged.view, e.merged.view);
        e.value = std::move(e.merged);
      } else {
        e.own_value(lending_pool());
        opt->update(state_key(part), e.value.view, e.merged.view);
      }
    } else if (e.merged_dtype == e.value.view.dtype && e.merged.owner) {
      e.value = std::move(e.merged);  // the sum becomes the value: no copy
    } else {
      e.own_value(lending_pool());
      convert(e.value.view.dtype, e.value.view.data, e.merged_dtype, e.merged.view.data, n);
    }
  } catch (...) {
    status = Status::from_current_exception();
    PP_ERROR("update of key {} failed: {}", e.name, status.to_string());
  }
  e.merged = Payload{};  // release an adopted push buffer back to its pool
  if (status.is_ok() && config_.sync) count_round(part, e);
  e.round_status = status;
  for (size_t i = 0; i < e.round_pushes.size(); ++i)
    if (status.is_ok() && e.round_seqs[i] > 0)
      e.applied_seq[e.round_pushes[i].worker] = e.round_seqs[i];
  publish(part, e);
}

std::shared_ptr<ReplicaState> ServerStore::state_of(const PartId& part, Entry& e) {
  auto state = std::make_shared<ReplicaState>();
  state->name = e.name;
  state->home = e.home;
  state->value = e.value;
  state->applied_seq = e.applied_seq;
  state->optimizer_states = optimizer_states_of(part, e);
  return state;
}

void ServerStore::transfer(
    std::function<bool(const PartId&, int home)> wanted,
    std::function<void(const PartId&, std::shared_ptr<const ReplicaState>, std::function<void()>)>
        send,
    std::function<void()> all_done) {
  std::vector<PartId> parts;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, e] : entries_)
      parts.push_back(id);
  }
  auto left = std::make_shared<std::atomic<size_t>>(parts.size() + 1);
  auto finish = [left, all_done] {
    if (--*left == 0) all_done();
  };
  for (const PartId& part : parts)
    executor_.submit(shard_of(part), [this, part, wanted, send, finish] {
      Entry* e = find(part);
      if (!e || e->restored || !wanted(part, e->home)) return finish();
      send(part, state_of(part, *e), finish);
    });
  finish();
}

void ServerStore::publish(const PartId& part, Entry& e) {
  if (config_.replicate) {
    auto state = state_of(part, e);
    e.replicating = true;
    bool waiting = responder_.replicate(part, std::move(state), [this, part] {
      executor_.submit(shard_of(part), [this, part] {
        if (Entry* e = find(part)) {
          e->replicating = false;
          finish_round(part, *e);
        }
      });
    });
    if (waiting) return;
    e.replicating = false;
  }
  finish_round(part, e);
}

void ServerStore::finish_round(const PartId& part, Entry& e) {
  for (const RequestMeta& m : e.init_acks)
    responder_.reply(m, Status::ok(), DType::kFloat32, {});
  e.init_acks.clear();
  Status status = std::move(e.round_status);
  e.round_status = Status();
  for (const RequestMeta& m : e.round_pushes) {
    e.applied[m.worker]++;
    acknowledge_push(e, m, status);
  }
  e.round_pushes.clear();
  e.round_seqs.clear();
  std::fill(e.pushed.begin(), e.pushed.end(), 0);
  e.pushed_this_round = 0;
  answer_ready_pulls(e);
  for (const RequestMeta& m : std::exchange(e.rejoins, {}))
    answer_rejoin(e, m);
  // Held pushes open the next round, in arrival order (per worker FIFO).
  std::deque<HeldPush> held = std::move(e.held);
  e.held.clear();
  bool failed_held = false;
  while (!held.empty()) {
    HeldPush h = std::move(held.front());
    held.pop_front();
    if (e.pushed[h.meta.worker]) {
      e.held.push_back(std::move(h));
      continue;
    }
    e.held_by[h.meta.worker]--;
    try {
      apply_push(e, h.grad, h.compressed);
    } catch (...) {
      // Answered (with its error), so it counts as finished: a pull that
      // arrived after it was held waits for `applied` to include it, and
      // taking it back out of `received` instead would leave that pull
      // waiting for a push that never comes.
      e.applied[h.meta.worker]++;
      failed_held = true;
      fail(h.meta, Status::from_current_exception());
      continue;
    }
    e.pushed[h.meta.worker] = 1;
    e.round_pushes.push_back(h.meta);
    e.round_seqs.push_back(h.seq);
    // Async: every push is a round of its own.
    if (!config_.sync || ++e.pushed_this_round == config_.num_workers) {
      for (auto& rest : held)
        e.held.push_back(std::move(rest));
      return apply_round(part, e);
    }
  }
  if (failed_held) answer_ready_pulls(e);
}

void ServerStore::acknowledge_push(Entry& e, const RequestMeta& m, const Status& status) {
  if (!m.pull_back || !status.is_ok()) return responder_.reply(m, status, DType::kFloat32, {});
  // Answered by answer_ready_pulls right after the round's acknowledgements,
  // behind this worker's pulls that were already waiting.
  e.waiting.push_back({m, {}, e.applied[m.worker]});
}

void ServerStore::answer_ready_pulls(Entry& e) {
  if (e.replicating) return;
  auto waiting = std::move(e.waiting);
  e.waiting.clear();
  for (auto& w : waiting) {
    if (e.applied[w.meta.worker] >= w.needs_applied) {
      answer_pull(e, w.meta, w.ranges);
    } else {
      e.waiting.push_back(std::move(w));
    }
  }
}

void ServerStore::answer_pull(Entry& e, const RequestMeta& m, const std::vector<Range>& ranges) {
  PP_TIMELINE_SPAN(timeline::process_node(), e.name, "PULL_REPLY");  // timeline hook
  PP_METRIC_ADD(kServerPulls, 1);                                    // metrics hook
  const ArrayView& v = e.value.view;
  const size_t esize = dtype_size(v.dtype);
  auto* base = static_cast<const std::byte*>(v.data);
  if (ranges.empty()) {
    // The value itself, kept alive (and unchanged: copy on write) until sent.
    responder_.reply(m, Status::ok(), v.dtype, {base, v.nbytes()}, e.value.owner);
    return;
  }
  // Ranges are distinct rows (the worker deduplicates), so a reply is never
  // larger than the value: more is a request for unbounded memory.
  int64_t total = 0;
  for (const Range& r : ranges)
    if (r.count < 0 || !checked_add(total, r.count, &total) || total > v.numel())
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("pull of key {}: {} ranges ask for more than its {} "
                                        "elements",
                                        e.name, ranges.size(), v.numel())));
  auto gathered = std::make_shared<std::vector<std::byte>>();
  gathered->reserve(static_cast<size_t>(total) * esize);
  for (const Range& r : ranges) {
    if (!range_inside(r.begin, r.count, v.numel()))
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("pull of key {}: range (begin {}, count {}) is outside "
                                        "its {} elements",
                                        e.name, r.begin, r.count, v.numel())));
    gathered->insert(gathered->end(), base + r.begin * esize, base + (r.begin + r.count) * esize);
  }
  responder_.reply(m, Status::ok(), v.dtype, *gathered, gathered);
}

void ServerStore::pull(const RequestMeta& m, PartId part, std::vector<Range> ranges) {
  executor_.submit(shard_of(part), [this, m, part, ranges = std::move(ranges)] {
    Entry* e = find(part);
    if (!e)
      return fail(m, Status(ErrorCode::kNotFound,
                            fmt::format("pull of key id {} that was never initialised", part.key)));
    if (m.worker < 0 || m.worker >= config_.num_workers)
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("pull from unknown worker {}", m.worker)));
    pull_when_applied(*e, m, ranges);
  });
}

void ServerStore::pull_when_applied(Entry& e, const RequestMeta& m, std::vector<Range> ranges) {
  if (e.applied[m.worker] < e.received[m.worker] || e.replicating) {
    auto queued =
        std::count_if(e.waiting.begin(), e.waiting.end(),
                      [&](const Entry::WaitingPull& w) { return w.meta.worker == m.worker; });
    if (queued >= config_.max_queued_per_worker)
      return fail(m, Status(ErrorCode::kProtocolError,
                            fmt::format("pull of key {}: worker {} already has {} pulls waiting",
                                        e.name, m.worker, queued)));
    e.waiting.push_back({m, std::move(ranges), e.received[m.worker]});
    return;
  }
  answer_pull(e, m, ranges);
}

void ServerStore::rejoin(const RequestMeta& m, PartId part) {
  executor_.submit(shard_of(part), [this, m, part] {
    Entry* e = find(part);
    if (!e)
      return fail(m, Status(ErrorCode::kNotFound,
                            fmt::format("rejoin: key id {} was never initialised (a restarted "
                                        "worker initialises the keys the job has)",
                                        part.key)));
    if (m.worker < 0 || m.worker >= config_.num_workers)
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            fmt::format("rejoin from unknown worker {}", m.worker)));
    const int w = m.worker;
    e->rejoined[w] = 1;
    // The old process's requests: their ids mean nothing to the replacement.
    std::erase_if(e->waiting, [&](const Entry::WaitingPull& p) { return p.meta.worker == w; });
    for (RequestMeta& r : e->round_pushes)
      if (r.worker == w) r.request_id = 0;
    for (auto& h : e->held)
      if (h.meta.worker == w) h.meta.request_id = 0;
    for (RequestMeta& r : e->init_acks)
      if (r.worker == w) r.request_id = 0;
    if (e->replicating) {
      e->rejoins.push_back(m);
      return;
    }
    answer_rejoin(*e, m);
  });
}

void ServerStore::answer_rejoin(Entry& e, const RequestMeta& m) {
  const int w = m.worker;
  const ArrayView& v = e.value.view;
  auto out = std::make_shared<std::vector<std::byte>>(
      encode_rejoin(e.applied_seq[w], std::max(e.last_seq[w], e.applied_seq[w])));
  auto* base = static_cast<const std::byte*>(v.data);
  out->insert(out->end(), base, base + v.nbytes());
  responder_.reply(m, Status::ok(), v.dtype, *out, out);
}

bool ServerStore::adopt(Entry& e, const RequestMeta& m, uint64_t seq) {
  for (size_t i = 0; i < e.round_pushes.size(); ++i)
    if (e.round_pushes[i].worker == m.worker && e.round_seqs[i] == seq) {
      e.round_pushes[i] = m;
      return true;
    }
  for (auto& h : e.held)
    if (h.meta.worker == m.worker && h.seq == seq) {
      h.meta = m;
      return true;
    }
  return false;
}

void ServerStore::on_all_threads(std::function<void()> fn) {
  // Every thread stops at a shared latch; the last to arrive runs fn while the
  // others wait, so fn sees all earlier work and no later work overtakes it.
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    bool done = false;
  };
  auto gate = std::make_shared<Gate>();
  int threads = executor_.num_threads();
  for (int t = 0; t < threads; ++t) {
    executor_.submit(static_cast<uint64_t>(t), [gate, threads, fn] {
      std::unique_lock lock(gate->mu);
      if (++gate->arrived == threads) {
        fn();
        gate->done = true;
        gate->cv.notify_all();
      } else {
        gate->cv.wait(lock, [&] { return gate->done; });
      }
    });
  }
}

void ServerStore::set_optimizer(const RequestMeta& m, const OptimizerSpec& spec) {
  std::shared_ptr<Optimizer> opt;
  try {
    opt = create_optimizer(spec);
  } catch (...) {
    return fail(m, Status::from_current_exception());
  }
  on_all_threads([this, m, opt] {
    {
      std::lock_guard lock(mu_);
      optimizer_ = opt;
    }
    responder_.reply(m, Status::ok(), DType::kUInt8, {});
  });
}

void ServerStore::save_states(const RequestMeta& m) {
  on_all_threads([this, m] {
    auto opt = optimizer();
    if (!opt)
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            "save_optimizer_states: no optimizer is set on the servers"));
    auto bytes = std::make_shared<std::string>(opt->save_states());
    responder_.reply(m, Status::ok(), DType::kUInt8,
                     {reinterpret_cast<const std::byte*>(bytes->data()), bytes->size()}, bytes);
  });
}

void ServerStore::load_states(const RequestMeta& m, std::string bytes) {
  on_all_threads([this, m, bytes = std::move(bytes)] {
    auto opt = optimizer();
    if (!opt)
      return fail(m, Status(ErrorCode::kInvalidArgument,
                            "load_optimizer_states: set the optimizer before loading its states"));
    try {
      opt->load_states(bytes, fmt::format("server {}", config_.server_rank));
    } catch (...) {
      return fail(m, Status::from_current_exception());
    }
    responder_.reply(m, Status::ok(), DType::kUInt8, {});
  });
}

}  // namespace pushpull::ps
