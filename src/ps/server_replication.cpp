// SPDX-License-Identifier: Apache-2.0
// The Server's replication: sending a part's state to its backups, installing
// what a primary sends, and the placement changes (docs/ps.md, "Fault
// tolerance"). The request path is in server.cpp.
#include <algorithm>

#include <fmt/format.h>

#include "ps/protocol.h"
#include "ps/server.h"
#include "pushpull/log.h"

namespace pushpull::ps {

bool Server::replicate(const PartId& part, std::shared_ptr<const ReplicaState> state,
                       std::function<void()> done) {
  const int me = node_.rank();
  auto live_backups = [&](const std::vector<bool>& dead) {
    cluster::ReplicaChain chain = cluster::replica_chain(
        state->home >= 0 ? state->home : me, node_.num_servers(), node_.ps_replicas(), dead);
    // The live servers after this one in the part's chain.
    if (chain.primary == me) return chain.backups;
    auto it = std::find(chain.backups.begin(), chain.backups.end(), me);
    return it == chain.backups.end() ? std::vector<int>{}
                                     : std::vector<int>(it + 1, chain.backups.end());
  };
  std::vector<int> backups = live_backups(node_.placement().dead);
  // At the job's start a backup's connection may still be coming up (this
  // runs on a store thread, never the I/O thread).
  std::erase_if(backups, [&](int b) {
    if (node_.wait_connected(Role::kServer, b, node_.options().cluster.startup_timeout))
      return false;
    PP_ERROR("no connection to server {}: replica not sent", b);
    return true;
  });
  uint64_t id;
  {
    // Decided under the lock on_placement takes: a backup declared dead
    // after this point is removed from `waiting` by on_placement.
    std::lock_guard lock(repl_mu_);
    std::vector<int> live = live_backups(dead_);
    std::erase_if(backups,
                  [&](int b) { return std::find(live.begin(), live.end(), b) == live.end(); });
    if (backups.empty()) return false;
    id = next_replication_++;
    outgoing_[id] = Outgoing{backups, std::move(done)};
  }
  const ArrayView& v = state->value.view;
  auto meta = std::make_shared<std::vector<std::byte>>(encode_replica_meta(*state));
  net::Header h{.type = msg::kReplicaMeta,
                .request_id = id,
                .key = part.key,
                .dtype = static_cast<uint32_t>(v.dtype),
                .offset = static_cast<uint64_t>(part.begin),
                .length = static_cast<uint64_t>(v.numel())};
  for (int b : backups) {
    h.type = msg::kReplicaMeta;
    node_.send(Role::kServer, b, h, meta->data(), meta->size(), [meta](const Status&) {});
    h.type = msg::kReplicaValue;
    // Zero-copy; the state (and so the value) is released once written, so
    // the next round does not have to copy the value to update it.
    node_.send(Role::kServer, b, h, v.data, v.nbytes(), [state](const Status& s) {
      if (!s.is_ok()) PP_DEBUG("replica not delivered: {}", s.to_string());
    });
  }
  // A send to a dead backup fails at once or later; either way the next
  // placement (which names it dead) completes the replication for it.
  return true;
}

void Server::replica_acked(uint64_t id, int backup) {
  std::function<void()> done;
  {
    std::lock_guard lock(repl_mu_);
    auto it = outgoing_.find(id);
    if (it == outgoing_.end()) return;
    auto& w = it->second.waiting;
    w.erase(std::remove(w.begin(), w.end(), backup), w.end());
    if (!w.empty()) return;
    done = std::move(it->second.done);
    outgoing_.erase(it);
  }
  done();
}

void Server::on_server_message(const cluster::NodeAddress& from, net::Message&& m) {
  const net::Header& h = m.header;
  switch (h.type) {
    case msg::kReply:
      return replica_acked(h.request_id, from.rank);
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
    case msg::kReplicaValue: {
      ReplicaState state;
      {
        std::lock_guard lock(repl_mu_);
        auto it = incoming_meta_.find({from.rank, h.request_id});
        if (it == incoming_meta_.end()) {
          PP_WARN("replica value {} from server {} without its metadata; ignored", h.request_id,
                  from.rank);
          return;
        }
        state = std::move(it->second);
        incoming_meta_.erase(it);
      }
      const bool dtype_ok = h.dtype <= 0xff && is_valid_dtype(static_cast<uint8_t>(h.dtype));
      auto dtype = static_cast<DType>(h.dtype);
      net::Header ack{.type = msg::kReply, .request_id = h.request_id, .key = h.key};
      if (!dtype_ok || h.length > static_cast<uint64_t>(INT64_MAX) ||
          h.offset > static_cast<uint64_t>(INT64_MAX) ||
          m.payload.size() != h.length * dtype_size(dtype)) {
        std::string why = fmt::format("replica of key id {}: bad dtype or size", h.key);
        ack.type = msg::kError;
        node_.send_copy(Role::kServer, from.rank, ack, why.data(), why.size());
        return;
      }
      auto owner = std::make_shared<net::Buffer>(std::move(m.payload));
      state.value =
          Payload{ArrayView(owner->data(), dtype, Shape{static_cast<int64_t>(h.length)}), owner};
      PartId part{h.key, static_cast<int64_t>(h.offset)};
      int primary = from.rank;
      store()->install_replica(part, std::move(state), [this, ack, primary](const Status& s) {
        // Runs on a store thread. At the job's start the primary's message
        // may arrive before this node recorded its connection to it: wait
        // for that (an acknowledgement lost here would hold the round forever).
        if (!node_.wait_connected(Role::kServer, primary, node_.options().cluster.startup_timeout))
          PP_WARN("no connection to server {}: replica not acknowledged", primary);
        net::Header a = ack;
        if (s.is_ok()) {
          node_.send_copy(Role::kServer, primary, a, nullptr, 0);
          return;
        }
        PP_ERROR("cannot install a replica from server {}: {}", primary, s.to_string());
        a.type = msg::kError;
        node_.send_copy(Role::kServer, primary, a, s.message().data(), s.message().size());
      });
      return;
    }
    default:
      PP_WARN("ignoring parameter-server message type {} from {}", h.type, from.describe());
  }
}

void Server::on_placement(const cluster::Placement& p) {
  // Replications waiting for a backup that is now dead are complete.
  std::vector<std::function<void()>> finished;
  std::deque<net::Message> ready;
  {
    std::lock_guard lock(repl_mu_);
    dead_ = p.dead;
    for (auto it = outgoing_.begin(); it != outgoing_.end();) {
      auto& w = it->second.waiting;
      w.erase(std::remove_if(w.begin(), w.end(),
                             [&](int b) {
                               return static_cast<size_t>(b) < p.dead.size() &&
                                      p.dead[static_cast<size_t>(b)];
                             }),
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
    std::deque<net::Message> later;
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
}

}  // namespace pushpull::ps
