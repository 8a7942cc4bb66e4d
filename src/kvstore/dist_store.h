// SPDX-License-Identifier: Apache-2.0
// The parameter-server worker: KVStore types dist_sync, dist_device_sync
// (aliases dist_sync_device) and dist_async (alias dist_async_device).
//
// Construction makes this process a worker node of the job described by the
// options (scheduler address, numbers of servers and workers): it registers,
// gets its rank, connects to every server, and worker 0 tells the servers the
// mode (sync or async); all workers then meet at a barrier. The destructor
// waits for operations in flight and leaves the job in order (the servers
// serve until every worker has left).
//
// How operations travel (MXNet semantics, see kvstore.h and docs/ps.md):
// - init: every worker records the keys' shapes; worker 0 sends the values;
//   then a barrier, so a pull anywhere afterwards sees them.
// - push: the worker sums its devices' arrays (float32 for 16-bit types),
//   optionally compresses it (2bit, 1bit, fp16; compress/compressor.h, with
//   a residual per key and device), and sends each slice
//   to its server (small values: one server by key hash; big values: split
//   over all servers, sent in parallel). A push completes when the server
//   applied its round.
// - pull: each slice's reply is received straight into the first output
//   array (no staging copy) and copied to the others; a compressed reply
//   (a float32 key pushed compressed to servers without an optimizer,
//   docs/kvstore.md "Compressed pulls") is decoded in place there.
// - Ordering: one connection per server keeps each key's operations in call
//   order for equal priorities; a higher priority goes first among requests
//   waiting to be sent.
//
// Failure: when a server, worker or the scheduler dies, every pending and
// later operation fails with the cluster's PeerFailure naming it — except a
// server that was failed over (replication, docs/ps.md "Fault tolerance"):
// then every request pending on it is re-sent, in order, to the new primary
// of its key range, and later requests go there. Requests carry the
// placement epoch; pushes carry a per-part sequence number, so the new
// primary drops a push it already applied.
//
// Worker restart (pushpull launch --max-restarts, docs/ps.md "Worker
// restart"): a store made by a restarted worker (Node::incarnation() > 0)
// rejoins the running job. Until its first push or pull it neither sends nor
// meets at barriers (the others passed them long ago): init asks every part's
// server for the rank's applied push count and the current value, writes
// the values into the arrays given (the servers' values are adopted, not
// overwritten), and continues each part's push numbering from the smallest
// count, restart_round(); set_optimizer only validates; barrier() returns.
// Its pushes of rounds the old process already pushed are dropped (applied)
// or adopted (pending) by the servers, so each round counts once.
// Thread safety: as KVStore. Ownership: owns its Node (threads, sockets).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "cluster/node.h"
#include "compress/compressor.h"
#include "ps/placement.h"
#include "ps/server_shares.h"
#include "pushpull/kvstore.h"

namespace pushpull {

class DistStore final : public KVStore {
 public:
  // `type`: dist_sync, dist_device_sync, dist_sync_device, dist_async,
  // dist_async_device. options.cluster.role must be kWorker.
  DistStore(std::string type, const Options& options);
  ~DistStore() override;

  using KVStore::init;
  using KVStore::pull;
  using KVStore::push;
  using KVStore::pushpull;
  using KVStore::row_sparse_pull;

  void init(const std::vector<Key>& keys, const std::vector<ArrayView>& values) override;
  KVHandle push_async(const std::vector<Key>& keys, const std::vector<ArrayList>& values,
                      int priority) override;
  KVHandle pull_async(const std::vector<Key>& keys, const std::vector<ArrayList>& outs,
                      int priority) override;
  KVHandle pushpull_async(const std::vector<Key>& keys, const std::vector<ArrayList>& values,
                          const std::vector<ArrayList>& outs, int priority) override;
  KVHandle row_sparse_pull_async(const Key& key, const ArrayList& outs, const ArrayView& row_ids,
                                 int priority) override;
  void wait_all() override;

  void set_updater(Updater updater) override;
  void set_optimizer(const OptimizerSpec& spec) override;
  void save_optimizer_states(const std::string& path) override;
  void load_optimizer_states(const std::string& path) override;
  void set_gradient_compression(const std::map<std::string, std::string>& params) override;

  int rank() const override { return node_->rank(); }
  int num_workers() const override { return node_->num_workers(); }
  void barrier() override;
  const std::string& type() const override { return type_; }
  int64_t restart_round() const override;
  // How `key` travels: its server slices cut into chunks, one message each
  // (diagnostics and tests); throws as pull() does for a key not initialised.
  std::vector<ps::Slice> chunks_of(const Key& key) const;
  // Requests this worker sent to the servers so far (re-sent ones included;
  // diagnostics and tests): a push or a pull is one per chunk, and so is a
  // pushpull (each push asks for the chunk's value back).
  uint64_t requests_sent() const { return requests_sent_.load(std::memory_order_relaxed); }
  // Pull replies that came compressed and were decoded (tests).
  uint64_t pulls_compressed() const { return pulled_compressed_.load(std::memory_order_relaxed); }

 private:
  struct KeyInfo {
    Key key;
    uint64_t id = 0;
    Shape shape;
    DType dtype = DType::kFloat32;
    std::vector<ps::Slice> slices;   // server slices cut into chunks
    std::mutex seq_mu;               // guards push_seq
    std::vector<uint64_t> push_seq;  // per slice: pushes sent (the next one's number - 1)
  };
  using OnData = std::function<void(const std::byte* data, size_t n)>;
  // A request sent and not answered yet (pending_).
  struct Pending {
    std::shared_ptr<Completion> done;
    int server = 0;
    std::optional<transport::RecvMatch> posted;
    OnData on_data;
    bool command = false;
    // Sends this request again (a new request id) to the current primary.
    std::function<void()> resend;
    uint64_t flight = 0;  // its flight recorder entry (base/flight_recorder.h)
  };
  // A flight recorder entry for request `kind` of key `key` (started now).
  static uint64_t flight_record(std::string_view kind, uint64_t key, size_t bytes);

  KeyInfo& info(const char* op, const Key& key) const;
  std::vector<KeyInfo*> infos(const char* op, const std::vector<Key>& keys, size_t lists) const;
  // Sends one request to the current primary of the key range whose home is
  // `home` (a command: to server `home` itself, answered OK at once when it
  // was failed over); `done` gets one finish() when answered.
  void request(int home, transport::Header h, const void* data, size_t n,
               std::shared_ptr<void> keep_alive, const std::shared_ptr<Completion>& done,
               int priority, OnData on_data = {}, bool command = false);
  // The server that serves key ranges placed on `home` now (mu_ held).
  int primary_of(int home) const;
  // A new placement: re-sends what was pending on the dead servers.
  void on_placement(const cluster::Placement& p);
  // Posts the reply's destination, then sends the pull.
  void pull_slice(KeyInfo& k, const ps::Slice& s, const ArrayList& outs,
                  const std::shared_ptr<Completion>& done, int priority);
  // A request answered with slice `s`'s value, written into `outs`: a pull
  // (h.type kPull, no payload) or a push with kFlagPullBack (the push's
  // bytes, kept alive by `keep_alive` until sent). Posts the reply's
  // destination, then sends; re-sent whole on a fail-over.
  void value_request(KeyInfo& k, const ps::Slice& s, transport::Header h, const void* data,
                     size_t n, std::shared_ptr<void> keep_alive, const ArrayList& outs,
                     const std::shared_ptr<Completion>& done, int priority);
  // With `pull_into` (pushpull) each slice's push asks for the slice's value
  // back (kFlagPullBack): one request and one reply per slice, and the
  // server answers slice j while slice j+1 still arrives.
  void push_key(KeyInfo& k, const ArrayList& values, const std::shared_ptr<Completion>& done,
                int priority, const ArrayList* pull_into = nullptr);
  // Sends a command to every server and waits for all answers.
  // `payloads`: one for all servers, or one per server.
  void command_all(uint64_t command, const std::vector<std::string>& payloads,
                   std::vector<std::string>* answers = nullptr);
  void finish(uint64_t request_id, const Status& s);
  // Drops a posted receive for `server`'s reply (its request failed).
  void cancel_posted(int server, const transport::RecvMatch& match);
  void on_message(transport::Message&& m);
  void on_failure(const Status& s);
  // Throws the job's failure, if any.
  void check_failure() const;
  // A restarted worker's init: adopts the servers' values and push counts.
  void rejoin_keys(const std::vector<KeyInfo*>& made, const std::vector<ArrayView>& values);

  const std::string type_;
  const bool sync_;
  const int64_t bigarray_bound_;
  const int64_t chunk_bytes_;
  std::unique_ptr<cluster::Node> node_;

  mutable std::mutex mu_;  // guards the members below
  std::condition_variable idle_cv_;
  std::map<Key, std::unique_ptr<KeyInfo>> keys_;
  std::optional<bool> int_keys_;
  std::unordered_map<uint64_t, std::unique_ptr<Pending>> pending_;
  Status failure_;
  // Null without compression; pushes capture the current one (residuals inside).
  std::shared_ptr<compress::Compressor> compressor_;
  int replicas_ = 0;
  bool one_host_ = false;  // every node on one host (AddressBook::one_host): bigger chunks
  std::vector<double> server_weights_;  // big values' shares per server; empty: equal
  cluster::Placement placement_;

  std::atomic<uint64_t> next_request_{1};
  std::atomic<uint64_t> requests_sent_{0};
  std::atomic<uint64_t> pulled_compressed_{0};
  // A restarted worker before its first push or pull (see above).
  std::atomic<bool> rejoining_{false};
  int64_t restart_round_ = -1;  // guarded by mu_; -1 until a rejoining init
  // dist_sync barriers are tagged with the worker's place in its program
  // (cluster/barrier_book.h): pushes issued so far (a replacement starts at
  // the ones it adopted) and the user barriers called at that position.
  // Guarded by mu_.
  uint64_t pushes_issued_ = 0;
  uint64_t tag_position_ = 0, tag_seq_ = 0;
  // A replacement in dist_sync tells the scheduler its position at its first
  // push (Node::pass_barriers); guarded by mu_.
  bool pass_due_ = false;
  cluster::BarrierTag next_barrier_tag();
  // Every barrier of the workers (the user's and init's, set_optimizer's):
  // tagged in dist_sync.
  void workers_barrier();
};

}  // namespace pushpull
