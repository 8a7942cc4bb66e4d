// SPDX-License-Identifier: Apache-2.0
// The Server's replication: sending a part's state to its backups, installing
// what a primary sends, and the placement changes (docs/ps.md, "Fault
// tolerance"). The request path is in server.cpp, rejoin in server_rejoin.cpp.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "ps/protocol.h"
#include "ps/server.h"
#include "pushpull/log.h"

namespace pushpull::ps {

bool Server::replicate(const PartId& part, std::shared_ptr<const ReplicaState> state,
                       std::function<void()> done) {
  const int me = node_.rank();
  const int home = state->home >= 0 ? state->home : me;
  auto live_backups = [&](const std::vector<bool>& dead, const std::vector<uint32_t>& late) {
    cluster::ReplicaChain chain =
        cluster::replica_chain(home, node_.num_servers(), node_.ps_replicas(), dead, late);
    // The live servers after this one in the part's chain.
    if (chain.primary == me) return chain.backups;
    auto it = std::find(chain.backups.begin(), chain.backups.end(), me);
    return it == chain.backups.end() ? std::vector<int>{}
                                     : std::vector<int>(it + 1, chain.backups.end());
  };
  const cluster::Placement placement = node_.placement();
  std::vector<int> backups = live_backups(placement.dead, placement.late);
  // At the job's start a backup's connection may still be coming up (this
  // runs on a store thread, never the I/O thread).
  std::erase_if(backups, [&](int b) {
    if (node_.wait_connected(Role::kServer, b, node_.options().cluster.startup_timeout))
      return false;
    PP_ERROR("no connection to server {}: replica not sent", b);
    return true;
  });
  {
    // Decided under the lock on_placement takes: a backup declared dead
    // after this point is removed from `waiting` by on_placement.
    std::lock_guard lock(repl_mu_);
    std::vector<int> live = live_backups(dead_, late_);
    std::erase_if(backups,
                  [&](int b) { return std::find(live.begin(), live.end(), b) == live.end(); });
    // A rejoined server catching up gets this part's rounds when it is in
    // the part's chain and this server leads it.
    if (cluster::replica_chain(home, node_.num_servers(), node_.ps_replicas(), dead_, late_)
            .primary == me)
      for (int s : catching_up_)
        for (int i = 0; i <= node_.ps_replicas(); ++i)
          if ((home + i) % node_.num_servers() == s &&
              std::find(backups.begin(), backups.end(), s) == backups.end())
            backups.push_back(s);
    if (backups.empty()) return false;
  }
  send_replica(part, std::move(state), std::move(backups), std::move(done));
  return true;
}

void Server::send_replica(const PartId& part, std::shared_ptr<const ReplicaState> state,
                          std::vector<int> backups, std::function<void()> done) {
  const ArrayView& v = state->value.view;
  // Same host: the backups hold the value in this process's memory instead
  // of receiving it (docs/ps.md, "Replication on one host"). Lendable
  // memory comes from one of two pools: the store's (a value it allocated:
  // state->lent) or the transport's (a received push it adopted as the value).
  std::optional<transport::LendRef> ref;
  if (lending() && v.nbytes() > 0)
    ref = state->lent ? state->lent : node_.transport().pool().find_lent(v.data, v.nbytes());
  uint64_t id;
  std::vector<char> lend(backups.size(), 0);
  {
    std::lock_guard lock(repl_mu_);
    id = next_replication_++;
    bool any = false;
    for (size_t i = 0; i < backups.size(); ++i)
      any |= lend[i] = ref && !no_lending_.contains(backups[i]);
    outgoing_[id] = Outgoing{backups, std::move(done), part, any ? state : nullptr,
                             any ? *ref : transport::LendRef{}};
  }
  for (size_t i = 0; i < backups.size(); ++i)
    send_replica_to(id, part, state, backups[i], lend[i] ? &*ref : nullptr);
  // A send to a dead backup fails at once or later; either way the next
  // placement (which names it dead) completes the replication for it.
}

void Server::send_replica_to(uint64_t id, const PartId& part,
                             const std::shared_ptr<const ReplicaState>& state, int b,
                             const transport::LendRef* lend) {
  const ArrayView& v = state->value.view;
  transport::Header h{.type = msg::kReplicaMeta,
                      .request_id = id,
                      .key = part.key,
                      .dtype = static_cast<uint32_t>(v.dtype),
                      .offset = static_cast<uint64_t>(part.begin),
                      .length = static_cast<uint64_t>(v.numel())};
  auto on_sent = [this, gate = gate_, id, b](const Status& s) {
    // A rejoined server that dies while catching up is not in any
    // placement's chain: its failed send completes it here.
    if (s.is_ok() || !gate->enter()) return;
    bool catching_up;
    {
      std::lock_guard lock(repl_mu_);
      catching_up = catching_up_.erase(b) > 0;
    }
    if (catching_up) replica_acked(id, b);
    gate->leave();
  };
  if (lend) {
    // One message: the reference, then the metadata (both small).
    auto payload = std::make_shared<std::vector<std::byte>>(encode_lent_replica(*lend, *state));
    h.type = msg::kReplicaValue;
    h.flags = msg::kFlagLent | msg::kFlagWithMeta;
    node_.send(Role::kServer, b, h, payload->data(), payload->size(),
               [payload, on_sent](const Status& s) { on_sent(s); });
    return;
  }
  auto bytes = std::make_shared<std::vector<std::byte>>(encode_replica_meta(*state));
  node_.send(Role::kServer, b, h, bytes->data(), bytes->size(),
             [bytes, on_sent](const Status& s) { on_sent(s); });
  h.type = msg::kReplicaValue;
  // Zero-copy; the state (and so the value) is released once written, so
  // the next round does not have to copy the value to update it.
  node_.send(Role::kServer, b, h, v.data, v.nbytes(), [state](const Status& s) {
    if (!s.is_ok()) PP_DEBUG("replica not delivered: {}", s.to_string());
  });
}

void Server::replica_acked(uint64_t id, int backup, bool pinned) {
  std::function<void()> done;
  {
    std::lock_guard lock(repl_mu_);
    auto it = outgoing_.find(id);
    if (it == outgoing_.end()) return;
    auto& w = it->second.waiting;
    const auto before = w.size();
    w.erase(std::remove(w.begin(), w.end(), backup), w.end());
    // Kept before the round can complete: the next round must not update
    // (or the pool reuse) the buffer the backup now reads as its value.
    if (pinned && it->second.lent && w.size() < before)
      pinned_[{backup, id}] = Pinned{it->second.ref, it->second.lent};
    if (!w.empty()) return;
    done = std::move(it->second.done);
    outgoing_.erase(it);
  }
  done();
}

void Server::on_replica_release(int backup, const transport::Message& m) {
  transport::LendRef ref;
  if (Status st = transport::decode_lend_ref({m.payload.data(), m.payload.size()}, &ref); !st) {
    PP_WARN("bad replica release from server {}: {}", backup, st.to_string());
    return;
  }
  std::shared_ptr<const ReplicaState> state;  // released outside the lock
  std::lock_guard lock(repl_mu_);
  auto it = pinned_.find({backup, m.header.request_id});
  // The reference must match too: a release meant for an earlier incarnation
  // of this server must not free one of ours.
  if (it == pinned_.end() || !(it->second.ref == ref)) return;
  state = std::move(it->second.state);
  pinned_.erase(it);
}

void Server::on_server_message(const cluster::NodeAddress& from, transport::Message&& m) {
  const transport::Header& h = m.header;
  switch (h.type) {
    case msg::kRejoinRequest: {
      // Which ranges it needs from this server depends on the placement it
      // rejoins at (the one that failed it over): a server that has not
      // applied it yet would still count it their primary and send it
      // nothing (found by the simulation, seed 1543). Held until then.
      const uint64_t want = epoch_of_flags(h.flags);
      if (want > node_.placement_epoch() % kWrap) {
        std::lock_guard lock(repl_mu_);
        if (want > node_.placement_epoch() % kWrap) {
          future_.push_back(std::move(m));
          return;
        }
      }
      return on_rejoin_request(from.rank, m.header.key);
    }
    case msg::kRejoinSetup:
      return on_rejoin_setup(
          std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()));
    case msg::kRejoinDone:
      return on_rejoin_done(from.rank, m.header.key);
    case msg::kReply:
      if (h.flags & msg::kFlagSendBytes) {
        // The backup cannot read this process's memory: by value from now on.
        PartId part;
        std::shared_ptr<const ReplicaState> state;
        {
          std::lock_guard lock(repl_mu_);
          auto it = outgoing_.find(h.request_id);
          if (it == outgoing_.end() || !it->second.lent) return;
          if (no_lending_.insert(from.rank).second)
            PP_INFO("server {}: server {} cannot read lent replicas; sending them by value",
                    node_.rank(), from.rank);
          part = it->second.part;
          state = it->second.lent;
        }
        return send_replica_to(h.request_id, part, state, from.rank, nullptr);
      }
      return replica_acked(h.request_id, from.rank, (h.flags & msg::kFlagPinned) != 0);
    case msg::kReplicaRelease:
      return on_replica_release(from.rank, m);
    case msg::kError: {
      // The backup could not install it: it keeps no copy of this round, so
      // this is a broken job, not something to retry.
      std::string text(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
      PP_ERROR("server {} refused a replica: {}", from.rank, text);
      return replica_acked(h.request_id, from.rank);
    }
    case msg::kReplicaMeta: {
      ReplicaState state;
      Status st =
          decode_replica_meta({m.payload.data(), m.payload.size()}, node_.num_workers(), &state);
      if (!st) {
        PP_WARN("bad replica metadata from server {}: {}", from.rank, st.to_string());
        return;
      }
      std::lock_guard lock(repl_mu_);
      // Bounded: a primary has at most one replication per part in flight.
      if (incoming_meta_.size() > 65536) incoming_meta_.erase(incoming_meta_.begin());
      incoming_meta_[{from.rank, h.request_id}] = std::move(state);
      return;
    }
    case msg::kReplicaValue:
      return on_replica_value(from, std::move(m));
    default:
      PP_WARN("ignoring parameter-server message type {} from {}", h.type, from.describe());
  }
}

void Server::on_placement(const cluster::Placement& p) {
  // Replications waiting for a backup that is now dead are complete.
  std::vector<std::function<void()>> finished;
  std::deque<transport::Message> ready;
  std::vector<Pinned> unpinned;  // released outside the lock
  bool restart_rejoin = false;
  {
    std::lock_guard lock(repl_mu_);
    dead_ = p.dead;
    late_ = p.late;
    // A rejoined server alive in the placement is a backup like any other;
    // one lost again while catching up (dead and no longer restarting: it
    // died or was stopped) gets nothing more, and nothing waits for it
    // (below: it is dead).
    for (auto it = catching_up_.begin(); it != catching_up_.end();)
      it = p.epoch > 0 && (!p.is_dead(*it) || !p.is_restarting(*it)) ? catching_up_.erase(it)
                                                                     : std::next(it);
    for (size_t s = 0; s < p.dead.size(); ++s)
      if (p.dead[s]) {
        // A server this one was catching up from died: the ranges it led
        // moved to other servers, which never sent them here. Catch up
        // again from every live server (installing a state twice is
        // harmless); before, the wait ended with the set empty and nobody
        // reported the rejoin: the replication factor never came back.
        restart_rejoin |= rejoin_waiting_.erase(static_cast<int>(s)) > 0;
        // A restarted server catching up is dead in the placement but alive:
        // it may still read the buffers it holds of ours in place.
        if (p.is_restarting(static_cast<int>(s))) continue;
        // Its lent blocks: mapped here, they would keep its memory alive.
        if (auto it = lent_by_.find(static_cast<int>(s)); it != lent_by_.end()) {
          lend_reader_.forget(it->second);
          lent_by_.erase(it);
        }
        // What it held in place of ours: nobody reads it any more.
        for (auto it = pinned_.lower_bound({static_cast<int>(s), 0});
             it != pinned_.end() && it->first.first == static_cast<int>(s);) {
          unpinned.push_back(std::move(it->second));
          it = pinned_.erase(it);
        }
      }
    for (auto it = outgoing_.begin(); it != outgoing_.end();) {
      auto& w = it->second.waiting;
      // (A restarted server catching up is dead in the placement but
      // alive: its acknowledgement still comes.)
      w.erase(std::remove_if(w.begin(), w.end(),
                             [&](int b) { return p.is_dead(b) && !p.is_restarting(b); }),
              w.end());
      if (w.empty()) {
        finished.push_back(std::move(it->second.done));
        it = outgoing_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = incoming_meta_.begin(); it != incoming_meta_.end();)
      it = static_cast<size_t>(it->first.first) < p.dead.size() &&
                   p.dead[static_cast<size_t>(it->first.first)]
               ? incoming_meta_.erase(it)
               : std::next(it);
    std::deque<transport::Message> later;
    for (auto& m : future_)
      (epoch_of_flags(m.header.flags) <= p.epoch % kWrap ? ready : later).push_back(std::move(m));
    future_ = std::move(later);
  }
  PP_WARN(
      "server {}: placement epoch {}; {} replications completed by it, {} held requests "
      "replayed",
      node_.rank(), p.epoch, finished.size(), ready.size());
  for (auto& f : finished)
    f();
  for (auto& m : ready)
    on_message_guarded(std::move(m));
  if (restart_rejoin) {
    PP_WARN("server {}: a server it was catching up from died; catching up again", node_.rank());
    rejoin();
  }
}

}  // namespace pushpull::ps
