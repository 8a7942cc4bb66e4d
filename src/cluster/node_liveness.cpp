// SPDX-License-Identifier: Apache-2.0
// The Node's liveness (node.h): its wiring of the shared detector
// (transport/liveness.h: beats to the scheduler, its silence, the suspect),
// peers whose connection closed or was replaced, placements (the scheduler's fail-over verdicts),
// failures reported to the scheduler and the verdicts that end the node.
#include "cluster/node.h"

#include <fmt/format.h>

#include "cluster/describe.h"
#include "pushpull/log.h"

namespace pushpull::cluster {

void Node::heartbeat_loop() {
  std::unique_lock lock(mu_);
  live_.run(
      lock, cv_, [&] { return stop_heartbeat_ || shutdown_; },
      [&](transport::Liveness::Event&& e) { on_liveness(std::move(e), lock); });
}

void Node::on_liveness(transport::Liveness::Event&& e, std::unique_lock<std::mutex>& lock) {
  const auto& c = options_.cluster;
  using Event = transport::Liveness::Event;
  Status why;
  if (e.kind == Event::kSuspectDue) {
    why = e.why;
  } else if (e.kind == Event::kDead) {  // the scheduler, the only member watched
    why = {ErrorCode::kPeerFailure,
           fmt::format("{} failed: no heartbeat for {} ms (limit {} ms); it is stopped, hung or "
                       "unreachable",
                       book_.scheduler.port > 0 ? book_.scheduler.describe()
                                                : "scheduler (host " + c.root_uri + ")",
                       e.silence.count(), c.heartbeat_timeout.count())};
  } else if (e.kind == Event::kBeat) {
    // Checked once per beat: a peer whose connection closed while the
    // scheduler may fail it over or replace it (on_close), and no word came.
    auto late = std::find_if(verdict_due_.begin(), verdict_due_.end(),
                             [&](const auto& v) { return clock_.now() >= v.second.deadline; });
    if (failure_locked().is_ok() && late != verdict_due_.end()) {
      const auto [peer_role, peer_rank] = late->first;
      std::string peer = fmt::format("{} {}", role_name(peer_role), peer_rank);
      try {
        peer = book_.at(peer_role, peer_rank).describe();
      } catch (const Error&) {  // not in the book: its role and rank say enough
      }
      why = {ErrorCode::kPeerFailure,
             fmt::format("{} failed: its connection to {} {} closed ({}) and the scheduler, "
                         "which still hears it, did not fail it over or replace it: the link "
                         "between the two is broken",
                         peer, role_name(role()), rank_, late->second.why)};
      verdict_due_.clear();
    }
    transport::ConnId sched = scheduler_;
    lock.unlock();
    transport_->send_copy(sched, transport::Header{.type = msg::kHeartbeat}, nullptr, 0);
    lock.lock();
  }
  if (why.is_ok()) return;
  lock.unlock();
  fail(why);
  lock.lock();
}

void Node::on_close(transport::ConnId id, const transport::PeerInfo& p, const Status& why) {
  std::unique_lock lock(mu_);
  if (shutdown_ || leaving_) return;
  if (id == scheduler_) {
    std::string who = book_.scheduler.port > 0
                          ? book_.scheduler.describe()
                          : "scheduler (host " + options_.cluster.root_uri + ")";
    lock.unlock();
    fail({ErrorCode::kPeerFailure,
          fmt::format("{} failed: connection closed ({}); it crashed, was killed or lost the "
                      "network",
                      who, why.message())});
    return;
  }
  // A peer's connection closed. When another node died first, this peer may
  // just be exiting because of it; the scheduler's verdict (kPeerDead, which
  // names the node that really failed) is on its way, so wait a short grace
  // period before blaming this peer. The transport has already failed every
  // send and posted receive of this connection.
  if (live_.verdict().has_suspect()) return;
  if (p.role == Role::kServer && replicas_ > 0) {
    // The verdict may have come first: a placement that failed this server
    // over dropped the connection from peers_ (apply_placement) before its
    // close reached us. Waiting for a verdict again would blame the link
    // once the deadline passed (seen under load: BrokenLink tests).
    auto cur = peers_.find({p.role, p.rank});
    const bool failed_over = p.rank >= 0 && static_cast<size_t>(p.rank) < placement_.dead.size() &&
                             placement_.dead[static_cast<size_t>(p.rank)];
    if (failed_over && (cur == peers_.end() || cur->second != id)) return;
    // A server may be failed over: the scheduler decides (kPlacement or
    // kPeerDead). Requests to it stay pending until then.
    PP_WARN("connection to {} closed ({}); waiting for the scheduler's verdict", p.describe(),
            why.message());
    verdict_due_[{p.role, p.rank}] = {
        clock_.now() + options_.cluster.heartbeat_timeout + suspect_grace(), why.message()};
    return;
  }
  if (p.role == Role::kWorker && book_.worker_restarts) {
    // A worker may be restarted (--max-restarts): the scheduler decides, and
    // it watches that worker itself (kPeerDead when it is lost for good). No
    // deadline of our own: a replacement dials only the servers, so nothing
    // here would ever clear one, and it would fail the job long after the
    // replacement trains (a parameter-server worker uses no worker link).
    PP_WARN("connection to {} closed ({}); waiting for its replacement or the scheduler's verdict",
            p.describe(), why.message());
    return;
  }
  live_.verdict().suspect({ErrorCode::kPeerFailure,
                           fmt::format("{} failed: connection closed ({}); it crashed, was killed "
                                       "or lost the network",
                                       p.describe(), why.message())},
                          suspect_grace());
  cv_.notify_all();
}

Millis Node::suspect_grace() const {
  const auto& c = options_.cluster;
  return std::min(c.heartbeat_timeout / 2, 2 * c.heartbeat_interval + Millis{500});
}

void Node::report_rejoined() {
  transport::ConnId sched;
  {
    std::lock_guard lock(mu_);
    sched = scheduler_;
  }
  transport_->send_copy(sched, transport::Header{.type = msg::kServerRejoined}, nullptr, 0);
}

Status Node::failure_locked() const {
  const auto& f = live_.verdict().failure();
  return f ? *f : Status{};
}

void Node::fail(Status why) {
  std::vector<std::function<void(const Status&)>> callbacks;
  {
    std::lock_guard lock(mu_);
    if (why.code() != ErrorCode::kPeerFailure) why = {ErrorCode::kPeerFailure, why.message()};
    if (!live_.verdict().decide(why)) return;
    callbacks = failure_callbacks_;
  }
  cv_.notify_all();
  PP_ERROR("PeerFailure: {}", why.message());
  for (auto& cb : callbacks)
    cb(why);
}

void Node::report_failure(const Status& why) {
  std::unique_lock lock(mu_);
  if (!failure_locked().is_ok()) return;
  transport::ConnId sched = scheduler_;
  NodeAddress me{role(), rank_, "", 0};
  lock.unlock();
  auto p = encode_dead(me, why.message());
  Status sent = transport_->send_copy(sched, transport::Header{.type = msg::kFailureReport},
                                      p.data(), p.size());
  lock.lock();
  if (sent.is_ok()) cv_.wait_for(lock, Millis{2000}, [&] { return !failure_locked().is_ok(); });
  if (!failure_locked().is_ok()) return;
  lock.unlock();
  // The scheduler did not answer (gone, or slow): fail locally with the reason.
  fail(why);
}

Placement Node::placement() const {
  std::lock_guard lock(mu_);
  return placement_;
}

uint64_t Node::placement_epoch() const {
  std::lock_guard lock(mu_);
  return placement_.epoch;
}

void Node::on_placement(std::function<void(const Placement&)> callback) {
  std::lock_guard lock(mu_);
  placement_callbacks_.push_back(std::move(callback));
}

void Node::apply_placement(Placement p) {
  std::vector<std::function<void(const Placement&)>> callbacks;
  std::vector<transport::ConnId> gone;
  {
    std::lock_guard lock(mu_);
    if (p.epoch <= placement_.epoch) return;
    cv_.notify_all();
    p.dead.resize(static_cast<size_t>(num_servers()), false);
    for (int s = 0; s < num_servers(); ++s) {
      if (!p.dead[static_cast<size_t>(s)]) continue;
      // Dead before too: a server dead before may have been restarted since
      // and be catching up (a new connection, kept) — unless the scheduler
      // says it has no live process any more (it died or was stopped while
      // catching up: this placement is its verdict), or that connection
      // closed too.
      if (placement_.is_dead(s) && p.is_restarting(s) && !verdict_due_.count({Role::kServer, s}))
        continue;
      verdict_due_.erase({Role::kServer, s});  // the verdict: failed over
      // A placement that comes late (after the server's restarted process
      // connected here): the connection now on record is the new process's,
      // not the dead one's; closing it would leave the restarted server
      // without rounds from this one (found by the simulation, seed 38).
      if (replaced_.erase({Role::kServer, s})) continue;
      auto it = peers_.find({Role::kServer, s});
      if (it != peers_.end()) {
        gone.push_back(it->second);
        peers_.erase(it);
      }
    }
    placement_ = p;
    callbacks = placement_callbacks_;
  }
  // A stopped server that wakes up later must not reach us: its connection
  // is closed (the scheduler closed it too).
  for (transport::ConnId id : gone)
    transport_->close(id, {ErrorCode::kPeerFailure, "the server was failed over"});
  PP_WARN("{} {}: parameter-server placement epoch {}", role_name(role()), rank(), p.epoch);
  for (auto& cb : callbacks)
    cb(p);
}

void Node::on_connect(transport::ConnId id, const transport::PeerInfo& p) {
  std::lock_guard lock(mu_);
  if (p.role == Role::kWorker || p.role == Role::kServer) {
    auto& slot = peers_[{p.role, p.rank}];
    // A second connection for that peer: a restarted process of it (the
    // transport refuses a second claim while the first is live).
    if (p.role == Role::kServer && slot != 0 && slot != id) replaced_.insert({p.role, p.rank});
    slot = id;
    if (int bytes = scaled_buffer(p.role, p.rank); bytes > 0)
      transport_->set_socket_buffer(id, bytes);
  }
  verdict_due_.erase({p.role, p.rank});  // a replacement of that peer reached us
  cv_.notify_all();
}

int Node::scaled_buffer(Role role, int rank) const {
  if (auto_buffer_bytes_ <= 0 || link_scale_.empty()) return 0;
  // The server whose share sets this link's window: the peer on a worker,
  // this node on a server; worker-worker and server-server links keep theirs.
  const Role me = options_.cluster.role;
  int server = -1;
  if (me == Role::kWorker && role == Role::kServer) server = rank;
  if (me == Role::kServer && role == Role::kWorker) server = rank_;
  if (server < 0 || static_cast<size_t>(server) >= link_scale_.size()) return 0;
  return static_cast<int>(auto_buffer_bytes_ * link_scale_[static_cast<size_t>(server)]);
}

void Node::set_server_link_scale(std::vector<double> scale) {
  std::vector<std::pair<transport::ConnId, int>> apply;
  {
    std::lock_guard lock(mu_);
    link_scale_ = std::move(scale);
    for (const auto& [peer, id] : peers_)
      if (int bytes = scaled_buffer(peer.first, peer.second); bytes > 0)
        apply.push_back({id, bytes});
  }
  for (const auto& [id, bytes] : apply)
    transport_->set_socket_buffer(id, bytes);
}

}  // namespace pushpull::cluster
