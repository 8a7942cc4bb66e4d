// SPDX-License-Identifier: Apache-2.0
// Private to ServerStore's source files (server_store.cpp and
// server_store_round.cpp: pushes and rounds; server_store_pull.cpp: pulls;
// server_store_recovery.cpp: replicas and checkpoints): the per-part state
// and the small helpers they use. Not thread-safe by itself: an Entry is
// touched only under ServerStore's locking rules (server_store.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "compress/settings.h"
#include "ps/protocol.h"
#include "ps/server_store.h"
#include "pushpull/array.h"

namespace pushpull::ps {

namespace server_store_detail {

struct HeldPush {
  RequestMeta meta;
  Payload grad;
  bool compressed;
  uint64_t seq;       // full sequence number, 0 = none
  bool late = false;  // backup workers: its round closed without it (dropped)
};

inline uint64_t shard_of(const PartId& p) {
  return mix_hash(PartIdHash()(p));
}

// The optimizer's per-part state key (stable across jobs of the same layout).
inline Key state_key(const PartId& p) {
  return Key(static_cast<int64_t>(mix_hash(p.key ^ mix_hash(static_cast<uint64_t>(p.begin))) >> 1));
}

// An owned, writable buffer for `shape` elements of `dtype`: from `pool`
// (lendable memory, transport/shm/lend.h) when given and the value is 256 KiB or more.
inline Payload fresh(const Shape& shape, DType dtype, transport::BufferPool* pool = nullptr) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (pool && bytes >= transport::BufferPool::kLendMinBytes) {
    auto b = std::make_shared<transport::Buffer>(pool->acquire(bytes));
    return Payload{ArrayView(b->data(), dtype, shape), b};
  }
  auto a = std::make_shared<Array>(shape, dtype);
  return Payload{a->view(), a};
}

}  // namespace server_store_detail

struct ServerStore::Entry {
  using HeldPush = server_store_detail::HeldPush;
  std::string name;
  Payload value;                         // may be shared with pull replies in flight: copy on write
  Payload merged;                        // the round's sum (adopted first push, or owned)
  DType merged_dtype = DType::kFloat32;  // float32 for 16-bit values
  Array merged32;                        // reused float32 sum for 16-bit values
  int pushed_this_round = 0;
  std::vector<char> pushed;               // per worker: pushed in the open round
  std::vector<int64_t> received;          // per worker: pushes received
  std::vector<int64_t> applied;           // per worker: pushes applied
  std::deque<HeldPush> held;              // pushes for the next round
  std::vector<int> held_by;               // per worker: pushes in `held`
  std::vector<RequestMeta> round_pushes;  // acknowledged when the round is applied
  std::vector<uint64_t> round_seqs;       // their sequence numbers (0 = none)
  std::vector<uint64_t> last_seq;         // per worker: highest push sequence number accepted
  std::vector<uint64_t> applied_seq;      // per worker: highest applied (replicated)
  std::vector<char> rejoined;             // per worker: a replacement asked (rejoin)
  std::vector<RequestMeta> rejoins;       // rejoin requests waiting for the backups
  int home = -1;
  bool replicating = false;            // waiting for the backups: acks and pulls wait
  bool from_replica = false;           // made by install_replica (a re-sent init is a no-op)
  std::vector<RequestMeta> init_acks;  // inits answered when replicated
  int64_t rounds = 0;                  // sync rounds completed (checkpoints)
  // Backup workers: earlier values by round (a round's number is the push
  // sequence number every worker gives its push of it), kept for workers
  // that are behind; oldest first.
  std::deque<std::pair<uint64_t, Payload>> history;
  // Compressed pulls (server_store_pull.cpp): the codec of the open round's
  // pushes (kNone when any was not compressed with the same settings), the
  // server's own error feedback, and the current value's encoded form that
  // every worker's pull gets (empty: pulls answer the value itself).
  compress::Settings round_codec;
  compress::Settings pull_codec;
  std::vector<float> pull_residual;
  Payload pull_wire;
  bool restored = false;        // from a checkpoint, not yet initialised by a worker
  std::string restored_states;  // its optimizer states, until merged
  void size_for(int workers) {
    pushed.assign(workers, 0);
    received.assign(workers, 0);
    applied.assign(workers, 0);
    held_by.assign(workers, 0);
    last_seq.assign(workers, 0);
    applied_seq.assign(workers, 0);
    rejoined.assign(workers, 0);
  }
  struct WaitingPull {
    RequestMeta meta;
    std::vector<Range> ranges;
    int64_t needs_applied;
  };
  std::vector<WaitingPull> waiting;
  Status round_status;  // the update's outcome, told to the round's pushers

  // Backup workers: how many closed rounds worker w has not pushed yet (their
  // sequence numbers are marked applied when they close without it).
  uint64_t rounds_behind(int w) const {
    return applied_seq[w] > last_seq[w] ? applied_seq[w] - last_seq[w] : 0;
  }
  // The round of the current value: with backup workers every close marks
  // every worker's number of it applied.
  uint64_t round_no() const {
    return applied_seq.empty() ? 0 : *std::max_element(applied_seq.begin(), applied_seq.end());
  }
  // The value worker w sees: its own round's (an earlier one when behind).
  const Payload& value_for(int w) const {
    if (rounds_behind(w) == 0) return value;
    for (const auto& [round, v] : history)
      if (round == last_seq[w]) return v;
    return value;  // not kept (cannot happen while backup_max_late holds)
  }
  // Drops the kept values no worker that is behind still needs.
  void trim_history() {
    uint64_t oldest = UINT64_MAX;
    for (size_t w = 0; w < applied_seq.size(); ++w)
      if (rounds_behind(static_cast<int>(w)) > 0) oldest = std::min(oldest, last_seq[w]);
    while (!history.empty() && history.front().first < oldest)
      history.pop_front();
  }
  // Whether `value` must not be written in place: another reader holds it
  // (a pull reply or replica in flight, a backup, a checkpoint) or it is
  // another process's memory.
  bool value_shared() const { return value.owner.use_count() > 1 || value.read_only; }
  // Makes `value` exclusively ours and writable before writing it (a new
  // buffer from `pool` when one is needed and given).
  void own_value(transport::BufferPool* pool) {
    if (value_shared()) {
      Payload copy = server_store_detail::fresh(value.view.shape, value.view.dtype, pool);
      std::memcpy(copy.view.data, value.view.data, value.view.nbytes());
      value = std::move(copy);
    }
  }
};

}  // namespace pushpull::ps
