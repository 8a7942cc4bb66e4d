// SPDX-License-Identifier: Apache-2.0
// ServerStore's recovery paths (docs/ps.md, "Fault tolerance", "Checkpoints"):
// a restarted worker rejoining, installing a primary's replica on a backup,
// writing this server's ranges every N rounds, and restoring them on --resume.
#include <algorithm>

#include <fmt/format.h>

#include "base/private_file.h"
#include "ps/checkpoint.h"
#include "ps/server_store.h"
#include "ps/server_store_entry.h"
#include "pushpull/log.h"

namespace pushpull::ps {

using namespace server_store_detail;

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
    // What the replacement adopts must be on every live server of the
    // range: this one may hold it only as the replica of a primary that
    // died before the other backups had it (found by the simulation, seed
    // 1232: the replacement resumed after a round the next primary never
    // had, and pulled values a round behind).
    acknowledge_after_republish(part, *e, [this, m](Entry& e) { answer_rejoin(e, m); });
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

void ServerStore::install_replica(PartId part, ReplicaState state,
                                  std::function<void(const Status&)> done,
                                  std::function<Status(ReplicaState&)> fill) {
  executor_.submit(shard_of(part), [this, part, state = std::move(state), done = std::move(done),
                                    fill = std::move(fill)]() mutable {
    if (fill)
      if (Status filled = fill(state); !filled) return done(filled);
    Status st;
    try {
      if (static_cast<int>(state.applied_seq.size()) != config_.num_workers)
        throw ProtocolError(fmt::format("replica of key {} names {} workers; the job has {}",
                                        state.name, state.applied_seq.size(), config_.num_workers));
      std::lock_guard lock(mu_);
      auto& slot = entries_[part];
      const bool existed = slot != nullptr;
      if (!slot) {
        slot = std::make_unique<Entry>();
        slot->size_for(config_.num_workers);
      } else if (slot->value.view.dtype != state.value.view.dtype ||
                 slot->value.view.numel() != state.value.view.numel()) {
        throw InvalidArgument(fmt::format("replica of key {} is {}; this server holds {}",
                                          state.name, state.value.view.describe(),
                                          slot->value.view.describe()));
      }
      Entry& e = *slot;
      e.name = state.name;
      e.home = state.home;
      e.from_replica = true;
      if (config_.sync && config_.backup_workers > 0) {
        install_backup_state(e, state, existed);  // before the value is replaced
      } else {
        e.applied_seq = state.applied_seq;
        e.last_seq = state.applied_seq;
      }
      e.value = state.value;  // adopted: the received buffer is the value
      // Compressed pulls: the primary's residual is not replicated; this one
      // encodes its first round afresh (docs/kvstore.md "Compressed pulls").
      e.pull_wire = Payload{};
      e.pull_residual.clear();
      e.merged_dtype = is_half(e.value.view.dtype) ? DType::kFloat32 : e.value.view.dtype;
      // What the primary replicated replaces what a resume restored here.
      e.restored = false;
      e.restored_states.clear();
      // Optimizer states that arrive before set_optimizer (a resumed job's
      // init is replicated before it) are kept until the optimizer is set:
      // the first round merges them, and they go on to further backups.
      if (!state.optimizer_states.empty() && !optimizer_)
        e.restored_states = state.optimizer_states;
      // A promoted backup starts with no round open: what it holds is what
      // every worker's acknowledged pushes made.
      for (int w = 0; w < config_.num_workers; ++w)
        e.received[w] = e.applied[w];
    } catch (...) {
      st = Status::from_current_exception();
    }
    if (st.is_ok() && !state.optimizer_states.empty()) {
      try {
        // (Without an optimizer they were kept in the entry, above.)
        if (auto opt = optimizer())
          opt->merge_states(state.optimizer_states, fmt::format("replica of key {}", state.name));
      } catch (...) {
        st = Status::from_current_exception();
      }
    }
    done(st);
  });
}

struct ServerStore::PendingCheckpoint {
  std::vector<CheckpointPart> parts;
};

std::string ServerStore::optimizer_states_of(const PartId& part, Entry& e) {
  if (!e.restored_states.empty()) return e.restored_states;
  auto opt = optimizer();
  return opt ? opt->save_key_states(state_key(part)) : std::string();
}

void ServerStore::count_round(const PartId& part, Entry& e) {
  if (e.home != config_.server_rank) return;  // a promoted backup's: not in our file
  ++e.rounds;
  const int64_t every = config_.checkpoint_every;
  if (every <= 0 || e.rounds % every != 0) return;
  // The value is shared, not copied: a later update copies it first (own_value).
  CheckpointPart p{part.key,
                   part.begin,
                   e.home,
                   e.name,
                   e.value.view,
                   e.value.owner,
                   optimizer_states_of(part, e)};
  size_t expected = 0;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, other] : entries_)
      expected += other->home == config_.server_rank ? 1 : 0;
  }
  std::shared_ptr<PendingCheckpoint> ready;
  {
    std::lock_guard lock(checkpoint_mu_);
    auto& slot = pending_checkpoints_[e.rounds];
    if (!slot) slot = std::make_shared<PendingCheckpoint>();
    slot->parts.push_back(std::move(p));
    if (slot->parts.size() >= expected) {
      ready = std::move(slot);
      pending_checkpoints_.erase(e.rounds);
    }
    while (pending_checkpoints_.size() > kMaxPendingCheckpoints) {
      auto oldest = pending_checkpoints_.begin();
      PP_WARN(
          "server {}: checkpoint of round {} abandoned: {} of its {} ranges never reached "
          "that round (is every key pushed every round?)",
          config_.server_rank, oldest->first, expected - oldest->second->parts.size(), expected);
      pending_checkpoints_.erase(oldest);
    }
  }
  if (!ready) return;
  Checkpoint c{config_.num_servers, config_.server_rank, config_.num_workers, e.rounds,
               std::move(ready->parts)};
  std::string path = checkpoint_path(config_.checkpoint_dir, c.round, c.rank);
  try {
    // The directory itself first: never one another user planted (a
    // symlink, or theirs: they could swap the rounds inside it).
    base::make_private_dirs(config_.checkpoint_dir, "checkpoint directory");
    write_file_atomically(path, encode_checkpoint(c, config_.checkpoint_key));
    PP_INFO("server {}: checkpoint of round {} written to {}", c.rank, c.round, path);
  } catch (const std::exception& ex) {
    // Training goes on; this round's checkpoint stays incomplete.
    PP_ERROR("server {}: checkpoint of round {} not written: {}", c.rank, c.round, ex.what());
  }
}

void ServerStore::restore(const Checkpoint& c, const std::string& source) {
  std::lock_guard lock(mu_);
  restored_from_ = source;
  for (const CheckpointPart& p : c.parts) {
    auto e = std::make_unique<Entry>();
    e->name = p.name;
    e->value = Payload{p.value, p.owner};  // shared: copied before any update
    e->merged_dtype = is_half(p.value.dtype) ? DType::kFloat32 : p.value.dtype;
    e->size_for(config_.num_workers);
    e->home = p.home;
    e->rounds = c.round;
    e->restored = true;
    e->restored_states = p.optimizer_states;
    entries_[PartId{p.key, p.begin}] = std::move(e);
  }
}

void ServerStore::acknowledge_after_republish(const PartId& part, Entry& e,
                                              std::function<void(Entry&)> answer) {
  // This server may hold the state only as a replica of a primary that died
  // before every backup of the range had it: a backup further down the chain
  // can be a round behind. Acknowledging now, and dying before the next
  // round, would let that backup be promoted and lose what was acknowledged.
  // So this server sends its state to its own backups first.
  if (config_.replicate) {
    auto shared = std::make_shared<std::function<void(Entry&)>>(std::move(answer));
    const bool waiting = responder_.replicate(part, state_of(part, e), [this, part, shared] {
      executor_.submit(shard_of(part), [this, part, shared] {
        if (Entry* e = find(part)) (*shared)(*e);
      });
    });
    if (waiting) return;
    return (*shared)(e);
  }
  answer(e);
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

}  // namespace pushpull::ps
