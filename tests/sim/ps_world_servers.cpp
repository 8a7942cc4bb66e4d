// SPDX-License-Identifier: Apache-2.0
// The simulation's servers: the real ServerStore (no threads) behind a model
// of ps::Server's replication, placements and rejoin.
#include <fmt/format.h>

#include "sim/ps_world_impl.h"

namespace pushpull::sim::detail {

Server::~Server() {
  // Its queued work runs (and sends nothing: a dead node's links are
  // closed) while every member it uses still exists.
  store_.reset();
}

Server::Server(World& w, int rank) : w_(w), rank_(rank) {
  const Scenario& s = w.scenario();
  ps::ServerStoreConfig c;
  c.num_workers = s.workers;
  c.sync = s.sync;
  c.threads = 0;  // run by this simulation only
  c.server_rank = rank;
  c.replicate = s.replicas > 0;
  c.num_servers = s.servers;
  store_ = std::make_unique<ps::ServerStore>(c, *this);
  view_.dead.assign(s.servers, false);
  view_.late.assign(s.servers, 0);
  store_->set_optimizer({0, 0}, OptimizerSpec::parse(s.sync ? "sgd:learning_rate=0.5,momentum=0.5"
                                                            : "test:rescale_grad=0.5"));
  store_->run_queued();
}

void Server::reply(const RequestMeta& to, const Status& status, DType,
                   std::span<const std::byte> data, std::shared_ptr<void>) {
  if (to.request_id == 0) return;  // set_optimizer at the start
  Msg m;
  m.request_id = to.request_id;
  if (!status.is_ok()) {
    m.type = Msg::kError;
    m.text = status.to_string();
  } else {
    m.type = Msg::kReply;
    m.bytes.assign(data.begin(), data.end());
  }
  w_.send(w_.server_node(rank_), w_.worker_node(to.worker), std::move(m));
}

bool Server::replicate(const PartId& part, std::shared_ptr<const ReplicaState> state,
                       std::function<void()> done) {
  const int home = state->home >= 0 ? state->home : rank_;
  cluster::ReplicaChain chain =
      cluster::replica_chain(home, w_.scenario().servers, w_.replicas(), view_.dead, view_.late);
  std::vector<int> backups;
  if (chain.primary == rank_) {
    backups = chain.backups;
  } else if (auto it = std::find(chain.backups.begin(), chain.backups.end(), rank_);
             it != chain.backups.end()) {
    backups.assign(it + 1, chain.backups.end());
  }
  // A restarted server catching up gets the rounds of the parts this server
  // leads whose chain holds it.
  if (chain.primary == rank_)
    for (int s : catching_up_)
      for (int i = 0; i <= w_.replicas(); ++i)
        if ((home + i) % w_.scenario().servers == s &&
            std::find(backups.begin(), backups.end(), s) == backups.end())
          backups.push_back(s);
  if (backups.empty()) return false;
  send_replica(part, state, backups, std::move(done));
  return true;
}

void Server::send_replica(const PartId& part, const std::shared_ptr<const ReplicaState>& state,
                          const std::vector<int>& backups, std::function<void()> done) {
  int index = -1;
  for (size_t i = 0; i < w_.parts().size(); ++i)
    if (w_.parts()[i].id == part) index = static_cast<int>(i);
  const uint64_t id = next_replication_++;
  outgoing_[id] = {std::set<int>(backups.begin(), backups.end()), std::move(done)};
  for (int b : backups) {
    // A copy on the wire: the backup owns what it receives.
    auto copy = std::make_shared<ReplicaState>(*state);
    auto a = std::make_shared<Array>(Array::copy_of(state->value.view));
    copy->value = Payload{a->view(), a};
    Msg m;
    m.type = Msg::kReplica;
    m.part = index;
    m.state = copy;
    m.replication = id;
    if (w_.send(w_.server_node(rank_), w_.server_node(b), std::move(m))) continue;
    // A failed send to a server catching up completes its wait (it is in no
    // placement's chain: ps::Server::send_replica_to's on_sent).
    if (catching_up_.erase(b) > 0) w_.soon([this, id, b] { acked(id, b); });
  }
}

void Server::acked(uint64_t id, int backup) {
  auto it = outgoing_.find(id);
  if (it == outgoing_.end()) return;
  it->second.waiting.erase(backup);
  if (!it->second.waiting.empty()) return;
  auto done = std::move(it->second.done);
  outgoing_.erase(it);
  done();
  store_->run_queued();
}

void Server::rejoin(const Placement& p) {
  view_ = p;
  if (joined_epoch_ == 0) joined_epoch_ = p.epoch;
  const uint64_t generation = ++rejoin_generation_;
  rejoin_waiting_.clear();
  for (int s = 0; s < w_.scenario().servers; ++s)
    if (s != rank_ && !p.dead[s]) rejoin_waiting_.insert(s);
  if (rejoin_waiting_.empty()) return w_.server_rejoined(rank_);
  for (int s : rejoin_waiting_) {
    Msg m;
    m.type = Msg::kRejoinRequest;
    m.seq = generation;
    m.epoch = p.epoch;  // held by a server that has not applied it yet
    w_.send(w_.server_node(rank_), w_.server_node(s), std::move(m));
  }
}

void Server::on_rejoin_request(int from, uint64_t generation) {
  const int to = from - 1, servers = w_.scenario().servers, replicas = w_.replicas();
  catching_up_.insert(to);
  auto wanted = [this, to, servers, replicas](const PartId&, int home) {
    if (cluster::replica_chain(home, servers, replicas, view_.dead, view_.late).primary != rank_)
      return false;
    for (int i = 0; i <= replicas; ++i)
      if ((home + i) % servers == to) return true;
    return false;
  };
  auto send = [this, to](const PartId& part, std::shared_ptr<const ReplicaState> state,
                         std::function<void()> done) {
    send_replica(part, state, {to}, std::move(done));
  };
  store_->transfer(wanted, send, [this, to, generation] {
    Msg m;
    m.type = Msg::kRejoinDone;
    m.seq = generation;
    w_.send(w_.server_node(rank_), w_.server_node(to), std::move(m));
  });
}

void Server::handle(int from, const Msg& m) {
  switch (m.type) {
    case Msg::kInit:
    case Msg::kPush:
    case Msg::kPull:
    case Msg::kRejoin:
      request(from, m);
      break;
    case Msg::kReplica: {
      const int to = from;
      const uint64_t id = m.replication;
      ReplicaState st = *m.state;
      store_->install_replica(w_.parts()[m.part].id, std::move(st), [this, to, id](const Status&) {
        Msg ack;
        ack.type = Msg::kReplicaAck;
        ack.replication = id;
        w_.send(w_.server_node(rank_), to, std::move(ack));
      });
      break;
    }
    case Msg::kReplicaAck:
      acked(m.replication, from - 1);
      break;
    case Msg::kPlacement:
      apply_placement(m.placement);
      break;
    case Msg::kAbort:
      // Failed over: the process ends (its connections close).
      return w_.abort_server(rank_);
    case Msg::kRejoinRequest:
      if (m.epoch > view_.epoch) {
        held_.emplace_back(from, m);
        break;
      }
      on_rejoin_request(from, m.seq);
      break;
    case Msg::kRejoinDone:
      if (m.seq == rejoin_generation_ && rejoin_waiting_.erase(from - 1) > 0 &&
          rejoin_waiting_.empty())
        w_.server_rejoined(rank_);
      break;
    default:
      break;
  }
  store_->run_queued();
}

void Server::request(int from, const Msg& m) {
  // A restarted server drops what was meant for its predecessor (ps::Server:
  // a request stamped before the epoch it joined at).
  if (joined_epoch_ > 0 && m.epoch < joined_epoch_) return;
  if (m.epoch > view_.epoch) {
    held_.emplace_back(from, m);  // held until this server's placement arrives
    return;
  }
  const int worker = from - w_.worker_node(0);
  const PartInfo& p = w_.parts()[m.part];
  RequestMeta meta{worker, m.request_id, p.id.key, w_.scenario().sync};
  if (m.type == Msg::kInit) {
    store_->init(meta, p.id, p.name, floats(m.values), p.home);
  } else if (m.type == Msg::kPush) {
    store_->push(meta, p.id, floats(m.values), false, static_cast<uint32_t>(m.seq % (1u << 24)));
  } else if (m.type == Msg::kRejoin) {
    store_->rejoin(meta, p.id);
  } else {
    meta.pull_back = false;
    store_->pull(meta, p.id, {});
  }
}

void Server::apply_placement(const Placement& p) {
  if (p.epoch <= view_.epoch) return;
  const Placement old = view_;
  view_ = p;
  for (int s = 0; s < w_.scenario().servers; ++s)
    if (p.dead[s] && !old.dead[s] && s != rank_) w_.close_for_placement(w_.server_node(rank_), s);
  std::erase_if(catching_up_, [&](int c) { return !p.dead[c] || !p.is_restarting(c); });
  bool restart_rejoin = false;
  for (int s = 0; s < w_.scenario().servers; ++s)
    if (p.dead[s]) restart_rejoin |= rejoin_waiting_.erase(s) > 0;
  // Replications waiting for a backup that is now dead (and not restarted,
  // catching up) are complete.
  std::vector<std::function<void()>> finished;
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    std::erase_if(it->second.waiting, [&](int b) { return p.dead[b] && !p.is_restarting(b); });
    if (it->second.waiting.empty()) {
      finished.push_back(std::move(it->second.done));
      it = outgoing_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& f : finished)
    f();
  if (restart_rejoin) rejoin(view_);  // a source died: catch up again
  auto held = std::move(held_);
  for (auto& [from, m] : held)
    if (m.type == Msg::kRejoinRequest)
      handle(from, m);  // (held again if still ahead)
    else
      request(from, m);
}

// A server restarted by the launcher: new connections, a new store; it
// catches up and rejoins.
void World::reopen(int node) {
  for (int n = 0; n <= s_.servers + s_.workers; ++n) {
    if (n == node) continue;
    // `n` connected by the restarted process before it learned of its
    // predecessor's death: that late placement must spare this connection.
    const bool late = n != kScheduler && !view_of(n).dead[static_cast<size_t>(node - 1)];
    links_[{node, n}] = Link{links_[{node, n}].gen + 1, 0, false, late};
    links_[{n, node}] = Link{links_[{n, node}].gen + 1, 0, false, late};
  }
}

const Placement& World::view_of(int node) const {
  if (node >= 1 && node <= s_.servers) return servers_[static_cast<size_t>(node - 1)]->view();
  return workers_[static_cast<size_t>(node - 1 - s_.servers)].view;
}

void World::close_for_placement(int node, int server) {
  Link& l = links_[{node, server_node(server)}];
  if (l.renewed && !l.closed) {  // the restarted process's connection
    l.renewed = false;
    links_[{server_node(server), node}].renewed = false;
    return;
  }
  close(node, server_node(server));
}

void World::restart_server(int rank) {
  if (job_failed_) return;
  if (!dead_[rank]) kill(rank);  // a stopped one is killed first
  const int node = server_node(rank);
  reopen(node);
  for (int s = 0; s < s_.servers; ++s)  // no connection to dead servers
    if (s != rank && placement_.dead[s] && !placement_.restarting[s]) close(node, server_node(s));
  dead_[rank] = false;
  stopped_[rank] = false;
  inbox_[rank].clear();
  ++stop_token_[rank];
  // It registers: the scheduler marks it restarting (no broadcast) and sends
  // it the placement; it asks the live servers for its ranges.
  placement_.restarting[rank] = true;
  servers_[rank] = std::make_unique<Server>(*this, rank);
  servers_[rank]->rejoin(placement_);
}

void World::server_rejoined(int rank) {
  at(now_ + 300, [this, rank] {  // (kServerRejoined on its way to the scheduler)
    if (job_failed_ || dead_[rank] || !placement_.dead[rank] || !placement_.restarting[rank])
      return;
    placement_.dead[rank] = false;
    placement_.restarting[rank] = false;
    placement_.late[rank] = ++rejoins_;
    placement_.epoch++;
    Msg p;
    p.type = Msg::kPlacement;
    p.placement = placement_;
    for (int r = 0; r < s_.servers; ++r)
      if (!placement_.dead[r] || placement_.restarting[r]) send(kScheduler, server_node(r), p);
    for (int r = 0; r < s_.workers; ++r)
      send(kScheduler, worker_node(r), p);
  });
}

}  // namespace pushpull::sim::detail
