// SPDX-License-Identifier: Apache-2.0
// Node: a server or worker of a job, as an object (no globals: a scheduler,
// servers and workers can all live as threads of one process).
//
// start() listens, registers with the scheduler, receives its rank and the
// address book, then builds the connections the engines need, all at start
// (not lazily, so a missing peer shows up at once): every worker connects to
// every server (parameter server traffic) and to every worker of lower rank
// (collectives: a full mesh among workers). Servers do not connect to each
// other. start() returns when all of them are up.
//
// Failure: the first failure of the job (a peer declared dead by the
// scheduler, a direct connection to a peer closing — blamed after a short
// grace period, min(heartbeat_timeout / 2, 2 heartbeat intervals + 0.5 s), in
// case the scheduler names another node that died first; a server that may
// fail over (replicas) or a worker that may be restarted is given the
// scheduler's verdict instead, up to heartbeat_timeout + that grace (a
// worker: startup_timeout + heartbeat_timeout), and when none came (the
// scheduler still hears it: the link between the two broke) the connection's
// end fails the job naming that link —, the scheduler closing or
// going silent for heartbeat_timeout, a job abort) is recorded as a
// PeerFailure naming the node's role, rank and host; every peer-failure
// callback runs once with it, every blocked call (start, barrier, shutdown)
// throws it, and later calls throw it too. Upper layers fail their own
// pending operations from the callback.
//
// Threading: handlers registered with set_handler() run on the transport's
// I/O thread (they must not block); failure callbacks run on the I/O thread
// or on the node's heartbeat thread. start(), barrier() and shutdown() block
// with deadlines and must not be called from those threads. Other methods
// are thread-safe. Call set_handler / on_peer_failure before start().
//
// Ownership: the Node owns its Transport and heartbeat thread; the
// destructor stops both (without the orderly leave: call shutdown()).
//
// Teardown order for upper layers (ps::Server, the collective bootstrap):
// their handlers and failure callbacks run on the Node's threads, so call
// stop_delivery() (or shutdown(), which ends with it) before destroying an
// object whose handlers the Node calls; after it returns no handler or
// callback runs any more.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "base/clock.h"
#include "cluster/barrier_book.h"
#include "cluster/protocol.h"
#include "pushpull/options.h"
#include "transport/liveness.h"
#include "transport/tcp/message_transport.h"

namespace pushpull::cluster {

class Node {
 public:
  // options.cluster.role must be kServer or kWorker.
  // `clock` drives the scheduler-silence and suspect timers (tests pass a
  // ManualClock); it must outlive the node.
  explicit Node(Options options, const ClockSource& clock = steady_clock_source());
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Throws Timeout (startup_timeout), PeerFailure, ProtocolError (refused).
  void start();

  Role role() const { return options_.cluster.role; }
  int rank() const;
  uint32_t id() const { return node_id(role(), rank()); }
  int num_servers() const { return options_.cluster.num_servers; }
  int num_workers() const { return options_.cluster.num_workers; }
  const AddressBook& address_book() const { return book_; }
  // Worker restart (docs/ps.md "Worker restart"): 0 for a node that started
  // with the job; n > 0 for the n-th replacement of a worker's rank, which
  // joined a running job (it connects only to the live servers: no worker
  // mesh). Valid after start().
  int incarnation() const { return book_.incarnation; }
  // The placement epoch this node joined the job at (0 at the job's start;
  // a restarted process: the one that failed its predecessor over or later).
  // Valid after start().
  uint64_t joined_epoch() const { return joined_epoch_; }
  const Options& options() const { return options_; }

  // Waits until every node of `group` called barrier(group) as often as this
  // one. Throws the job's failure, or Timeout after `timeout`
  // (ClusterOptions::barrier_timeout by default). Not for servers in kWorkers.
  // `tag`: a dist_sync worker's place in its program (cluster/barrier_book.h),
  // which lets a replacement worker meet the others at the right barrier.
  void barrier(Group group, std::optional<Millis> timeout = {}, BarrierTag tag = {});
  // A replacement worker's first push, at `position` (pushes issued before
  // it): it is past every barrier at that position (barrier_book.h).
  void pass_barriers(uint64_t position);

  // The connection to (role, rank); throws NotFound for pairs that are not
  // connected (server-server, self) and the failure if that peer died.
  transport::ConnId conn(Role role, int rank) const;
  // Waits up to `timeout` until the connection to (role, rank) is up (a
  // server's peers connect while it may already serve); false at the deadline
  // or when the job failed. Not from the I/O thread.
  bool wait_connected(Role role, int rank, Millis timeout);
  // Sending and posting receives to a peer (see transport::MessageTransport for the
  // contracts). When the peer is dead, `done` gets the PeerFailure.
  void send(Role role, int rank, transport::Header h, const void* data, size_t n,
            transport::SendDone done, int priority = 0);
  Status send_copy(Role role, int rank, transport::Header h, const void* data, size_t n,
                   int priority = 0);
  Status post_recv(Role role, int rank, transport::RecvMatch match, void* dst, size_t capacity,
                   transport::RecvDone done);
  // Who sent a message (from Header::sender).
  static NodeAddress sender(const transport::Header& h) { return from_node_id(h.sender); }

  // Upper layers' handlers (types 64..255).
  void set_handler(uint16_t first, uint16_t last, transport::Handler handler);
  void on_peer_failure(std::function<void(const Status&)> callback);
  // OK while the job is healthy.
  Status failure() const;

  // Parameter-server fail-over (docs/ps.md, "Fault tolerance"). With
  // ps_replicas() > 0 the servers are connected to each other too, and a
  // server's death does not fail the job by itself: the scheduler decides,
  // and either fails it (no replica left) or publishes a new placement
  // (kPlacement), which every on_placement callback receives (on the I/O
  // thread, in epoch order, after the node stopped using that server:
  // conn() to a dead server throws).
  int ps_replicas() const { return replicas_; }
  Placement placement() const;
  uint64_t placement_epoch() const;
  void on_placement(std::function<void(const Placement&)> callback);

  // Servers: blocks until every worker has left the job (the scheduler says
  // so), up to barrier_timeout; throws the job's failure. A server calls it
  // before shutdown() so it stays under the heartbeat watch while it serves.
  void wait_for_workers();

  // Orderly end: tells the scheduler this node is done and waits (up to
  // barrier_timeout) until every node is, then closes. Throws the failure.
  void shutdown();

  // An engine on this node found the job failed by itself (`why` names the
  // node that failed, e.g. the collectives' detector): tells the scheduler,
  // which ends the job with that reason for every node, and waits up to 2 s
  // for its word (the node's failure() is then set). No-op once failed.
  void report_failure(const Status& why);
  // A restarted server caught up (ps::Server::rejoin): tells the scheduler.
  void report_rejoined();

  // Stops the heartbeat thread and the transport (its I/O thread joined):
  // no handler or failure callback runs after this returns. Idempotent;
  // thread-safe; not from a handler. Does not leave the job (the scheduler
  // sees the connection close).
  void stop_delivery();

  transport::MessageTransport& transport() { return *transport_; }

  // Mixed placement (docs/ps.md): scales the automatic socket buffers of the
  // connections between workers and servers by server: `scale[s]` for the
  // links of server s (on a worker: its connection to s; on server s: its
  // connections to every worker), now and for connections made later. Why:
  // those flows are window-limited, and equal windows give a spare host's
  // flows the rate of a worker host's server's, though the split gives the
  // spare hosts 2-4x the bytes; their links then sit partly idle (docs/
  // scaling.md, "Mixed placement"). Empty or all 1: nothing changes. No-op
  // when NetOptions::socket_buffer_bytes was set explicitly. Thread-safe.
  void set_server_link_scale(std::vector<double> scale);

 private:
  // The socket buffer of the link to (role, rank) under link_scale_, or 0 to
  // leave it. Called with mu_ held.
  int scaled_buffer(Role role, int rank) const;
  void on_control(transport::Message&& m);
  void on_connect(transport::ConnId id, const transport::PeerInfo& p);
  void on_close(transport::ConnId id, const transport::PeerInfo& p, const Status& why);
  void fail(Status why);
  void apply_placement(Placement p);
  // Start-up: dials `t` unless it has dialed this node (Node::start).
  void dial_if_absent(const NodeAddress& t);
  // Joining a running job: dials `t` in short attempts until connected
  // (true), or until the placement says it was failed over (false); throws
  // after connect_timeout.
  bool dial_until_failed_over(const NodeAddress& t);
  void heartbeat_loop();
  Millis suspect_grace() const;
  // Waits on cv_ until pred() or failure or deadline; throws failure/Timeout.
  template <typename Pred>
  void wait_for(std::unique_lock<std::mutex>& lock, Millis timeout, const std::string& what,
                Pred pred);

  Options options_;
  const ClockSource& clock_;
  std::unique_ptr<transport::MessageTransport> transport_;
  std::mutex stop_mu_;  // serializes joining heartbeat_
  std::thread heartbeat_;
  AddressBook book_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int rank_ = -1;
  bool have_book_ = false;
  transport::ConnId scheduler_ = 0;
  std::map<std::pair<Role, int>, transport::ConnId> peers_;
  int auto_buffer_bytes_ = 0;       // the automatic socket buffer; 0: set explicitly
  std::vector<double> link_scale_;  // set_server_link_scale
  std::map<uint8_t, uint64_t> barrier_sent_, barrier_done_;
  // The shared detector (transport/liveness.h): the beats to the scheduler,
  // its silence (member 0), and the job's failure with its suspect: a peer
  // whose connection closed, blamed after suspect_grace() unless the
  // scheduler names another culprit first.
  transport::Liveness live_;
  Status failure_locked() const;  // mu_ held; OK while healthy
  // One event of the detector (the heartbeat thread; mu_ held on entry and
  // exit, released while sending or failing).
  void on_liveness(transport::Liveness::Event&& e, std::unique_lock<std::mutex>& lock);
  // Peers whose connection closed while the scheduler may still fail them
  // over or replace them: the verdict is due by the deadline (see above).
  struct VerdictDue {
    ClockSource::time_point deadline;
    std::string why;
  };
  std::map<std::pair<Role, int>, VerdictDue> verdict_due_;
  // Peers whose connection on record replaced an earlier one (a restarted
  // process connected): a late placement failing the old one over keeps it.
  std::set<std::pair<Role, int>> replaced_;
  uint64_t joined_epoch_ = 0;
  std::vector<std::function<void(const Status&)>> failure_callbacks_;
  const int replicas_;
  Placement placement_;
  std::vector<std::function<void(const Placement&)>> placement_callbacks_;
  bool leaving_ = false;
  bool shutdown_ = false;
  bool workers_done_ = false;
  bool stop_heartbeat_ = false;
};

}  // namespace pushpull::cluster
