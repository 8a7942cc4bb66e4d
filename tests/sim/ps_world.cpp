// SPDX-License-Identifier: Apache-2.0
// The simulated parameter-server job (ps_world.h): events on a simulated
// clock, a network of per-link FIFO connections, the real ServerStores, and
// models of the scheduler, the servers' replication and the worker stores.
#include "sim/ps_world.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <set>

#include "cluster/barrier_book.h"
#include "cluster/protocol.h"
#include "ps/protocol.h"
#include "ps/server_store.h"
#include "pushpull/array.h"
#include "pushpull/optimizer.h"

namespace pushpull::sim {

std::string Fault::describe() const {
  if (kind == kPartition)
    return fmt::format("cut server {} from {} at {} us for {} us", server,
                       peer_role == kScheduler
                           ? std::string("the scheduler")
                           : fmt::format("{} {}", peer_role == kServer ? "server" : "worker", peer),
                       at_us, continue_after_us);
  if (kind == kKillWorker)
    return fmt::format("kill worker {} at {} us, its replacement starts {} us later", server, at_us,
                       continue_after_us);
  if (kind == kKill && continue_after_us > 0)
    return fmt::format("kill server {} at {} us, restarted {} us after its fail-over", server,
                       at_us, continue_after_us);
  if (kind == kKill) return fmt::format("kill server {} at {} us", server, at_us);
  if (continue_after_us == 0) return fmt::format("stop server {} at {} us for good", server, at_us);
  return fmt::format("stop server {} at {} us, continue {} us later", server, at_us,
                     continue_after_us);
}

std::string Scenario::describe() const {
  std::string out = fmt::format(
      "seed {}: {} servers, {} workers, PUSHPULL_PS_REPLICAS={}, {}, {} rounds, barrier every {}",
      seed, servers, workers, replicas, sync ? "dist_sync" : "dist_async", rounds, barrier_every);
  for (const Fault& f : faults)
    out += "\n  " + f.describe();
  return out;
}

Scenario scenario_for_seed(uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 1);
  auto pick = [&](uint64_t n) { return rng() % n; };
  Scenario s;
  s.seed = seed;
  s.servers = 3 + static_cast<int>(pick(2));  // 3 or 4
  s.workers = 2 + static_cast<int>(pick(2));
  s.replicas = static_cast<int>(pick(static_cast<uint64_t>(s.servers)));  // 0 .. S-1
  s.sync = pick(4) != 0;
  s.rounds = 8 + static_cast<int>(pick(8));
  if (s.sync && pick(2) == 0) s.barrier_every = 1 + static_cast<int>(pick(4));
  const int faults = static_cast<int>(pick(3)) + (s.replicas > 0 ? 1 : 0);
  for (int i = 0; i < faults; ++i) {
    Fault f;
    if (pick(5) == 0) {
      f.kind = Fault::kPartition;
      f.server = static_cast<int>(pick(static_cast<uint64_t>(s.servers)));
      f.at_us = pick(40'000);
      f.peer_role = static_cast<Fault::PeerRole>(pick(3));
      if (f.peer_role == Fault::kServer) {
        f.peer = static_cast<int>(pick(static_cast<uint64_t>(s.servers)));
        if (f.peer == f.server) f.peer = (f.peer + 1) % s.servers;
      } else if (f.peer_role == Fault::kWorker) {
        f.peer = static_cast<int>(pick(static_cast<uint64_t>(s.workers)));
      }
      // Data links: shorter than the heartbeat timeout (longer, the nodes
      // fail the job naming the link: a clean end, not simulated); the
      // scheduler's: any length.
      f.continue_after_us =
          f.peer_role == Fault::kScheduler ? 100'000 + pick(3'000'000) : 1'000 + pick(1'800'000);
      s.faults.push_back(f);
      continue;
    }
    if (pick(3) == 0) {
      f.kind = Fault::kKillWorker;
      f.server = static_cast<int>(pick(static_cast<uint64_t>(s.workers)));
      f.at_us = pick(40'000);
      f.continue_after_us = 100 + pick(20'000);
      s.faults.push_back(f);
      continue;
    }
    f.server = static_cast<int>(pick(static_cast<uint64_t>(s.servers)));
    // Rounds take a few ms of simulated time; faults land anywhere in the job,
    // often close together (a second failure during the first's recovery).
    f.at_us = pick(3) == 0 ? pick(2'000) : pick(40'000);
    if (i > 0 && pick(2) == 0) f.at_us = s.faults.back().at_us + pick(3'000);
    if (pick(3) == 0) {
      f.kind = Fault::kStop;
      const uint64_t mode = pick(3);  // shorter than the heartbeat timeout, longer, never
      f.continue_after_us = mode == 0   ? 1 + pick(1'500'000)
                            : mode == 1 ? 2'100'000 + pick(1'000'000)
                                        : 0;
    }
    // A killed server is restarted (--max-restarts) half the time: it
    // catches up and rejoins, last in its chains.
    if (f.kind == Fault::kKill && pick(2) == 0) f.continue_after_us = 100 + pick(20'000);
    s.faults.push_back(f);
  }
  return s;
}

namespace {

using cluster::Placement;
using ps::PartId;
using ps::Payload;
using ps::ReplicaState;
using ps::RequestMeta;

constexpr uint64_t kHeartbeatTimeoutUs = 2'000'000;
constexpr uint64_t kDeadlineUs = 600'000'000;  // the job's: every wait ends before it
constexpr int kScheduler = 0;

struct Msg {
  enum Type {
    kInit,
    kPush,
    kPull,
    kRejoin,  // a replacement's pull with the rejoin flag (ServerStore::rejoin)
    kReply,
    kError,
    kReplica,
    kReplicaAck,
    kPlacement,
    kAbort,
    kBarrier,  // worker -> scheduler: seq = its barrier count, tag
    kBarrierDone,
    kBarrierPass,    // worker -> scheduler: seq = its position
    kRejoinRequest,  // restarted server -> live server: seq = its catch-up generation
    kRejoinDone,     // live server -> restarted server: seq = that generation
  };
  Type type = kReply;
  uint64_t request_id = 0;
  int part = 0;  // index into World::parts_
  uint64_t seq = 0;
  uint64_t epoch = 0;
  std::vector<float> values;
  std::vector<std::byte> bytes;  // a reply's data
  std::string text;
  cluster::BarrierTag tag;
  std::shared_ptr<const ReplicaState> state;
  uint64_t replication = 0;
  Placement placement;
};

struct PartInfo {
  PartId id;
  int64_t count;
  int home;
  std::string name;
};

Payload floats(const std::vector<float>& v) {
  auto a = std::make_shared<Array>(Shape{static_cast<int64_t>(v.size())}, DType::kFloat32);
  if (!v.empty()) std::memcpy(a->data(), v.data(), v.size() * sizeof(float));
  return Payload{a->view(), a};
}

class World;

// A server: the real store, the replication model (ps::Server::replicate).
class Server : public ps::ServerResponder {
 public:
  Server(World& w, int rank);
  ~Server() override;
  void reply(const RequestMeta& to, const Status& status, DType, std::span<const std::byte> data,
             std::shared_ptr<void>) override;
  bool replicate(const PartId& part, std::shared_ptr<const ReplicaState> state,
                 std::function<void()> done) override;
  void handle(int from, const Msg& m);
  ps::ServerStore& store() { return *store_; }
  const Placement& view() const { return view_; }
  // Server rejoin (server_replication.cpp): a restarted server asks every
  // live server for the ranges it backs up.
  void rejoin(const Placement& p);

 private:
  void request(int from, const Msg& m);
  void apply_placement(const Placement& p);
  void on_rejoin_request(int from, uint64_t generation);
  void acked(uint64_t replication, int backup);
  void send_replica(const PartId& part, const std::shared_ptr<const ReplicaState>& state,
                    const std::vector<int>& backups, std::function<void()> done);
  World& w_;
  int rank_;
  std::unique_ptr<ps::ServerStore> store_;
  Placement view_;
  struct Outgoing {
    std::set<int> waiting;
    std::function<void()> done;
  };
  std::map<uint64_t, Outgoing> outgoing_;
  uint64_t next_replication_ = 1;
  std::deque<std::pair<int, Msg>> held_;  // requests of a newer placement epoch
  std::set<int> catching_up_;             // restarted servers this one sends rounds to
  std::set<int> rejoin_waiting_;          // (restarted side) live servers still sending
  uint64_t rejoin_generation_ = 0;
  uint64_t joined_epoch_ = 0;  // a restarted server's placement at registration
};

// A worker's store (dist_store*.cpp): every round a pushpull of every part.
struct Worker {
  int rank = 0;
  Placement view;
  int round = 0;  // the round in flight (0: init)
  struct Pending {
    int part;
    Msg::Type type;
    uint64_t seq;
    int server;
  };
  std::map<uint64_t, Pending> pending;  // request id -> what it is
  std::map<int, uint64_t> current;      // part -> its live request id
  std::map<int, std::vector<float>> got;
  bool finished = false;
  uint64_t next_rid = 1;
  // Worker restart (dist_store.cpp): incarnation, adoption, barriers.
  bool dead = false;
  int incarnation = 0;
  std::map<int, uint64_t> applied;  // a replacement's adoption: part -> applied seq
  bool pass_due = false;
  uint64_t position = 0;  // pushes issued (one per part and round)
  uint64_t tag_position = 0, tag_seq = 0, barriers = 0;
  bool in_barrier = false;
};

class World {
 public:
  explicit World(const Scenario& s);
  Outcome run();

  // The network. false when the connection is gone (the real send fails).
  bool send(int from, int to, Msg m);
  // Runs `fn` as the next event (a completion callback of the real code).
  void soon(std::function<void()> fn) { at(now_ + 1, std::move(fn)); }
  void close(int a, int b);  // their connection, both directions
  // A process ended: nothing reaches it any more, it sends nothing more, and
  // what it had sent still arrives (the kernel delivers it).
  void close_dead(int node);
  int server_node(int rank) const { return 1 + rank; }
  int worker_node(int rank) const { return 1 + s_.servers + rank; }
  const Scenario& scenario() const { return s_; }
  const std::vector<PartInfo>& parts() const { return parts_; }
  int replicas() const { return s_.replicas; }
  void violation(std::string what) { out_.violations.push_back(std::move(what)); }
  uint64_t now() const { return now_; }
  // A failed-over server acted on the scheduler's abort: it exits.
  void abort_server(int rank) { kill(rank); }
  // A restarted server caught up: alive again, last in its chains.
  void server_rejoined(int rank);
  // `node` applies a placement that fails `server` over: closes their
  // connection unless a restarted process of it opened it meanwhile.
  void close_for_placement(int node, int server);
  bool is_worker(int node) const { return node > s_.servers; }

 private:
  void at(uint64_t t, std::function<void()> fn) { events_.push({t, next_event_++, std::move(fn)}); }
  void deliver(int from, int to, uint64_t gen, const Msg& m);
  void handle(int node, int from, const Msg& m);
  // The scheduler (scheduler_failures.cpp): a server is lost.
  void lose(int server, const std::string& why);
  void inject(const Fault& f);
  void kill(int server);
  void kill_worker(int rank, uint64_t restart_after);
  void restart_server(int rank);
  void reopen(int node);                     // a new process at that node: new connections
  const Placement& view_of(int node) const;  // a server's or worker's placement
  void restart_worker(int rank);
  void on_scheduler(int from, const Msg& m);
  void barrier_done(const std::vector<cluster::BarrierBook::Answer>& answers);
  void after_round(Worker& w);
  // Workers.
  int primary(const Worker& w, int part) const;
  void send_request(Worker& w, int part, Msg::Type type, uint64_t seq);
  void start_round(Worker& w);
  void on_reply(Worker& w, const Msg& m);
  void on_placement(Worker& w, const Placement& p);
  void all_inited();
  void check_round(Worker& w);
  void final_pulls();

  Scenario s_;
  std::mt19937_64 rng_;
  uint64_t now_ = 0, next_event_ = 0;
  struct Event {
    uint64_t t, order;
    std::function<void()> fn;
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : order > o.order; }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  struct Link {
    uint64_t gen = 0;
    uint64_t last = 0;
    bool closed = false;
    // Opened by a restarted process: a late placement failing over its
    // predecessor keeps it (cluster::Node's replaced_).
    bool renewed = false;
  };
  std::map<std::pair<int, int>, Link> links_;
  std::vector<bool> dead_, stopped_;     // by server rank (processes)
  std::vector<uint64_t> restart_after_;  // by server rank: the launcher restarts it (0: no)
  uint32_t rejoins_ = 0;
  std::vector<std::deque<std::tuple<int, uint64_t, Msg>>> inbox_;  // a stopped server's
  std::vector<uint64_t> stop_token_;
  std::map<std::pair<int, int>, uint64_t> cut_until_;  // link -> when it heals
  Placement placement_;                                // the scheduler's
  std::vector<PartInfo> parts_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<Worker> workers_;
  // The reference: each part's value after every round, from the same
  // optimizer on one copy.
  std::vector<std::vector<std::vector<float>>> expected_;  // [round][part] (sync)
  std::vector<std::vector<float>> initial_;
  std::string spec_;
  bool job_failed_ = false;
  bool pulled_final_ = false;
  int inits_left_ = 0;
  bool inited_ = false;
  cluster::BarrierBook barriers_;  // the scheduler's (real)
  std::map<uint64_t, int> barrier_conns_;
  std::map<uint64_t, int> init_rids_;
  Outcome out_;
  const bool trace_ = std::getenv("PP_SIM_TRACE") != nullptr;  // every message handled
};

// ---- the world -------------------------------------------------------------

World::World(const Scenario& s) : s_(s), rng_(s.seed) {
  dead_.assign(s.servers, false);
  restart_after_.assign(s.servers, 0);
  stopped_.assign(s.servers, false);
  inbox_.resize(s.servers);
  stop_token_.assign(s.servers, 0);
  placement_.dead.assign(s.servers, false);
  placement_.late.assign(s.servers, 0);
  placement_.restarting.assign(s.servers, false);
  // Parts: three whole keys at homes 0, 1, 2 and a key split over two servers.
  parts_ = {{{1, 0}, 4, 0, "a"},
            {{2, 0}, 3, 1 % s.servers, "b"},
            {{3, 0}, 3, 2 % s.servers, "c.0"},
            {{3, 3}, 3, 3 % s.servers, "c.1"}};
  for (size_t p = 0; p < parts_.size(); ++p) {
    std::vector<float> v(static_cast<size_t>(parts_[p].count));
    for (size_t e = 0; e < v.size(); ++e)
      v[e] = static_cast<float>(1 + e + 10 * p);  // distinct per element and part
    initial_.push_back(v);
  }
  spec_ = s.sync ? "sgd:learning_rate=0.5,momentum=0.5" : "test:rescale_grad=0.5";
  if (s.sync) {
    auto opt = create_optimizer(OptimizerSpec::parse(spec_));
    std::vector<std::vector<float>> w = initial_;
    expected_.push_back(w);
    const float sum = static_cast<float>(s.workers * (s.workers + 1) / 2);
    for (int k = 1; k <= s.rounds; ++k) {
      for (size_t p = 0; p < parts_.size(); ++p) {
        std::vector<float> g(w[p].size(), sum);
        ArrayView wv(w[p].data(), DType::kFloat32, Shape{static_cast<int64_t>(w[p].size())});
        ArrayView gv(g.data(), DType::kFloat32, Shape{static_cast<int64_t>(g.size())});
        opt->update(Key(static_cast<int64_t>(p)), wv, gv);
      }
      expected_.push_back(w);
    }
  }
  for (int r = 0; r < s.servers; ++r)
    servers_.push_back(std::make_unique<Server>(*this, r));
  workers_.resize(static_cast<size_t>(s.workers));
  for (int r = 0; r < s.workers; ++r) {
    workers_[r].rank = r;
    workers_[r].view = placement_;
  }
}

bool World::send(int from, int to, Msg m) {
  Link& l = links_[{from, to}];
  if (l.closed) return false;  // that connection is gone: the send fails
  uint64_t delay = 20 + rng_() % 1'000;
  if (rng_() % 40 == 0) delay += rng_() % 30'000;   // a burst on this link
  uint64_t t = std::max(now_ + delay, l.last + 1);  // per-link FIFO (TCP)
  if (auto cut = cut_until_.find({from, to}); cut != cut_until_.end() && cut->second > now_)
    t = std::max(t, cut->second + delay);  // retransmitted once the link is back
  l.last = t;
  const uint64_t gen = l.gen;
  at(t, [this, from, to, gen, m = std::move(m)] { deliver(from, to, gen, m); });
  return true;
}

void World::close(int a, int b) {
  for (auto key : {std::make_pair(a, b), std::make_pair(b, a)}) {
    Link& l = links_[key];
    l.closed = true;
    ++l.gen;  // what is in flight is lost with it
  }
}

void World::close_dead(int node) {
  for (int n = 0; n <= s_.servers + s_.workers; ++n) {
    if (n == node) continue;
    Link& in = links_[{n, node}];
    in.closed = true;
    ++in.gen;
    links_[{node, n}].closed = true;
  }
}

void World::deliver(int from, int to, uint64_t gen, const Msg& m) {
  if (links_[{from, to}].gen != gen || job_failed_) return;
  if (is_worker(to) && workers_[static_cast<size_t>(to - 1 - s_.servers)].dead) return;
  if (to >= 1 && to <= s_.servers) {
    const int r = to - 1;
    if (dead_[r]) return;
    if (stopped_[r]) {
      inbox_[r].emplace_back(from, gen, m);  // in its socket buffer
      return;
    }
  }
  handle(to, from, m);
}

void World::handle(int node, int from, const Msg& m) {
  ++out_.events;
  if (trace_)
    fmt::print("{:>8} {} -> {}: type {} rid {} part {} seq {} epoch {} values {} bytes {}\n", now_,
               from, node, static_cast<int>(m.type), m.request_id, m.part, m.seq,
               m.type == Msg::kPlacement ? m.placement.epoch : m.epoch, fmt::join(m.values, ","),
               m.bytes.size());
  if (node == kScheduler) return on_scheduler(from, m);
  if (node >= 1 && node <= s_.servers) return servers_[node - 1]->handle(from, m);
  Worker& w = workers_[static_cast<size_t>(node - 1 - s_.servers)];
  if (w.dead) return;
  if (m.type == Msg::kBarrierDone) {
    w.in_barrier = false;
    return start_round(w);
  }
  if (m.type == Msg::kPlacement) return on_placement(w, m.placement);
  on_reply(w, m);
}

void World::kill(int server) {
  if (dead_[server]) return;
  dead_[server] = true;
  inbox_[server].clear();
  close_dead(server_node(server));
  // The scheduler sees its connection close at once.
  at(now_ + 500, [this, server] { lose(server, "its connection closed"); });
}

void World::inject(const Fault& f) {
  if (f.kind == Fault::kKillWorker) {
    // (After the job's start: a worker 0 that dies before its init is out
    // of this model.)
    if (!inited_) return at(now_ + 5'000, [this, f] { inject(f); });
    return kill_worker(f.server, f.continue_after_us);
  }
  if (f.kind == Fault::kKill) {
    if (f.continue_after_us > 0 && !dead_[f.server])
      restart_after_[f.server] = f.continue_after_us;  // --max-restarts
    return kill(f.server);
  }
  if (f.kind == Fault::kPartition) {
    const int a = server_node(f.server);
    const int b = f.peer_role == Fault::kScheduler ? kScheduler
                  : f.peer_role == Fault::kServer  ? server_node(f.peer)
                                                   : worker_node(f.peer);
    const uint64_t until = now_ + f.continue_after_us;
    cut_until_[{a, b}] = std::max(cut_until_[{a, b}], until);
    cut_until_[{b, a}] = std::max(cut_until_[{b, a}], until);
    if (b == kScheduler && f.continue_after_us >= kHeartbeatTimeoutUs)
      // No heartbeat either way: the scheduler fails it over, and the server,
      // which does not hear the scheduler, exits.
      at(now_ + kHeartbeatTimeoutUs, [this, f] { kill(f.server); });
    return;
  }
  if (dead_[f.server] || stopped_[f.server]) return;
  stopped_[f.server] = true;
  const uint64_t token = ++stop_token_[f.server];
  // Silent for heartbeat_timeout: the scheduler declares it dead.
  at(now_ + kHeartbeatTimeoutUs, [this, f, token] {
    if (stopped_[f.server] && stop_token_[f.server] == token)
      lose(f.server, "no heartbeat for 2000 ms");
  });
  if (f.continue_after_us > 0)
    at(now_ + f.continue_after_us, [this, f] {
      if (dead_[f.server] || !stopped_[f.server]) return;
      stopped_[f.server] = false;
      // A zombie when it was failed over meanwhile: it reads what its
      // sockets hold, the scheduler's abort last, and acts on it.
      auto inbox = std::move(inbox_[f.server]);
      for (auto& [from, gen, m] : inbox) {
        if (dead_[f.server]) break;
        if (links_[{from, server_node(f.server)}].gen == gen || from == kScheduler)
          handle(server_node(f.server), from, m);
      }
    });
}

void World::lose(int server, const std::string& why) {
  if (job_failed_) return;
  // Dead already and not restarting: nothing new (a restarted server lost
  // while catching up is lost again: a new placement, below).
  if (placement_.dead[server] && !placement_.restarting[server]) return;
  placement_.dead[server] = true;
  placement_.late[server] = 0;
  placement_.restarting[server] = false;
  if (int home = cluster::first_lost_home(s_.servers, s_.replicas, placement_.dead); home >= 0) {
    job_failed_ = true;
    out_.failed_cleanly = true;
    out_.failure = fmt::format("server {} failed ({}); no replica left for the ranges of server {}",
                               server, why, home);
    return;
  }
  placement_.epoch++;
  Msg p;
  p.type = Msg::kPlacement;
  p.placement = placement_;
  for (int r = 0; r < s_.servers; ++r)
    if (r != server && (!placement_.dead[r] || placement_.restarting[r]))
      send(kScheduler, server_node(r), p);
  for (int r = 0; r < s_.workers; ++r)
    send(kScheduler, worker_node(r), p);
  // The failed-over server is told to abort (a stopped one acts on it if it
  // ever wakes up).
  Msg abort;
  abort.type = Msg::kAbort;
  send(kScheduler, server_node(server), abort);
  // The launcher kills a failed-over process and restarts it while its
  // budget lasts (here: once per kill fault that asked for it).
  if (const uint64_t after = std::exchange(restart_after_[server], 0); after > 0)
    at(now_ + after, [this, server] { restart_server(server); });
}

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

// ---- workers -----------------------------------------------------------------

void World::kill_worker(int rank, uint64_t restart_after) {
  Worker& w = workers_[static_cast<size_t>(rank)];
  if (w.dead || w.finished) return;
  w.dead = true;
  const int node = worker_node(rank);
  close_dead(node);
  // The scheduler sees the close after what the worker sent it: away (its
  // barrier arrivals go; the barrier waits for its replacement); then the
  // launcher's restart.
  const uint64_t lost = std::max(now_, links_[{node, kScheduler}].last) + 1;
  at(lost, [this, rank] { barriers_.lose({Role::kWorker, rank}); });
  at(std::max(lost, now_ + restart_after) + 1, [this, rank] { restart_worker(rank); });
}

void World::restart_worker(int rank) {
  if (job_failed_) return;
  Worker& w = workers_[static_cast<size_t>(rank)];
  const int node = worker_node(rank);
  for (int n = 0; n <= s_.servers + s_.workers; ++n) {  // new connections
    links_[{node, n}] = Link{links_[{node, n}].gen + 1, 0, false};
    links_[{n, node}] = Link{links_[{n, node}].gen + 1, 0, false};
  }
  for (int s = 0; s < s_.servers; ++s)
    if (placement_.dead[s] && !placement_.restarting[s]) close(node, server_node(s));
  const int incarnation = w.incarnation + 1;
  w = Worker{};
  w.rank = rank;
  w.incarnation = incarnation;
  w.next_rid = (static_cast<uint64_t>(incarnation) << 40) + 1;
  w.view = placement_;  // the scheduler sends it first
  // init: adopt every part's value and counts (kPull with the rejoin flag).
  for (int p = 0; p < static_cast<int>(parts_.size()); ++p)
    send_request(w, p, Msg::kRejoin, 0);
}

void World::on_scheduler(int from, const Msg& m) {
  if (!is_worker(from)) return;
  const int rank = from - worker_node(0);
  if (m.type == Msg::kBarrierPass) {
    barriers_.pass(rank, m.seq);
    for (uint8_t g : barriers_.waiting_groups()) {
      std::vector<cluster::BarrierBook::Member> all;
      for (int r = 0; r < s_.workers; ++r)
        all.emplace_back(Role::kWorker, r);
      barrier_done(barriers_.settle(g, all));
    }
    return;
  }
  if (m.type != Msg::kBarrier) return;
  std::vector<cluster::BarrierBook::Member> all;
  for (int r = 0; r < s_.workers; ++r)
    all.emplace_back(Role::kWorker, r);
  barrier_done(barriers_.arrive(1, {Role::kWorker, rank}, static_cast<net::ConnId>(from), m.seq,
                                m.tag, all));
}

void World::barrier_done(const std::vector<cluster::BarrierBook::Answer>& answers) {
  for (const auto& a : answers) {
    Msg done;
    done.type = Msg::kBarrierDone;
    done.seq = a.count;
    send(kScheduler, static_cast<int>(a.conn), std::move(done));
  }
}

void World::after_round(Worker& w) {
  if (w.round >= s_.rounds) {
    w.finished = true;
    if (!s_.sync &&
        std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.finished; }))
      final_pulls();
    return;
  }
  if (s_.barrier_every > 0 && w.round % s_.barrier_every == 0) {
    // kv.barrier() at an epoch's end, tagged with the worker's position.
    if (w.position != w.tag_position) {
      w.tag_position = w.position;
      w.tag_seq = 0;
    }
    Msg b;
    b.type = Msg::kBarrier;
    b.seq = ++w.barriers;
    b.tag = {true, w.tag_position, ++w.tag_seq};
    w.in_barrier = true;
    send(worker_node(w.rank), kScheduler, std::move(b));
    return;
  }
  start_round(w);
}

int World::primary(const Worker& w, int part) const {
  return cluster::replica_chain(parts_[part].home, s_.servers, s_.replicas, w.view.dead,
                                w.view.late)
      .primary;
}

void World::send_request(Worker& w, int part, Msg::Type type, uint64_t seq) {
  const int server = primary(w, part);
  const uint64_t rid = w.next_rid++;
  w.pending[rid] = {part, type, seq, server};
  w.current[part] = rid;
  if (server < 0) return;  // the job fails (no replica left)
  Msg m;
  m.type = type;
  m.request_id = rid;
  m.part = part;
  m.seq = seq;
  m.epoch = w.view.epoch;
  if (type == Msg::kInit) m.values = initial_[part];
  if (type == Msg::kPush)
    m.values.assign(static_cast<size_t>(parts_[part].count), static_cast<float>(w.rank + 1));
  send(worker_node(w.rank), server_node(server), std::move(m));
}

void World::start_round(Worker& w) {
  if (w.pass_due) {
    // A replacement's first push: past every barrier at its position.
    w.pass_due = false;
    Msg pass;
    pass.type = Msg::kBarrierPass;
    pass.seq = w.position;
    send(worker_node(w.rank), kScheduler, std::move(pass));
  }
  ++w.round;
  w.position += parts_.size();
  w.got.clear();
  for (int p = 0; p < static_cast<int>(parts_.size()); ++p)
    send_request(w, p, Msg::kPush, static_cast<uint64_t>(w.round));
}

void World::on_reply(Worker& w, const Msg& in) {
  Msg m = in;
  if (m.type == Msg::kReply && m.values.empty() && !m.bytes.empty()) {
    m.values.resize(m.bytes.size() / sizeof(float));
    std::memcpy(m.values.data(), m.bytes.data(), m.values.size() * sizeof(float));
  }
  auto it = w.pending.find(m.request_id);
  if (it == w.pending.end()) return;
  const Worker::Pending p = it->second;
  w.pending.erase(it);
  if (w.current[p.part] != m.request_id) return;  // superseded by a re-send
  if (m.type == Msg::kError) {
    violation(fmt::format("worker {}: {} of part {} (round {}) refused: {}", w.rank,
                          p.type == Msg::kInit ? "init" : "push", parts_[p.part].name, p.seq,
                          m.text));
    job_failed_ = true;
    return;
  }
  w.current.erase(p.part);
  if (p.type == Msg::kRejoin) {
    uint64_t applied = 0, accepted = 0;
    if (Status st = ps::decode_rejoin(m.bytes, &applied, &accepted); !st) {
      violation(fmt::format("worker {}: bad rejoin answer: {}", w.rank, st.message()));
      job_failed_ = true;
      return;
    }
    w.applied[p.part] = applied;
    if (!w.current.empty()) return;
    // Resume after the rounds every part completed (restart_round()).
    uint64_t round = UINT64_MAX;
    for (const auto& [part, a] : w.applied)
      round = std::min(round, a);
    w.round = static_cast<int>(round);
    w.position = round * parts_.size();
    w.pass_due = s_.sync;
    if (w.round >= s_.rounds) return after_round(w);  // its predecessor had finished
    return start_round(w);
  }
  if (p.type == Msg::kInit) {
    if (--inits_left_ == 0) all_inited();
    return;
  }
  if (p.type == Msg::kPull) {
    std::vector<float> want = initial_[p.part];
    const float total = 0.5f * static_cast<float>(s_.rounds * s_.workers * (s_.workers + 1) / 2);
    for (float& x : want)
      x += total;
    if (m.values != want)
      violation(fmt::format("dist_async: part {} holds {} after every push; exactly {} expected",
                            parts_[p.part].name, fmt::join(m.values, ","), fmt::join(want, ",")));
    if (w.current.empty()) w.finished = true;
    return;
  }
  if (s_.sync) w.got[p.part] = m.values;
  if (!w.current.empty()) return;  // the round's other parts
  check_round(w);
  after_round(w);
}

void World::check_round(Worker& w) {
  if (!s_.sync) return;
  for (size_t p = 0; p < parts_.size(); ++p)
    if (w.got[static_cast<int>(p)] != expected_[static_cast<size_t>(w.round)][p])
      violation(fmt::format("worker {} round {} part {}: pulled {}, expected {}", w.rank, w.round,
                            parts_[p].name, fmt::join(w.got[static_cast<int>(p)], ","),
                            fmt::join(expected_[static_cast<size_t>(w.round)][p], ",")));
}

void World::final_pulls() {
  // dist_async: every push acknowledged; worker 0 pulls every part.
  Worker& w = workers_[0];
  w.finished = false;
  pulled_final_ = true;
  for (int p = 0; p < static_cast<int>(parts_.size()); ++p)
    send_request(w, p, Msg::kPull, 0);
}

void World::on_placement(Worker& w, const Placement& p) {
  if (p.epoch <= w.view.epoch) return;
  const Placement old = w.view;
  w.view = p;
  for (int s = 0; s < s_.servers; ++s)
    if (p.dead[s] && !old.dead[s]) close_for_placement(worker_node(w.rank), s);
  // Re-send what was pending on a server that is no longer its part's primary.
  std::vector<Worker::Pending> again;
  for (auto it = w.pending.begin(); it != w.pending.end();) {
    if (w.current[it->second.part] == it->first &&
        primary(w, it->second.part) != it->second.server) {
      again.push_back(it->second);
      it = w.pending.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& r : again)
    send_request(w, r.part, r.type, r.seq);
}

void World::all_inited() {
  inited_ = true;
  // The barrier after init: every worker starts its rounds.
  for (Worker& w : workers_)
    at(now_ + 100, [this, &w] { start_round(w); });
}

Outcome World::run() {
  for (const Fault& f : s_.faults)
    at(f.at_us, [this, f] { inject(f); });
  // Worker 0 initialises every part.
  inits_left_ = static_cast<int>(parts_.size());
  at(0, [this] {
    for (int p = 0; p < static_cast<int>(parts_.size()); ++p)
      send_request(workers_[0], p, Msg::kInit, 0);
  });
  auto done = [&] {
    return std::all_of(workers_.begin(), workers_.end(),
                       [](const Worker& w) { return w.finished; }) &&
           (s_.sync || pulled_final_);
  };
  while (!events_.empty() && !job_failed_ && !done()) {
    Event e = events_.top();
    events_.pop();
    now_ = e.t;
    if (now_ > kDeadlineUs) break;
    e.fn();
  }
  out_.end_us = now_;
  out_.finished = done();
  if (!out_.finished && !job_failed_) {
    std::string who;
    for (const Worker& w : workers_)
      if (!w.finished)
        who += fmt::format(" worker {} (round {}, {} requests pending)", w.rank, w.round,
                           w.pending.size());
    violation(fmt::format("hang: {} at {} us with nothing left to happen:{}",
                          events_.empty() ? "every event ran" : "past the job's deadline", now_,
                          who));
  }
  return out_;
}

// ---- servers ---------------------------------------------------------------

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

}  // namespace

Outcome run(const Scenario& s) {
  World w(s);
  return w.run();
}

}  // namespace pushpull::sim
