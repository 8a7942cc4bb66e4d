// SPDX-License-Identifier: Apache-2.0
// Private to the simulation's source files (ps_world.h): the messages, the
// server and worker models and the World that runs them. ps_world.cpp: the
// scenarios, the network, the scheduler and the faults; ps_world_workers.cpp:
// the worker stores' model and the scheduler's barriers; ps_world_servers.cpp:
// the servers (real ServerStores) and their replication and rejoin model.
// Thread safety: none (one thread).
#pragma once

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
#include "sim/ps_world.h"

namespace pushpull::sim::detail {

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

inline Payload floats(const std::vector<float>& v) {
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

}  // namespace pushpull::sim::detail
