// SPDX-License-Identifier: Apache-2.0
// Server: one parameter server of a job, on the network.
//
// It installs the PS message handlers on a cluster Node (a server node), feeds
// every request to its ServerStore and sends the store's answers back to the
// worker that asked. `pushpull server` and MXNet-style programs (role server
// calling create_kvstore("dist_...")) both run one with run_server().
//
// Threading: request decoding runs on the node's I/O thread and only queues
// work on the store's threads (KVStoreOptions::server_threads, default
// min(cores, 4)); answers are sent from those threads.
// A malformed or impossible request (bad dtype, sizes that overflow, ranges
// outside the value, an exception from the store) is answered with an error
// to that worker and logged; the server keeps serving.
//
// Replication (docs/ps.md, "Fault tolerance"): with node.ps_replicas() > 0
// the store replicates every init and round; replicate() sends the part's
// state to the live backups of its chain (kReplicaMeta + kReplicaValue, the
// value zero-copy) and calls back when each has acknowledged it or was
// declared dead (a new placement). As a backup, the server installs what a
// primary sends and acknowledges it. Worker requests stamped with a newer
// placement epoch than this server knows are held until the scheduler's
// kPlacement arrives (then replayed in order).
//
// Checkpoints (docs/ps.md "Checkpoints"): PUSHPULL_CHECKPOINT_DIR and
// PUSHPULL_CHECKPOINT_EVERY make the store write checkpoints;
// PUSHPULL_RESUME_DIR and PUSHPULL_RESUME_ROUND (set by `pushpull launch
// --resume`) make the server load its file when worker 0's kSetMode (the
// first request of every job) arrives, before answering it.
//
// Ownership: the Server borrows the Node, which must outlive it. The node's
// I/O thread may still deliver requests while the Server is destroyed (a job
// failing): the destructor first closes a gate that every delivery passes,
// waits for the one in progress, and only then destroys the store, so no
// delivery ever touches a destroyed store or Server.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "cluster/node.h"
#include "ps/protocol.h"
#include "ps/server_store.h"
#include "transport/shm/lend.h"

namespace pushpull::ps {

class Server : public ServerResponder {
 public:
  // Installs the handlers: call before node.start(). The mode (sync or async)
  // comes from worker 0's kSetMode command; until then the store is sync.
  explicit Server(cluster::Node& node);
  ~Server() override;

  void reply(const RequestMeta& to, const Status& status, DType dtype,
             std::span<const std::byte> data, std::shared_ptr<void> owner = nullptr) override;
  bool replicate(const PartId& part, std::shared_ptr<const ReplicaState> state,
                 std::function<void()> done) override;
  // A restarted server (Node::incarnation() > 0) asks every live server for
  // the ranges it backs up; once all of them sent theirs it tells the
  // scheduler, which makes it a (late) backup again. Call after node.start().
  void rejoin();
  // How many values same-host backups hold in place of this server's (kept
  // until released). Thread-safe; for tests.
  size_t held_by_backups() {
    std::lock_guard lock(repl_mu_);
    return pinned_.size();
  }

 private:
  // The job writes checkpoints or resumes from one (KVStoreOptions::
  // checkpoint_dir / resume_dir: PUSHPULL_CHECKPOINT_DIR / PUSHPULL_RESUME_DIR).
  bool checkpointing() const {
    const KVStoreOptions& kv = node_.options().kvstore;
    return !kv.checkpoint_dir.empty() || !kv.resume_dir.empty();
  }
  // A replication in flight: the backups that have not acknowledged it.
  // Lent to a backup (same host, transport/shm/lend.h), the state stays here until
  // every backup answered, so the value is not changed under its reader
  // and can still be sent by value to a backup that cannot read it.
  struct Outgoing {
    std::vector<int> waiting;
    std::function<void()> done;
    PartId part;
    std::shared_ptr<const ReplicaState> lent;
    transport::LendRef ref;  // where `lent`'s value is, when lent
  };
  // A value a backup holds in place (pinned, kFlagPinned): kept here,
  // unchanged and out of the buffer pool, until the backup releases it
  // (kReplicaRelease) or dies.
  struct Pinned {
    transport::LendRef ref;
    std::shared_ptr<const ReplicaState> state;
  };
  void on_server_message(const cluster::NodeAddress& from, transport::Message&& m);
  void on_placement(const cluster::Placement& p);
  // Acknowledgement (or death) of `backup` for replication `id`; `pinned`:
  // the backup holds the lent value in place.
  void replica_acked(uint64_t id, int backup, bool pinned = false);
  // A backup let go of a pinned value.
  void on_replica_release(int backup, const transport::Message& m);
  // Sends `state` to `backups`; `done` once each acknowledged (or died).
  void send_replica(const PartId& part, std::shared_ptr<const ReplicaState> state,
                    std::vector<int> backups, std::function<void()> done);
  // Sends replication `id` of `part` to backup `b`: lent as `*lend` when
  // given, else by value.
  void send_replica_to(uint64_t id, const PartId& part,
                       const std::shared_ptr<const ReplicaState>& state, int b,
                       const transport::LendRef* lend);
  // Backup side of kReplicaValue (server_replica_install.cpp): installs the
  // value (bytes or lent) and answers.
  void on_replica_value(const cluster::NodeAddress& from, transport::Message&& m);
  // Server rejoin: a live server sends `to` its ranges; the rejoined side.
  // `generation`: which catch-up of the rejoining server (it starts over
  // when a server it was catching up from dies), echoed in kRejoinDone.
  void on_rejoin_request(int to, uint64_t generation);
  void on_rejoin_setup(const std::string& text);
  void on_rejoin_done(int from, uint64_t generation);
  // Deliveries from the I/O thread enter the gate; close() refuses new ones
  // and waits until those inside have left.
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    int active = 0;
    bool closed = false;
    bool enter();
    void leave();
    void close();
  };

  // Whether this server lends replicas to, and reads them from, same-host peers.
  bool lending() const {
    return node_.options().net.ps_shared_memory && node_.options().net.ps_lend;
  }
  void on_message_guarded(transport::Message&& m);
  void on_message(transport::Message&& m);
  void on_command(const RequestMeta& meta, transport::Message&& m);
  // A fresh store in this mode (worker 0's kSetMode, a rejoin's setup).
  void set_mode(const Mode& mode);
  Mode mode() {
    std::lock_guard lock(mu_);
    return mode_;
  }
  // With PUSHPULL_RESUME_DIR: loads this server's file of checkpoint round
  // PUSHPULL_RESUME_ROUND (once) into the current store (once per store).
  // Throws IoError naming the file when it is missing, torn or foreign.
  void restore_checkpoint();

  cluster::Node& node_;
  int threads_;
  std::mutex mu_;  // guards store_ replacement (set_mode before any key exists)
  std::shared_ptr<ServerStore> store_;
  Mode mode_;  // store_'s (guarded by mu_)
  // Loaded by restore_checkpoint: its own file and those of the homes it
  // backs up (path, contents).
  std::vector<std::pair<std::string, std::shared_ptr<const Checkpoint>>> resume_;
  std::weak_ptr<ServerStore> restored_store_;  // the store resume_ went into
  // Authenticates the checkpoints written and read (base/file_auth.h); set
  // at construction when checkpointing().
  base::FileKey checkpoint_key_;
  std::shared_ptr<Gate> gate_;
  std::mutex repl_mu_;  // guards the members below
  uint64_t next_replication_ = 1;
  std::map<uint64_t, Outgoing> outgoing_;
  std::vector<bool> dead_;          // the placement's dead servers, as on_placement saw it
  std::vector<uint32_t> late_;      // and its rejoined ones, in rejoin order
  std::set<int> catching_up_;       // rejoined servers we send our rounds to already
  uint64_t rejoin_generation_ = 0;  // this server's catch-ups (Server::rejoin), under repl_mu_
  std::set<int> rejoin_waiting_;    // (rejoined side) live servers still sending
  bool rejoin_setup_done_ = false;  // (rejoined side) mode and optimizer installed
  std::string optimizer_spec_;      // the last kSetOptimizer's text (for rejoined servers)
  std::set<int> no_lending_;        // backups that could not read lent memory
  // Backup side: metadata waiting for its value, by (primary, request id).
  std::map<std::pair<int, uint64_t>, ReplicaState> incoming_meta_;
  transport::LendReader lend_reader_;  // backup side: lent values of same-host primaries
  std::map<int, uint32_t> lent_by_;    // backup side: the process of each server that lent to us
  // Primary side: values pinned by backups, by (backup, replication id).
  std::map<std::pair<int, uint64_t>, Pinned> pinned_;
  // Worker requests from a newer placement epoch than ours, in arrival order.
  std::deque<transport::Message> future_;
  std::shared_ptr<ServerStore> store() {
    std::lock_guard lock(mu_);
    return store_;
  }
};

// Runs a server node for the whole job: registers with the scheduler, serves
// until every node has left (or the job failed: throws its PeerFailure).
// `options.cluster.role` must be kServer.
void run_server(Options options);

}  // namespace pushpull::ps
