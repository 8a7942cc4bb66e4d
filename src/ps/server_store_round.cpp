// SPDX-License-Identifier: Apache-2.0
// ServerStore's rounds (server_store.h): adding a push into the round's sum,
// applying a round (the optimizer's update or the sum as the value),
// publishing it to the backups, and finishing it (acknowledgements, waiting
// pulls, the held pushes that open the next round).
#include <algorithm>
#include <cstring>
#include <deque>
#include <utility>

#include <fmt/format.h>

#include "base/metrics.h"
#include "base/timeline.h"
#include "compress/compressor.h"
#include "ps/server_store.h"
#include "ps/server_store_entry.h"
#include "pushpull/kernels.h"
#include "pushpull/log.h"

namespace pushpull::ps {

using namespace server_store_detail;

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
    note_round_codec(e, first, compress::wire_settings(bytes, n));
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
  note_round_codec(e, first, std::nullopt);
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
  const bool backup = config_.sync && config_.backup_workers > 0;
  e.pull_wire = Payload{};  // the value changes: its encoded form is gone
  if (backup) open_backup_round(e);
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
      compress_for_pulls(e);
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
  if (backup) close_backup_round(e);
  publish(part, e);
}

std::shared_ptr<ReplicaState> ServerStore::state_of(const PartId& part, Entry& e) {
  auto state = std::make_shared<ReplicaState>();
  state->name = e.name;
  state->home = e.home;
  state->value = e.value;
  if (config_.lendable_values && e.value.view.nbytes() > 0)
    state->lent = value_pool_.find_lent(e.value.view.data, e.value.view.nbytes());
  state->applied_seq = e.applied_seq;
  state->optimizer_states = optimizer_states_of(part, e);
  add_behind(e, *state);
  return state;
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
    if (e.pushed[h.meta.worker] && !h.late) {
      e.held.push_back(std::move(h));
      continue;
    }
    e.held_by[h.meta.worker]--;
    if (h.late) {  // backup workers: its round closed without it
      e.applied[h.meta.worker]++;
      failed_held = true;
      drop_late(e, h.meta);
      continue;
    }
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
    ++e.pushed_this_round;
    // Async: every push is a round of its own. With backup workers every
    // held push that can join this round does (they all arrived in time).
    if (!config_.sync || (config_.backup_workers == 0 && round_ready(e))) {
      for (auto& rest : held)
        e.held.push_back(std::move(rest));
      return apply_round(part, e);
    }
  }
  if (config_.sync && config_.backup_workers > 0 && round_ready(e)) return apply_round(part, e);
  if (failed_held) answer_ready_pulls(e);
}

void ServerStore::acknowledge_push(Entry& e, const RequestMeta& m, const Status& status) {
  if (!m.pull_back || !status.is_ok()) return responder_.reply(m, status, DType::kFloat32, {});
  // Answered by answer_ready_pulls right after the round's acknowledgements,
  // behind this worker's pulls that were already waiting.
  e.waiting.push_back({m, {}, e.applied[m.worker]});
}

}  // namespace pushpull::ps
