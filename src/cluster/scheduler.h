// SPDX-License-Identifier: Apache-2.0
// Scheduler: the rendezvous and control node of a job (ps-lite's scheduler).
//
// Servers and workers register with it; once num_servers + num_workers nodes
// have registered it assigns ranks (servers 0..S-1, workers 0..N-1) and sends
// every node the full address book. Ranks: when every node of a role asked
// for a rank (ClusterOptions::preferred_rank, e.g. from the launcher) and
// those ranks are exactly 0..count-1, they are used; otherwise that role's
// nodes are ranked by their advertised (host, port), so ranks are
// deterministic for a given set of addresses.
//
// It runs the barriers (per group), exchanges heartbeats with every node and
// detects failures: a node whose connection closes before it left, or that is
// silent for ClusterOptions::heartbeat_timeout, is declared dead; every other
// node is told (kPeerDead) and the job fails. A registration that does not
// complete within startup_timeout fails the job too. When every node has left
// (Node::shutdown) it tells them to close and run() returns OK.
//
// Process exits (process_exited, from the launcher that started the nodes):
// a node that exits with a nonzero code or is killed by a signal fails the
// job at once, naming it, unless it had already left in order. A worker that
// exits 0 without ever registering (a program that never opened a store) is
// recorded: once every worker has exited 0 (left in order, or never
// registered) the registered servers are told to stop and run() returns OK;
// while another worker is registered, or still has not registered 2 s later,
// such an exit fails the job naming that worker (the others would wait for it
// forever).
//
// Parameter-server fail-over: with ps_replicas(...) > 0 (PUSHPULL_PS_REPLICAS),
// a server that dies after registration completed (connection closed,
// silent, its process ended) does not fail the job while every key range
// still has a live server in its replica chain: the scheduler marks it dead,
// closes its connection, increments the placement epoch and broadcasts
// kPlacement to every other node. When a range has no live server left the
// job fails as before, naming the servers of that range.
//
// Worker restart (allow_worker_restarts(true): pushpull launch --max-restarts
// in a parameter-server job; docs/ps.md "Worker restart"): a worker that dies
// after registration completed (connection closed, silent, its process ended)
// is marked away instead of failing the job: nobody is told (the servers keep
// its dist_sync round open, its peers wait), its connection is closed. A node
// registering as a worker with that preferred rank (the launcher's
// replacement, authenticated like every node) takes the rank back: it gets
// the current placement, then the address book with its incarnation (how
// many times that rank was lost). A worker away longer than startup_timeout,
// or whose process the launcher does not restart (process_exited), fails the
// job naming it. Barriers count every worker, away ones too: a replacement
// arrives at the one its predecessor missed, or moves past it with its first
// push (cluster/barrier_book.h).
//
// Root cause: the job's status is the first failure recorded; later failures
// (nodes exiting because of it) are consequences and only logged.
//
// Use: construct, bind() (port 0 picks a free one, reported back), then
// run() on some thread; it blocks until the job ends and returns OK or the
// reason it failed (PeerFailure naming the node, Timeout). stop() from any
// thread ends run() early (returns an error "stopped"). The launcher embeds
// this object; `pushpull scheduler` wraps it.
//
// Threading: message handling runs on the transport's I/O thread; run()'s
// thread does the timers. All public methods are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "base/clock.h"
#include "cluster/barrier_book.h"
#include "cluster/protocol.h"
#include "pushpull/options.h"
#include "transport/liveness.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::cluster {

class Scheduler {
 public:
  // `clock` drives the heartbeat and registration timers (tests pass a
  // ManualClock); it must outlive the scheduler.
  explicit Scheduler(Options options, const ClockSource& clock = steady_clock_source());
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Listens on options.net.port if set, else ClusterOptions::root_port (0:
  // any), on `host` ("": the wildcard address of root_uri's family). Returns
  // the port.
  int bind(const std::string& host = "");
  int port() const;
  // Blocks until every node left (OK) or the job failed (its reason).
  Status run();
  void stop();

  // A node's process ended (the launcher calls this when its child exits):
  // `exit_code` when it exited, `signal` > 0 when a signal killed it. `rank`
  // is the rank the launcher gave it (PUSHPULL_RANK). Thread-safe; no-op
  // once the job ended.
  void process_exited(Role role, int rank, int exit_code, int signal);
  // How many nodes have registered so far (tests, progress reports).
  int registered() const;
  // Whether server `rank` (launcher rank) was failed over: its end does not
  // end the job (the launcher keeps the others running).
  bool failed_over(Role role, int rank) const;
  // The current placement epoch (0 until a fail-over).
  uint64_t placement_epoch() const;
  // OK while the job runs or after it ended well; the first failure as soon
  // as it is recorded.
  Status failure() const;

  // Worker restart (see above). Call before run().
  void allow_worker_restarts(bool on);
  // The launcher restarts the process of worker `rank` (same rank): its loss
  // is no failure; the replacement has startup_timeout to register.
  void process_restarting(Role role, int rank, int exit_code, int signal);
  // How many times worker `rank` was lost (its replacements' incarnations
  // count up from 1). The launcher kills a still-running process of a lost
  // worker (e.g. a stopped one) before restarting it.
  int worker_losses(int rank) const;
  // Server rejoin (same switch): how many times server `rank` was failed
  // over. A failed-over server registering again (its restart) gets the
  // placement and the book with its incarnation, fetches its ranges from the
  // live servers and reports kServerRejoined: it is then alive again, last
  // in its chains (Placement::late), a new placement epoch.
  int server_losses(int rank) const;

 private:
  struct Entry {
    NodeAddress addr;
    int32_t preferred = -1;
    bool left = false;
  };
  void on_message(transport::Message&& m);
  void on_close(transport::ConnId id, const transport::PeerInfo& peer, const Status& why);
  void assign_ranks();                                           // mu_ held
  void fail(const NodeAddress& who, const std::string& reason);  // mu_ held
  // A registered node is gone (mu_ held; its entry is still in nodes_): a
  // server fails over when it can, anything else fails the job.
  void lose(transport::ConnId id, const std::string& reason);
  void abort_job(Status why);  // mu_ held
  void broadcast(uint16_t type, const std::vector<std::byte>& payload, uint64_t key = 0,
                 uint64_t request_id = 0);  // mu_ held
  int group_size(Group g) const;
  // Checks the registration and replacement deadlines, then hands the
  // detector's due events (a silent node, the beat) on (mu_ held).
  void check_timers();
  // Workers that exited 0 without registering: stop the servers once every
  // worker has, fail the job when someone waits for them (mu_ held).
  void check_unregistered_exits();
  Entry* find_node(Role role, int rank);  // by launcher rank, then by rank; mu_ held
  int count_registered(Role role) const;  // mu_ held

  Options options_;
  std::unique_ptr<transport::MessageTransport> transport_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<transport::ConnId, Entry> nodes_;
  bool complete_ = false;  // every node registered and got its book
  bool finished_ = false;  // every node left
  Status failure_;
  // The barriers, by member (role, rank): see barrier_book.h.
  BarrierBook barriers_;
  // The expected members of a barrier group: every worker (away ones too)
  // and the live servers (mu_ held).
  std::vector<BarrierBook::Member> members(uint8_t group) const;
  void answer_barrier(uint8_t group, const std::vector<BarrierBook::Answer>& answers);  // mu_ held
  // Completes the barriers a loss, a pass or a placement let through (mu_ held).
  void settle_barriers();
  // Worker restart: the book sent at registration (a replacement gets it
  // with its own new address), the workers away (rank -> since, why) and
  // how many times each rank was lost.
  bool worker_restarts_ = false;
  AddressBook book_;
  struct Away {
    ClockSource::time_point since;
    std::string reason;
  };
  std::map<int, Away> away_;
  std::map<int, int> losses_;
  std::map<int, int> server_losses_;
  uint32_t rejoins_ = 0;  // servers' rejoins so far (Placement::late's order)
  // A worker is gone: away when restarts are allowed (true), else false.
  bool mark_away(const NodeAddress& who, const std::string& reason);  // mu_ held
  // A replacement of an away worker registers (mu_ held).
  void rejoin(transport::ConnId id, Entry e);
  const ClockSource& clock_;
  ClockSource::time_point started_;
  // The shared detector (transport/liveness.h): beats to every node, each
  // registered node's silence by connection (its verdict is unused: failure_).
  transport::Liveness live_;
  // Workers (launcher rank) that exited 0 before registering, and when the
  // first did (the 2 s grace for the others to follow).
  std::set<int> exited_unregistered_;
  const int replicas_;
  Placement placement_;
  ClockSource::time_point first_unregistered_exit_{};
};

}  // namespace pushpull::cluster
