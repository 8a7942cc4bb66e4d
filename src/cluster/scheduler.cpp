// SPDX-License-Identifier: Apache-2.0
#include "cluster/scheduler.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "cluster/describe.h"
#include "net/address.h"
#include "pushpull/log.h"

namespace pushpull::cluster {

namespace {

// How long after a worker exited 0 without registering the others may still
// follow it (a job whose workers never open a store) before the job fails.
constexpr Millis kUnregisteredExitGrace{2000};

std::string describe_exit(int exit_code, int signal) {
  if (signal > 0) {
    const char* name = ::sigabbrev_np(signal);
    return fmt::format("was killed by signal {}{}", signal,
                       name ? fmt::format(" (SIG{})", name) : std::string());
  }
  return fmt::format("exited with code {}", exit_code);
}

}  // namespace

Scheduler::Scheduler(Options options, const ClockSource& clock)
    : options_(std::move(options)),
      clock_(clock),
      silence_(clock, options_.cluster.heartbeat_timeout),
      replicas_(ps_replicas(options_.cluster.ps_replicas, options_.cluster.num_servers)) {
  placement_.dead.assign(static_cast<size_t>(std::max(0, options_.cluster.num_servers)), false);
  net::TransportConfig tc;
  tc.net = options_.net;
  tc.role = Role::kScheduler;
  tc.rank = 0;
  tc.label = "scheduler";
  transport_ = std::make_unique<net::Transport>(std::move(tc));
  transport_->set_identity(Role::kScheduler, 0, node_id(Role::kScheduler, 0));
  transport_->set_handler(msg::kRegister, msg::kLast,
                          [this](net::Message&& m) { on_message(std::move(m)); });
  transport_->set_close_handler(
      [this](net::ConnId id, const net::PeerInfo& p, const Status& s) { on_close(id, p, s); });
}

Scheduler::~Scheduler() {
  transport_->stop();
}

int Scheduler::bind(const std::string& host) {
  int port = options_.net.port > 0 ? options_.net.port : options_.cluster.root_port;
  // An explicit host (the launcher's --host-ip) binds itself; otherwise the
  // advertised root address decides (net::bind_host_for: loopback stays
  // loopback, the wildcard only when asked).
  const std::string where =
      host.empty() ? net::bind_host_for(options_.cluster.root_uri, options_.net.bind_any)
                   : net::bind_host_for(host, options_.net.bind_any);
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

void Scheduler::broadcast(uint16_t type, const std::vector<std::byte>& payload, uint64_t key,
                          uint64_t request_id) {
  for (auto& [id, e] : nodes_)
    transport_->send_copy(id, net::Header{.type = type, .request_id = request_id, .key = key},
                          payload.data(), payload.size());
}

void Scheduler::on_message(net::Message&& m) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(m.conn);
  if (it != nodes_.end() && !it->second.left) silence_.heard(m.conn);
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
        transport_->send_copy(m.conn, net::Header{.type = msg::kAbort}, p.data(), p.size());
        transport_->close(m.conn, {ErrorCode::kInvalidArgument, why});
        return;
      }
      if (e.addr.role == Role::kWorker && !exited_unregistered_.empty()) {
        // It would wait for a worker that is gone.
        nodes_[m.conn] = e;
        silence_.heard(m.conn);
        check_unregistered_exits();
        return;
      }
      silence_.heard(m.conn);
      PP_INFO("{} registered ({} of {})", e.addr.describe(), nodes_.size() + 1,
              group_size(Group::kAll));
      nodes_[m.conn] = e;
      if (static_cast<int>(nodes_.size()) == group_size(Group::kAll)) assign_ranks();
      return;
    }
    case msg::kBarrier: {
      auto g = static_cast<Group>(m.header.key);
      if (m.header.key < 1 || m.header.key > 3 || it == nodes_.end()) return;
      auto& waiting = barrier_waiting_[static_cast<uint8_t>(g)];
      waiting[m.conn] = m.header.request_id;
      if (static_cast<int>(waiting.size()) < group_size(g)) return;
      // Each member is answered with its own count (a replacement worker's
      // count started afresh).
      auto members = std::move(waiting);
      waiting.clear();
      for (auto& [id, count] : members)
        transport_->send_copy(
            id, net::Header{.type = msg::kBarrierDone, .request_id = count, .key = m.header.key},
            nullptr, 0);
      return;
    }
    case msg::kHeartbeat:
      return;
    case msg::kServerRejoined: {
      if (it == nodes_.end() || it->second.addr.role != Role::kServer || !failure_.is_ok()) return;
      const auto r = static_cast<size_t>(it->second.addr.rank);
      if (r >= placement_.dead.size() || !placement_.dead[r]) return;
      placement_.dead[r] = false;
      placement_.late.resize(placement_.dead.size(), false);
      placement_.late[r] = true;
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
      silence_.forget(m.conn);
      PP_DEBUG("{} left", it->second.addr.describe());
      bool workers_left = complete_ && away_.empty() && it->second.addr.role == Role::kWorker &&
                          std::all_of(nodes_.begin(), nodes_.end(), [](auto& kv) {
                            return kv.second.addr.role != Role::kWorker || kv.second.left;
                          });
      if (workers_left && failure_.is_ok())
        for (auto& [id, e] : nodes_)
          if (e.addr.role == Role::kServer)
            transport_->send_copy(id, net::Header{.type = msg::kWorkersDone}, nullptr, 0);
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
  for (auto& [id, e] : nodes_) {
    // The connection is that node from now on: its messages carry this rank
    // and nobody else can connect claiming it.
    if (!transport_->bind_peer_rank(id, e.addr.rank))
      PP_WARN("{} {} said hello with another rank; its connection keeps that identity",
              role_name(e.addr.role), e.addr.rank);
    book.worker_restarts = worker_restarts_;
    auto p = encode_book(e.addr.rank, book);
    transport_->send_copy(id, net::Header{.type = msg::kAddressBook}, p.data(), p.size());
  }
  complete_ = true;
  book.worker_restarts = worker_restarts_;
  book_ = std::move(book);
  PP_INFO("all {} nodes registered; address book sent", nodes_.size());
}

void Scheduler::on_close(net::ConnId id, const net::PeerInfo&, const Status& why) {
  std::lock_guard lock(mu_);
  auto it = nodes_.find(id);
  if (it == nodes_.end() || it->second.left || finished_) return;
  lose(id, fmt::format("its connection closed ({}); it crashed, was killed or lost the network",
                       why.message()));
}

void Scheduler::lose(net::ConnId id, const std::string& reason) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  NodeAddress who = it->second.addr;
  if (who.rank < 0) who.rank = it->second.preferred;
  silence_.forget(id);
  nodes_.erase(it);
  for (auto& [group, waiting] : barrier_waiting_)
    waiting.erase(id);
  if (who.role == Role::kWorker && mark_away(who, reason)) {
    // A stopped worker that wakes up must not act as the rank any more.
    auto bye = encode_dead(who, "this worker was replaced: " + reason);
    transport_->send_copy(id, net::Header{.type = msg::kAbort}, bye.data(), bye.size());
    transport_->close(id, {ErrorCode::kPeerFailure, "worker lost; waiting for its replacement"});
    return;
  }
  const int servers = options_.cluster.num_servers;
  if (who.role != Role::kServer || replicas_ == 0 || !complete_ || !failure_.is_ok() ||
      who.rank < 0 || who.rank >= servers) {
    fail(who, reason);
    return;
  }
  placement_.dead[static_cast<size_t>(who.rank)] = true;
  if (static_cast<size_t>(who.rank) < placement_.late.size())
    placement_.late[static_cast<size_t>(who.rank)] = false;
  ++server_losses_[who.rank];
  if (int home = first_lost_home(servers, replicas_, placement_.dead); home >= 0) {
    std::string chain;
    for (int i = 0; i <= replicas_; ++i)
      chain += fmt::format("{}{}", i ? ", " : "", (home + i) % servers);
    fail(who, fmt::format("{}; no replica left: the key ranges placed on server {} lived on "
                          "servers {} (PUSHPULL_PS_REPLICAS={}), all dead",
                          reason, home, chain, replicas_));
    return;
  }
  placement_.epoch++;
  PP_WARN("fail-over: {} failed: {}; its key ranges move to their backups (placement epoch {})",
          describe_node(who), reason, placement_.epoch);
  // A stopped server that wakes up later must not serve anyone: it is told
  // to abort, and its connection is closed.
  auto bye = encode_dead(who, "this server was failed over: " + reason);
  broadcast(msg::kPlacement, encode_placement(placement_));
  transport_->send_copy(id, net::Header{.type = msg::kAbort}, bye.data(), bye.size());
  transport_->close(id, {ErrorCode::kPeerFailure, "failed over"});
}

bool Scheduler::mark_away(const NodeAddress& who, const std::string& reason) {
  if (!worker_restarts_ || !complete_ || !failure_.is_ok() || who.rank < 0 ||
      who.rank >= options_.cluster.num_workers)
    return false;
  away_[who.rank] = {clock_.now(), reason};
  ++losses_[who.rank];
  PP_WARN(
      "{} lost: {}; waiting up to {} ms for its replacement (--max-restarts); the servers hold "
      "its round open",
      describe_node(who), reason, options_.cluster.startup_timeout.count());
  cv_.notify_all();
  return true;
}

void Scheduler::rejoin(net::ConnId id, Entry e) {
  const int rank = e.preferred;
  const bool server = e.addr.role == Role::kServer;
  e.addr.rank = rank;
  if (!server) away_.erase(rank);
  silence_.heard(id);
  if (!transport_->bind_peer_rank(id, rank))
    PP_WARN("{} {}'s replacement said hello with another rank; its connection keeps that identity",
            role_name(e.addr.role), rank);
  nodes_[id] = e;
  (server ? book_.servers : book_.workers)[static_cast<size_t>(rank)] = e.addr;
  // The placement first: the replacement connects only to live servers.
  if (placement_.epoch > 0) {
    auto p = encode_placement(placement_);
    transport_->send_copy(id, net::Header{.type = msg::kPlacement}, p.data(), p.size());
  }
  AddressBook book = book_;
  book.incarnation = server ? server_losses_[rank] : losses_[rank];
  auto p = encode_book(rank, book);
  transport_->send_copy(id, net::Header{.type = msg::kAddressBook}, p.data(), p.size());
  if (server)
    PP_WARN("server {} registered again (replacement {}, {}); it fetches its key ranges", rank,
            book.incarnation, e.addr.describe());
  else
    PP_WARN("worker {} rejoined the job (replacement {}, {})", rank, book.incarnation,
            e.addr.describe());
}

int Scheduler::server_losses(int rank) const {
  std::lock_guard lock(mu_);
  auto it = server_losses_.find(rank);
  return it == server_losses_.end() ? 0 : it->second;
}

void Scheduler::allow_worker_restarts(bool on) {
  std::lock_guard lock(mu_);
  worker_restarts_ = on;
}

int Scheduler::worker_losses(int rank) const {
  std::lock_guard lock(mu_);
  auto it = losses_.find(rank);
  return it == losses_.end() ? 0 : it->second;
}

void Scheduler::process_restarting(Role role, int rank, int exit_code, int signal) {
  std::lock_guard lock(mu_);
  if (finished_ || !failure_.is_ok()) return;
  if (role == Role::kServer) {
    PP_INFO("server {} {}; the launcher restarts it", rank, describe_exit(exit_code, signal));
    return;
  }
  if (role != Role::kWorker) return;
  std::string why = fmt::format("its process {}", describe_exit(exit_code, signal));
  if (away_.count(rank)) {
    PP_INFO("worker {} {}; the launcher restarts it", rank, describe_exit(exit_code, signal));
    return;
  }
  for (auto& [id, n] : nodes_)
    if (n.addr.role == Role::kWorker && (n.preferred == rank || n.addr.rank == rank))
      return lose(id, why);
  // Not registered: it died while the job started (which fails the job), or
  // its replacement died before registering (still away: above).
  PP_INFO("worker {} {} before it registered", rank, describe_exit(exit_code, signal));
}

bool Scheduler::failed_over(Role role, int rank) const {
  std::lock_guard lock(mu_);
  return role == Role::kServer && rank >= 0 && static_cast<size_t>(rank) < placement_.dead.size() &&
         placement_.dead[static_cast<size_t>(rank)];
}

uint64_t Scheduler::placement_epoch() const {
  std::lock_guard lock(mu_);
  return placement_.epoch;
}

void Scheduler::fail(const NodeAddress& who, const std::string& reason) {
  if (!failure_.is_ok()) return;
  std::string msg = fmt::format("{} failed: {}", describe_node(who), reason);
  PP_ERROR("job failed: {}", msg);
  failure_ = {ErrorCode::kPeerFailure, msg};
  broadcast(msg::kPeerDead, encode_dead(who, reason));
  cv_.notify_all();
}

void Scheduler::abort_job(Status why) {
  if (!failure_.is_ok()) return;
  PP_ERROR("job failed: {}", why.message());
  failure_ = why;
  broadcast(msg::kAbort,
            encode_dead({Role::kScheduler, 0, options_.cluster.root_uri, port()}, why.message()));
  cv_.notify_all();
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
  if (auto expired = silence_.first_expired()) {
    auto it = nodes_.find(expired->first);
    if (it != nodes_.end()) {
      lose(expired->first, fmt::format("no heartbeat for {} ms (limit {} ms); it is stopped, hung "
                                       "or unreachable",
                                       expired->second.count(), c.heartbeat_timeout.count()));
      return;
    }
    silence_.forget(expired->first);
  }
  check_unregistered_exits();
}

Status Scheduler::run() {
  transport_->start();
  const auto& c = options_.cluster;
  std::unique_lock lock(mu_);
  started_ = clock_.now();
  // Heartbeats go out on real time; the decisions read clock_ (injectable).
  auto next_beat = std::chrono::steady_clock::now();
  while (!finished_ && failure_.is_ok()) {
    // The unregistered-exit grace may end before the next heartbeat.
    Millis wait = c.heartbeat_interval;
    if (!exited_unregistered_.empty()) wait = std::min(wait, Millis{100});
    // Wake when the next node would pass the silence limit, not an interval later.
    auto until_silent = std::chrono::duration_cast<Millis>(silence_.next_deadline() - clock_.now());
    auto until_beat =
        std::chrono::duration_cast<Millis>(next_beat - std::chrono::steady_clock::now());
    wait = std::clamp(std::min(until_silent, until_beat), Millis{1}, wait);
    cv_.wait_for(lock, wait);
    if (finished_ || !failure_.is_ok()) break;
    check_timers();
    if (finished_ || !failure_.is_ok()) break;
    if (std::chrono::steady_clock::now() >= next_beat) {
      next_beat = std::chrono::steady_clock::now() + c.heartbeat_interval;
      broadcast(msg::kHeartbeat, {});
    }
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

void Scheduler::process_exited(Role role, int rank, int exit_code, int signal) {
  std::lock_guard lock(mu_);
  if (finished_ || !failure_.is_ok()) {
    PP_DEBUG("{} {} {} after the job ended", role_name(role), rank,
             describe_exit(exit_code, signal));
    return;
  }
  if (role == Role::kServer && rank >= 0 && static_cast<size_t>(rank) < placement_.dead.size() &&
      placement_.dead[static_cast<size_t>(rank)]) {
    PP_INFO("server {} (failed over) {}", rank, describe_exit(exit_code, signal));
    return;
  }
  if (role == Role::kWorker && away_.count(rank)) {
    fail({Role::kWorker, rank, "", 0},
         fmt::format("{}; its process {} and was not restarted (no restarts left)",
                     away_[rank].reason, describe_exit(exit_code, signal)));
    return;
  }
  Entry* e = find_node(role, rank);
  if (e && e->left) return;  // it left in order: its exit is the normal end
  NodeAddress who = e ? e->addr : NodeAddress{role, rank, "", 0};
  if (who.rank < 0) who.rank = rank;
  if (exit_code != 0 || signal > 0) {
    std::string why = fmt::format("its process {}", describe_exit(exit_code, signal));
    if (e) {
      for (auto& [id, n] : nodes_) {
        if (&n != e) continue;
        if (role == Role::kWorker && worker_restarts_) {
          // The launcher does not restart it (that is process_restarting).
          silence_.forget(id);
          nodes_.erase(id);
          return fail(who, why + " and was not restarted (no restarts left)");
        }
        return lose(id, why);
      }
    }
    fail(who, why);
    return;
  }
  if (e) {
    fail(who, "its process exited (code 0) without leaving the job (no orderly shutdown)");
    return;
  }
  if (role != Role::kWorker) {
    // A server that ends cleanly without registering ran a program that does
    // not use the scheduler (e.g. one script for every role): harmless unless
    // registered nodes are waiting for it.
    if (!nodes_.empty())
      fail(who,
           "its process exited (code 0) before it registered, while registered nodes wait "
           "for it");
    else
      PP_INFO("{} {} exited (code 0) without joining the job", role_name(role), rank);
    return;
  }
  if (exited_unregistered_.empty()) first_unregistered_exit_ = clock_.now();
  exited_unregistered_.insert(rank);
  PP_INFO("worker {} exited (code 0) without joining the job", rank);
  check_unregistered_exits();
  cv_.notify_all();
}

void Scheduler::check_unregistered_exits() {
  if (exited_unregistered_.empty() || finished_ || !failure_.is_ok()) return;
  const int workers = options_.cluster.num_workers;
  const int first = *exited_unregistered_.begin();
  NodeAddress who{Role::kWorker, first, "", 0};
  auto waiting_fail = [&](const std::string& why) {
    fail(who, fmt::format("its process exited (code 0) without joining the job, {}", why));
  };
  if (count_registered(Role::kWorker) > 0)
    return waiting_fail("while registered workers wait for it to register");
  if (static_cast<int>(exited_unregistered_.size()) >= workers) {
    // No worker ever joined and every one is done: a job that did not use
    // the servers. Tell the registered servers to stop.
    PP_WARN(
        "every worker exited without joining the job; stopping the servers (hint: workers that "
        "use only collectives or torch.distributed leave the servers idle; launch them with -s "
        "0)");
    for (auto& [id, e] : nodes_) {
      transport_->send_copy(id, net::Header{.type = msg::kWorkersDone}, nullptr, 0);
      transport_->send_copy(id, net::Header{.type = msg::kShutdown}, nullptr, 0);
    }
    finished_ = true;
    cv_.notify_all();
    return;
  }
  if (clock_.now() - first_unregistered_exit_ >= kUnregisteredExitGrace)
    waiting_fail(fmt::format(
        "and {} other workers did not finish within {} ms (a job whose workers never join ends "
        "only when all of them exit 0)",
        workers - static_cast<int>(exited_unregistered_.size()), kUnregisteredExitGrace.count()));
}

void Scheduler::stop() {
  std::lock_guard lock(mu_);
  if (finished_) return;
  abort_job({ErrorCode::kInternal, "the scheduler was stopped"});
}

}  // namespace pushpull::cluster
