// SPDX-License-Identifier: Apache-2.0
#include "cluster/scheduler.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "cluster/describe.h"
#include "pushpull/log.h"
#include "transport/address.h"

namespace pushpull::cluster {

Scheduler::Scheduler(Options options, const ClockSource& clock)
    : options_(std::move(options)),
      clock_(clock),
      live_({options_.cluster.heartbeat_interval, options_.cluster.heartbeat_timeout, Millis{0}},
            clock),
      replicas_(ps_replicas(options_.cluster.ps_replicas, options_.cluster.num_servers)) {
  placement_.dead.assign(static_cast<size_t>(std::max(0, options_.cluster.num_servers)), false);
  transport::TransportConfig tc;
  tc.net = options_.net;
  tc.role = Role::kScheduler;
  tc.rank = 0;
  tc.label = "scheduler";
  transport_ = std::make_unique<transport::MessageTransport>(std::move(tc));
  transport_->set_identity(Role::kScheduler, 0, node_id(Role::kScheduler, 0));
  transport_->set_handler(msg::kRegister, msg::kLast,
                          [this](transport::Message&& m) { on_message(std::move(m)); });
  transport_->set_close_handler([this](transport::ConnId id, const transport::PeerInfo& p,
                                       const Status& s) { on_close(id, p, s); });
}

Scheduler::~Scheduler() {
  transport_->stop();
}

int Scheduler::bind(const std::string& host) {
  int port = options_.net.port > 0 ? options_.net.port : options_.cluster.root_port;
  // An explicit host (the launcher's --host-ip) binds itself; otherwise the
  // advertised root address decides (transport::bind_host_for: loopback stays
  // loopback, the wildcard only when asked).
  const std::string where =
      host.empty() ? transport::bind_host_for(options_.cluster.root_uri, options_.net.bind_any)
                   : transport::bind_host_for(host, options_.net.bind_any);
  int bound = transport_->listen(where, port);
  transport_->set_advertised_address(options_.cluster.root_uri, bound);
  PP_INFO("scheduler listening on port {} for {} servers and {} workers", bound,
          options_.cluster.num_servers, options_.cluster.num_workers);
  return bound;
}

int Scheduler::port() const {
  return transport_->port();
}

int Scheduler::group_size(Group g) const {
  int n = 0;
  if (static_cast<uint8_t>(g) & static_cast<uint8_t>(Group::kWorkers))
    n += options_.cluster.num_workers;
  if (static_cast<uint8_t>(g) & static_cast<uint8_t>(Group::kServers))
    n += options_.cluster.num_servers -
         static_cast<int>(std::count(placement_.dead.begin(), placement_.dead.end(), true));
  return n;
}

std::vector<BarrierBook::Member> Scheduler::members(uint8_t group) const {
  std::vector<BarrierBook::Member> out;
  if (group & static_cast<uint8_t>(Group::kWorkers))
    for (int w = 0; w < options_.cluster.num_workers; ++w)
      out.emplace_back(Role::kWorker, w);
  if (group & static_cast<uint8_t>(Group::kServers))
    for (int s = 0; s < options_.cluster.num_servers; ++s)
      if (static_cast<size_t>(s) >= placement_.dead.size() ||
          !placement_.dead[static_cast<size_t>(s)])
        out.emplace_back(Role::kServer, s);
  return out;
}

void Scheduler::answer_barrier(uint8_t group, const std::vector<BarrierBook::Answer>& answers) {
  // Each member is answered with its own count (a replacement worker's count
  // started afresh).
  for (const auto& a : answers)
    transport_->send_copy(
        a.conn, transport::Header{.type = msg::kBarrierDone, .request_id = a.count, .key = group},
        nullptr, 0);
}

void Scheduler::settle_barriers() {
  for (uint8_t g : barriers_.waiting_groups())
    answer_barrier(g, barriers_.settle(g, members(g)));
}

void Scheduler::broadcast(uint16_t type, const std::vector<std::byte>& payload, uint64_t key,
                          uint64_t request_id) {
  for (auto& [id, e] : nodes_)
    transport_->send_copy(id, transport::Header{.type = type, .request_id = request_id, .key = key},
                          payload.data(), payload.size());
}

void Scheduler::on_message(transport::Message&& m) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(m.conn);
  if (it != nodes_.end() && !it->second.left) live_.heard(m.conn);
  std::span<const std::byte> payload(m.payload.data(), m.payload.size());
  switch (m.header.type) {
    case msg::kRegister: {
      Entry e;
      Status st = decode_register(payload, &e.addr, &e.preferred);
      if (st && e.addr.role != Role::kServer && e.addr.role != Role::kWorker)
        st = {ErrorCode::kProtocolError, "only servers and workers register"};
      if (!st) {
        PP_ERROR("bad registration from {}: {}", m.conn, st.message());
        transport_->close(m.conn, st);
        return;
      }
      if (complete_ && worker_restarts_ && e.addr.role == Role::kWorker && failure_.is_ok() &&
          away_.count(e.preferred) != 0) {
        rejoin(m.conn, std::move(e));
        return;
      }
      if (complete_ && worker_restarts_ && e.addr.role == Role::kServer && failure_.is_ok() &&
          e.preferred >= 0 && e.preferred < options_.cluster.num_servers &&
          placement_.dead[static_cast<size_t>(e.preferred)] &&
          std::none_of(nodes_.begin(), nodes_.end(), [&](auto& kv) {
            return kv.second.addr.role == Role::kServer && kv.second.addr.rank == e.preferred;
          })) {
        rejoin(m.conn, std::move(e));
        return;
      }
      int have = 0;
      for (auto& [id, n] : nodes_)
        have += n.addr.role == e.addr.role;
      int want = e.addr.role == Role::kServer ? options_.cluster.num_servers
                                              : options_.cluster.num_workers;
      if (complete_ || have >= want || failure_.code() != ErrorCode::kOk) {
        std::string why =
            fmt::format("the job already has its {} {}s; check DMLC_NUM_SERVER / DMLC_NUM_WORKER",
                        want, role_name(e.addr.role));
        PP_ERROR("refusing {}: {}", e.addr.describe(), why);
        auto p = encode_dead(e.addr, why);
        transport_->send_copy(m.conn, transport::Header{.type = msg::kAbort}, p.data(), p.size());
        transport_->close(m.conn, {ErrorCode::kInvalidArgument, why});
        return;
      }
      if (e.addr.role == Role::kWorker && !exited_unregistered_.empty()) {
        // It would wait for a worker that is gone.
        nodes_[m.conn] = e;
        live_.heard(m.conn);
        check_unregistered_exits();
        return;
      }
      live_.heard(m.conn);
      PP_INFO("{} registered ({} of {})", e.addr.describe(), nodes_.size() + 1,
              group_size(Group::kAll));
      nodes_[m.conn] = e;
      if (static_cast<int>(nodes_.size()) == group_size(Group::kAll)) assign_ranks();
      return;
    }
    case msg::kBarrier: {
      if (m.header.key < 1 || m.header.key > 3 || it == nodes_.end() || it->second.addr.rank < 0)
        return;
      const auto g = static_cast<uint8_t>(m.header.key);
      // offset: the worker's position + 1 (0: untracked); length: its seq there.
      BarrierTag tag{m.header.offset > 0, m.header.offset > 0 ? m.header.offset - 1 : 0,
                     m.header.length};
      answer_barrier(g, barriers_.arrive(g, {it->second.addr.role, it->second.addr.rank}, m.conn,
                                         m.header.request_id, tag, members(g)));
      return;
    }
    case msg::kBarrierPass: {
      if (it == nodes_.end() || it->second.addr.role != Role::kWorker || it->second.addr.rank < 0)
        return;
      barriers_.pass(it->second.addr.rank, m.header.offset);
      settle_barriers();
      return;
    }
    case msg::kHeartbeat:
      return;
    case msg::kServerRejoined: {
      if (it == nodes_.end() || it->second.addr.role != Role::kServer || !failure_.is_ok()) return;
      const auto r = static_cast<size_t>(it->second.addr.rank);
      if (r >= placement_.dead.size() || !placement_.dead[r]) return;
      placement_.dead[r] = false;
      placement_.late.resize(placement_.dead.size(), 0);
      placement_.late[r] = ++rejoins_;
      placement_.restarting.resize(placement_.dead.size(), false);
      placement_.restarting[r] = false;
      placement_.epoch++;
      PP_WARN(
          "server {} rejoined: it holds its key ranges again and is their backup (placement "
          "epoch {})",
          r, placement_.epoch);
      broadcast(msg::kPlacement, encode_placement(placement_));
      return;
    }
    case msg::kLeave: {
      if (it == nodes_.end()) return;
      it->second.left = true;
      live_.forget(m.conn);
      PP_DEBUG("{} left", it->second.addr.describe());
      bool workers_left = complete_ && away_.empty() && it->second.addr.role == Role::kWorker &&
                          std::all_of(nodes_.begin(), nodes_.end(), [](auto& kv) {
                            return kv.second.addr.role != Role::kWorker || kv.second.left;
                          });
      if (workers_left && failure_.is_ok())
        for (auto& [id, e] : nodes_)
          if (e.addr.role == Role::kServer)
            transport_->send_copy(id, transport::Header{.type = msg::kWorkersDone}, nullptr, 0);
      bool all = complete_ && away_.empty() &&
                 std::all_of(nodes_.begin(), nodes_.end(), [](auto& kv) { return kv.second.left; });
      if (all && failure_.is_ok()) {
        broadcast(msg::kShutdown, {});
        finished_ = true;
        cv_.notify_all();
      }
      return;
    }
    case msg::kFailureReport: {
      if (it == nodes_.end()) return;
      NodeAddress reporter;
      std::string reason;
      if (!decode_dead(payload, &reporter, &reason)) return;
      if (!failure_.is_ok() || finished_) return;
      // The reason names the node that failed (the engine's verdict); the
      // reporter is only the messenger.
      PP_ERROR("job failed: {} (reported by {})", reason, it->second.addr.describe());
      failure_ = {ErrorCode::kPeerFailure, reason};
      broadcast(msg::kAbort,
                encode_dead({Role::kScheduler, 0, options_.cluster.root_uri, port()}, reason));
      cv_.notify_all();
      return;
    }
    default:
      PP_WARN("scheduler ignores message type {} from connection {}", m.header.type, m.conn);
  }
}

void Scheduler::assign_ranks() {
  AddressBook book;
  book.scheduler = {Role::kScheduler, 0, options_.cluster.root_uri, transport_->port()};
  for (Role role : {Role::kServer, Role::kWorker}) {
    std::vector<Entry*> list;
    for (auto& [id, e] : nodes_)
      if (e.addr.role == role) list.push_back(&e);
    const int n = static_cast<int>(list.size());
    std::vector<bool> seen(static_cast<size_t>(n), false);
    bool use_preferred = true;
    for (auto* e : list) {
      if (e->preferred < 0 || e->preferred >= n || seen[static_cast<size_t>(e->preferred)]) {
        use_preferred = false;
        break;
      }
      seen[static_cast<size_t>(e->preferred)] = true;
    }
    if (use_preferred) {
      for (auto* e : list)
        e->addr.rank = e->preferred;
    } else {
      std::sort(list.begin(), list.end(), [](Entry* a, Entry* b) {
        return std::tie(a->addr.host, a->addr.port) < std::tie(b->addr.host, b->addr.port);
      });
      for (int i = 0; i < n; ++i)
        list[static_cast<size_t>(i)]->addr.rank = i;
    }
    auto& out = role == Role::kServer ? book.servers : book.workers;
    out.resize(static_cast<size_t>(n));
    for (auto* e : list)
      out[static_cast<size_t>(e->addr.rank)] = e->addr;
  }
  book.one_host = same_host(book);
  book.worker_restarts = worker_restarts_;
  std::vector<std::byte> encoded = encode_book(0, book);
  for (auto& [id, e] : nodes_) {
    // The connection is that node from now on: its messages carry this rank
    // and nobody else can connect claiming it.
    if (!transport_->bind_peer_rank(id, e.addr.rank))
      PP_WARN("{} {} said hello with another rank; its connection keeps that identity",
              role_name(e.addr.role), e.addr.rank);
    set_book_rank(encoded, e.addr.rank);
    transport_->send_copy(id, transport::Header{.type = msg::kAddressBook}, encoded.data(),
                          encoded.size());
  }
  complete_ = true;
  book_ = std::move(book);
  PP_INFO("all {} nodes registered; address book sent", nodes_.size());
}

void Scheduler::check_timers() {
  const auto& c = options_.cluster;
  auto now = clock_.now();
  if (!complete_ && now - started_ > c.startup_timeout) {
    int servers = 0, workers = 0;
    for (auto& [id, e] : nodes_)
      (e.addr.role == Role::kServer ? servers : workers)++;
    abort_job(
        {ErrorCode::kTimeout,
         fmt::format("only {} of {} servers and {} of {} workers registered within {} ms; "
                     "start the missing nodes or check their DMLC_PS_ROOT_URI / "
                     "DMLC_PS_ROOT_PORT",
                     servers, c.num_servers, workers, c.num_workers, c.startup_timeout.count())});
    return;
  }
  for (auto& [rank, away] : away_)
    if (now - away.since > c.startup_timeout) {
      fail({Role::kWorker, rank, "", 0},
           fmt::format("{}; its replacement did not register within {} ms", away.reason,
                       c.startup_timeout.count()));
      return;
    }
  check_unregistered_exits();
  using Event = transport::Liveness::Event;
  for (Event e = live_.poll(); e.kind != Event::kNone && !finished_ && failure_.is_ok();
       e = live_.poll()) {
    if (e.kind == Event::kBeat) {
      broadcast(msg::kHeartbeat, {});
    } else if (e.kind == Event::kDead && nodes_.count(e.member)) {  // (no probes: no kProbe)
      lose(e.member, fmt::format("no heartbeat for {} ms (limit {} ms); it is stopped, hung or "
                                 "unreachable",
                                 e.silence.count(), c.heartbeat_timeout.count()));
    }
  }
}

Status Scheduler::run() {
  transport_->start();
  std::unique_lock lock(mu_);
  started_ = clock_.now();
  // Beats go out on real time; the decisions read clock_ (injectable).
  while (!finished_ && failure_.is_ok()) {
    // Until the detector's next event (a beat, the next silence limit); the
    // unregistered-exit grace may end sooner.
    Millis wait = live_.until_next();
    if (!exited_unregistered_.empty()) wait = std::min(wait, Millis{100});
    cv_.wait_for(lock, std::max(wait, Millis{1}));
    if (finished_ || !failure_.is_ok()) break;
    check_timers();
  }
  Status result = finished_ ? Status{} : failure_;
  lock.unlock();
  // Let the last messages (shutdown, peer dead) reach the nodes.
  transport_->drain(Millis{2000});
  if (result.is_ok()) {
    // Give the nodes a moment to close first, so none sees us vanish early.
    auto deadline = std::chrono::steady_clock::now() + Millis{2000};
    while (!transport_->connections().empty() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(Millis{5});
    PP_INFO("all nodes left; scheduler done");
  }
  transport_->stop();
  return result;
}

Scheduler::Entry* Scheduler::find_node(Role role, int rank) {
  for (auto& [id, e] : nodes_)
    if (e.addr.role == role && e.preferred == rank) return &e;
  for (auto& [id, e] : nodes_)
    if (e.addr.role == role && e.preferred < 0 && e.addr.rank == rank) return &e;
  return nullptr;
}

int Scheduler::registered() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(nodes_.size());
}

int Scheduler::count_registered(Role role) const {
  int n = 0;
  for (const auto& [id, e] : nodes_)
    n += e.addr.role == role;
  return n;
}

void Scheduler::stop() {
  std::lock_guard lock(mu_);
  if (finished_) return;
  abort_job({ErrorCode::kInternal, "the scheduler was stopped"});
}

}  // namespace pushpull::cluster
