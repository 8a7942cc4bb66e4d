// SPDX-License-Identifier: Apache-2.0
// The cluster Node (node.h): construction, start-up (registration with the
// scheduler and connecting to the peers), barriers and shutdown. Its other
// parts: node_messages.cpp (control messages, sends to peers),
// node_dial.cpp (dialing peers that may be gone), node_liveness.cpp.
#include "cluster/node.h"

#include <future>

#include <fmt/format.h>

#include "base/flight_recorder.h"
#include "base/metrics.h"
#include "pushpull/log.h"
#include "transport/address.h"
#include "transport/socket.h"

namespace pushpull::cluster {

Node::Node(Options options, const ClockSource& clock)
    : options_(std::move(options)),
      clock_(clock),
      live_({options_.cluster.heartbeat_interval, options_.cluster.heartbeat_timeout, Millis{0}},
            clock),
      replicas_(cluster::ps_replicas(options_.cluster.ps_replicas, options_.cluster.num_servers)) {
  Role r = options_.cluster.role;
  if (r != Role::kServer && r != Role::kWorker)
    throw InvalidArgument(
        fmt::format("a Node is a server or a worker, not a {} (DMLC_ROLE)", role_name(r)));
  metrics::start_from_env();  // PUSHPULL_METRICS_PORT: the endpoint answers from now on
  flight::start_from_env();   // the ring and its SIGUSR1 dump
  transport::TransportConfig tc;
  tc.net = options_.net;
  tc.role = r;
  tc.label = std::string(role_name(r));
  tc.hold_hellos_until_ranked = true;  // peers learn our rank, which the scheduler assigns
  tc.shared_memory = options_.net.ps_shared_memory;
  // Only servers lend, and only their replicas (a worker's pulls land in its
  // own arrays): without replication the heap's pool is a little faster.
  const bool replicating = options_.cluster.ps_replicas != 0 && options_.cluster.num_servers >= 2;
  tc.lend_buffers = r == Role::kServer && replicating && tc.shared_memory && options_.net.ps_lend;
  // A silently cut link to a worker or server (the scheduler still hears
  // both) closes like a broken one, within about the heartbeat timeout.
  tc.dead_link_timeout = options_.cluster.heartbeat_timeout;
  if (tc.net.socket_buffer_bytes < 0) {
    // Automatic: the peers this node exchanges tensors with share its link.
    const int servers = options_.cluster.num_servers, workers = options_.cluster.num_workers;
    const int peers = r == Role::kWorker ? servers : workers + (replicas_ > 0 ? servers - 1 : 0);
    tc.net.socket_buffer_bytes = transport::auto_socket_buffer_bytes(peers);
    auto_buffer_bytes_ = tc.net.socket_buffer_bytes;
  }
  transport_ = std::make_unique<transport::MessageTransport>(std::move(tc));
  transport_->set_handler(msg::kRegister, msg::kLast,
                          [this](transport::Message&& m) { on_control(std::move(m)); });
  transport_->set_connect_handler(
      [this](transport::ConnId id, const transport::PeerInfo& p) { on_connect(id, p); });
  transport_->set_close_handler([this](transport::ConnId id, const transport::PeerInfo& p,
                                       const Status& s) { on_close(id, p, s); });
}

Node::~Node() {
  stop_delivery();
}

void Node::stop_delivery() {
  {
    std::lock_guard lock(mu_);
    stop_heartbeat_ = true;
  }
  cv_.notify_all();
  {
    // Two threads may call this at once (an owner and the destructor).
    std::lock_guard lock(stop_mu_);
    if (heartbeat_.joinable()) heartbeat_.join();
  }
  transport_->stop();
}

int Node::rank() const {
  std::lock_guard lock(mu_);
  return rank_;
}

Status Node::failure() const {
  std::lock_guard lock(mu_);
  return failure_locked();
}

void Node::set_handler(uint16_t first, uint16_t last, transport::Handler handler) {
  transport_->set_handler(first, last, std::move(handler));
}

void Node::on_peer_failure(std::function<void(const Status&)> callback) {
  std::lock_guard lock(mu_);
  failure_callbacks_.push_back(std::move(callback));
}

template <typename Pred>
void Node::wait_for(std::unique_lock<std::mutex>& lock, Millis timeout, const std::string& what,
                    Pred pred) {
  bool ok = cv_.wait_for(lock, timeout, [&] { return pred() || !failure_locked().is_ok(); });
  if (!failure_locked().is_ok()) failure_locked().raise();
  if (!ok)
    throw Timeout(fmt::format("{}{}: {} did not complete within {} ms", role_name(role()),
                              rank_ < 0 ? std::string() : fmt::format(" {}", rank_), what,
                              timeout.count()));
}

void Node::start() {
  const auto& c = options_.cluster;
  std::string host =
      transport::choose_host(options_.net, c.root_uri);  // the route to the scheduler
  int port =
      transport_->listen(transport::bind_host_for(host, options_.net.bind_any), options_.net.port);
  transport_->set_advertised_address(host, port);
  transport_->set_identity(role(), -1, 0);
  transport_->start();
  transport::ConnId sched = transport_->connect(c.root_uri, c.root_port);
  {
    std::lock_guard lock(mu_);
    scheduler_ = sched;
    live_.heard(0);
  }
  auto reg = encode_register({role(), -1, host, port, c.mesh_port}, c.preferred_rank);
  if (Status s = transport_->send_copy(sched, transport::Header{.type = msg::kRegister}, reg.data(),
                                       reg.size());
      !s)
    s.raise();
  heartbeat_ = std::thread([this] {
    ScopedLogContext ctx(std::string(role_name(role())));
    heartbeat_loop();
  });
  int my_rank;
  {
    std::unique_lock lock(mu_);
    // A little longer than the scheduler's own limit, so its verdict (which
    // names the missing nodes) arrives first.
    wait_for(
        lock, c.startup_timeout + Millis{2000},
        "registration with the scheduler at " + transport::format_address(c.root_uri, c.root_port),
        [&] { return have_book_ || shutdown_; });
    if (!have_book_) {
      // Every worker finished without joining the job (the scheduler says
      // so): there is nothing to serve. wait_for_workers() and shutdown()
      // return at once.
      PP_INFO("{}: the job ended before it started (no worker joined)", role_name(role()));
      return;
    }
    my_rank = rank_;
  }
  transport_->set_identity(role(), my_rank, node_id(role(), my_rank));
  PP_INFO("{} {} registered at {}", role_name(role()), my_rank,
          transport::format_address(host, port));
  // Worker -> every server; with ClusterOptions::worker_mesh also worker ->
  // every lower-rank worker.
  std::vector<NodeAddress> targets;
  // Peers that may have died or been replaced since the book was made,
  // dialed in short attempts (see below).
  std::vector<NodeAddress> maybe;
  size_t expected =
      role() == Role::kWorker
          ? static_cast<size_t>(c.num_servers + (c.worker_mesh ? c.num_workers - 1 : 0))
          : static_cast<size_t>(c.num_workers);
  if (role() == Role::kServer && book_.incarnation > 0) {
    // A restarted server joins a running job: it connects to every worker
    // and every live server (they started long ago). A worker that died
    // since this book was made is dialed at its dead address; its
    // replacement dials this server instead (below), which counts the same.
    std::lock_guard lock(mu_);
    maybe = book_.workers;
    for (const auto& s : book_.servers)
      if (s.rank != my_rank && (static_cast<size_t>(s.rank) >= placement_.dead.size() ||
                                !placement_.dead[static_cast<size_t>(s.rank)]))
        targets.push_back(s);
    expected = targets.size() + maybe.size();
  } else if (role() == Role::kWorker && book_.incarnation > 0) {
    // A replacement joins a running job: the live servers (the other
    // workers' mesh was built at the start; a parameter-server worker does
    // not need it), and, without waiting for them, the failed-over ones: one
    // may have been restarted and be dialing this rank's dead predecessor.
    std::lock_guard lock(mu_);
    for (const auto& s : book_.servers)
      if (static_cast<size_t>(s.rank) >= placement_.dead.size() ||
          !placement_.dead[static_cast<size_t>(s.rank)])
        targets.push_back(s);
      else
        maybe.push_back(s);
    expected = targets.size();
  } else if (role() == Role::kWorker) {
    targets = book_.servers;
    if (c.worker_mesh)
      for (int w = 0; w < my_rank; ++w)
        targets.push_back(book_.workers[static_cast<size_t>(w)]);
  } else if (replicas_ > 0) {
    // Replication: every server connects to every server of lower rank.
    for (int s = 0; s < my_rank; ++s)
      targets.push_back(book_.servers[static_cast<size_t>(s)]);
  }
  size_t gave_up = 0;
  if (book_.incarnation > 0) {
    // Joining a running job: a server live in the book may be stopped and
    // failed over while this node dials it (before, a replacement dialed
    // its dead address for connect_timeout, failed and spent a restart).
    for (const auto& t : targets)
      gave_up += dial_until_failed_over(t) ? 0 : 1;
  } else {
    // The first start: every peer at once (each dial and hello is a round
    // trip or more; one after another they add up with the job's size).
    std::vector<std::future<transport::ConnId>> dials;
    for (const auto& t : targets)
      dials.push_back(std::async(std::launch::async,
                                 [this, &t] { return transport_->connect(t.host, t.port); }));
    for (size_t i = 0; i < dials.size(); ++i) {
      transport::ConnId id =
          dials[i].get();  // the first failure throws (the others end by their deadline)
      std::lock_guard lock(mu_);
      peers_[{targets[i].role, targets[i].rank}] = id;
      cv_.notify_all();
    }
  }
  for (const auto& t : maybe)
    dial_if_absent(t);
  if (role() == Role::kServer && replicas_ > 0 && book_.incarnation == 0)
    expected += static_cast<size_t>(c.num_servers - 1);
  std::unique_lock lock(mu_);
  wait_for(lock, c.startup_timeout, "connecting to every peer",
           [&] { return peers_.size() + gave_up >= expected; });
}

void Node::barrier(Group group, std::optional<Millis> timeout, BarrierTag tag) {
  std::unique_lock lock(mu_);
  if (!failure_locked().is_ok()) failure_locked().raise();
  uint8_t g = static_cast<uint8_t>(group);
  uint64_t seq = ++barrier_sent_[g];
  transport::ConnId sched = scheduler_;
  lock.unlock();
  transport_->send_copy(sched,
                        transport::Header{.type = msg::kBarrier,
                                          .request_id = seq,
                                          .key = g,
                                          .offset = tag.tracked ? tag.position + 1 : 0,
                                          .length = tag.seq},
                        nullptr, 0);
  lock.lock();
  wait_for(lock, timeout.value_or(options_.cluster.barrier_timeout),
           fmt::format("barrier of {}", group_name(group)),
           [&] { return barrier_done_[g] >= seq; });
}

void Node::pass_barriers(uint64_t position) {
  transport::ConnId sched;
  {
    std::lock_guard lock(mu_);
    sched = scheduler_;
  }
  transport_->send_copy(sched, transport::Header{.type = msg::kBarrierPass, .offset = position},
                        nullptr, 0);
}

void Node::wait_for_workers() {
  std::unique_lock lock(mu_);
  wait_for(lock, options_.cluster.barrier_timeout, "the workers to finish",
           [&] { return workers_done_; });
}

void Node::shutdown() {
  std::unique_lock lock(mu_);
  if (!failure_locked().is_ok()) failure_locked().raise();
  leaving_ = true;
  transport::ConnId sched = scheduler_;
  lock.unlock();
  transport_->send_copy(sched, transport::Header{.type = msg::kLeave}, nullptr, 0);
  lock.lock();
  wait_for(lock, options_.cluster.barrier_timeout, "orderly shutdown", [&] { return shutdown_; });
  lock.unlock();
  stop_delivery();
}

}  // namespace pushpull::cluster
