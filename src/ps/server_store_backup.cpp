// SPDX-License-Identifier: Apache-2.0
// ServerStore's backup workers (docs/ps.md "Backup workers"; Chen et al.,
// "Revisiting distributed synchronous SGD"): a sync round closes after the
// first N - b pushes, its sum is scaled to what N pushes give in
// expectation, and the pushes that come after it closed are answered and
// dropped. Runs on the part's thread, like the rest of the store.
#include <algorithm>

#include <fmt/format.h>

#include "base/metrics.h"
#include "ps/server_store.h"
#include "ps/server_store_entry.h"
#include "pushpull/kernels.h"
#include "pushpull/log.h"

namespace pushpull::ps {

void ServerStore::check_backup_config(const ServerStoreConfig& config) {
  if (config.backup_workers < 0 ||
      (config.backup_workers > 0 && config.sync && config.backup_workers >= config.num_workers))
    throw InvalidArgument(fmt::format(
        "{} backup workers with {} workers: a dist_sync round closes after num_workers - "
        "backup pushes, so backup workers must be 0 .. num_workers - 1 "
        "(PUSHPULL_PS_BACKUP_WORKERS)",
        config.backup_workers, config.num_workers));
  if (config.backup_workers > 0 && config.backup_max_late < 1)
    throw InvalidArgument("PUSHPULL_PS_BACKUP_MAX_LATE must be at least 1");
}

int ServerStore::round_quorum() const {
  return config_.num_workers - std::clamp(config_.backup_workers, 0, config_.num_workers - 1);
}

bool ServerStore::round_ready(const Entry& e) const {
  if (e.pushed_this_round >= config_.num_workers) return true;
  if (config_.backup_workers <= 0 || e.pushed_this_round < round_quorum()) return false;
  // Nobody may fall more than backup_max_late rounds behind: the round waits
  // for such a worker's push instead (bounded staleness, bounded history).
  for (int w = 0; w < config_.num_workers; ++w)
    if (!e.pushed[w] && e.rounds_behind(w) + 1 > static_cast<uint64_t>(config_.backup_max_late))
      return false;
  return true;
}

void ServerStore::late_push(const PartId& part, Entry& e, const RequestMeta& m) {
  if (e.replicating) {
    // The round it missed may be the one on its way to the backups: the
    // answer waits until they hold it (as an acknowledgement always does).
    if (e.held_by[m.worker] >= config_.max_queued_per_worker)
      return fail(m, Status(ErrorCode::kProtocolError,
                            fmt::format("push to key {}: worker {} already has {} pushes held "
                                        "for later rounds",
                                        e.name, m.worker, e.held_by[m.worker])));
    e.received[m.worker]++;
    e.held_by[m.worker]++;
    e.held.push_back({m, Payload{}, false, e.last_seq[m.worker], true});
    return;
  }
  drop_late(e, m);
  if (e.pushed_this_round > 0 && round_ready(e)) apply_round(part, e);
}

void ServerStore::drop_late(Entry& e, const RequestMeta& m) {
  late_dropped_.fetch_add(1, std::memory_order_relaxed);
  PP_METRIC_ADD(kPsLatePushesDropped, 1);  // metrics hook
  PP_DEBUG("late push of key {} from worker {} dropped: its round closed without it", e.name,
           m.worker);
  // The worker goes on with its round's value (Entry::value_for).
  if (m.pull_back) return pull_when_applied(e, m, {});
  responder_.reply(m, Status::ok(), DType::kFloat32, {});
}

void ServerStore::open_backup_round(Entry& e) {
  const int arrived = e.pushed_this_round;
  if (arrived > 0 && arrived < config_.num_workers && e.merged.view.data)
    scale(e.merged_dtype, e.merged.view.data,
          static_cast<double>(config_.num_workers) / static_cast<double>(arrived),
          static_cast<size_t>(e.value.view.numel()));
  // Kept when a worker is or will be behind this round: the update then
  // writes a new buffer (value_shared) instead of this one.
  bool keep = false;
  for (int w = 0; w < config_.num_workers; ++w)
    keep = keep || !e.pushed[w] || e.rounds_behind(w) > 0;
  if (keep) {
    e.history.emplace_back(e.round_no(), e.value);
  } else {
    e.history.clear();
  }
}

void ServerStore::close_backup_round(Entry& e) {
  for (int w = 0; w < config_.num_workers; ++w)
    if (!e.pushed[w]) {
      // Its push of this round is late: the number it will carry is applied.
      e.applied_seq[w] = std::max(e.applied_seq[w], e.last_seq[w]) + 1;
    }
  e.trim_history();
}

void ServerStore::install_backup_state(Entry& e, const ReplicaState& state, bool existed) {
  const uint64_t round = state.applied_seq.empty() ? 0
                                                   : *std::max_element(state.applied_seq.begin(),
                                                                       state.applied_seq.end());
  // Each replicated round's predecessor is kept as the primary keeps it, so
  // a promoted backup answers a worker that is behind with its round's value.
  if (existed && e.value.view.data && round > e.round_no())
    e.history.emplace_back(e.round_no(), e.value);
  e.applied_seq = state.applied_seq;
  e.last_seq = state.applied_seq;
  if (state.behind.size() == state.applied_seq.size())
    for (size_t w = 0; w < state.behind.size(); ++w)
      e.last_seq[w] -= std::min(state.behind[w], e.last_seq[w]);
  e.trim_history();
}

void ServerStore::add_behind(const Entry& e, ReplicaState& state) const {
  if (config_.backup_workers <= 0) return;
  for (int w = 0; w < config_.num_workers; ++w)
    if (e.rounds_behind(w) > 0) {
      state.behind.assign(config_.num_workers, 0);
      for (int v = 0; v < config_.num_workers; ++v)
        state.behind[v] = e.rounds_behind(v);
      return;
    }
}

}  // namespace pushpull::ps
