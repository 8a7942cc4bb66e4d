// SPDX-License-Identifier: Apache-2.0
// The serverless KVStore: type dist_sync_allreduce (alias allreduce). Every
// worker keeps a full copy of every value; the workers sum their gradients
// with collective allreduces (include/pushpull/collective.h) instead of
// sending them to servers (MXNet's dist_sync_mpi proposal, Horovod).
//
// Semantics (as KVStore, with these specifics):
// - init broadcasts worker 0's values: afterwards every worker holds them
//   (the values the other workers passed are ignored). Blocking, collective.
// - push: each worker sums its devices' arrays (16-bit types in float32), the
//   workers allreduce-sum that (float32 on the wire for 16-bit types, rounded
//   once), and each worker applies the result to its copy: it replaces the
//   value, or goes through the updater / optimizer, which therefore run on
//   every worker over the same reduced gradient (identical results
//   everywhere). Every worker must push each key equally often (dist_sync).
// - pull / row_sparse_pull read the local copy (no traffic) after the
//   worker's earlier pushes of the key are applied. row_sparse_pull's outputs
//   have the value's shape: the listed rows are copied, the others zeroed (as
//   dist_sync).
// - set_updater / set_optimizer are local: call them on every worker alike.
//   save/load_optimizer_states use the local optimizer (identical on every
//   worker), in the local store's file format.
// - Gradient compression: "fp16" sends float16 on the ring (the engine sums
//   in float32 at each step and rounds back), with a float32 residual per key
//   and device carrying each worker's rounding error to its next push.
//   "1bit"/"2bit" codes cannot be summed on the way, so each worker encodes
//   its gradient (with its residual), the codes (with their 8-byte wire
//   header) are allgathered under the push's name, and every worker decodes
//   and adds them in rank order (compress/gathered.h): the same bits on every
//   worker. Every worker must set the same compression: a mismatch fails the
//   push on every worker (the engine's signature check, or the headers').
// - barrier waits for this worker's operations, then for every worker.
//
// How: a push submits its allreduce from the calling thread at once, named
// "kv.<key>#<slot>" (4 slots per key, so names repeat and the engine's
// response cache serves steady-state training; a fifth push of a key in
// flight waits for the first), and queues the apply on the key's executor
// shard, which waits for the allreduce. Submitting from the caller keeps
// workers that push keys in different orders from deadlocking.
//
// Failure: a dead worker fails every pending and later operation with
// PeerFailure (from the communicator).
//
// Elastic jobs (include/pushpull/elastic.h, docs/elastic.md): a store built
// over a CommunicatorFn follows whatever communicator it returns, and is an
// elastic::Participant: joined to the elastic State (State::add_participant,
// or pushpull::elastic_track_store), commit() saves a copy of every value; a
// re-formation shuts the old communicator (abandoning pending operations with
// PeerFailure), puts the saved copy back after a member's failure, re-binds to
// the new communicator (new size and ranks) and re-syncs every value from the
// new rank 0. Every member must hold the same keys (init before run()).
//
// Ownership: owns its communicator (and the Session that bootstrapped it),
// values, optimizer and threads; over a CommunicatorFn the communicators are
// borrowed (never shut down by the destructor).
// Thread safety: as KVStore; the elastic_* calls come from the training
// thread, with no operation of this store in flight from other threads.
#pragma once

#include "kvstore/update_rule.h"

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>

#include "base/executor.h"
#include "compress/compressor.h"
#include "pushpull/collective.h"
#include "pushpull/elastic.h"
#include "pushpull/kvstore.h"

namespace pushpull {

class AllreduceStore final : public KVStore, public collective::elastic::Participant {
 public:
  // Bootstraps a collective::Session from `options` (a job with a scheduler,
  // or the MASTER_ADDR rendezvous; see collective.h).
  AllreduceStore(std::string type, const Options& options);
  // Over a given communicator (tests: ranks as threads).
  AllreduceStore(std::string type, const Options& options,
                 std::unique_ptr<collective::Communicator> comm);
  // Over the communicator `follow` returns, asked again at every
  // re-formation (elastic jobs: the default session's, or a test's group).
  AllreduceStore(std::string type, const Options& options,
                 collective::elastic::CommunicatorFn follow);
  ~AllreduceStore() override;

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

  int rank() const override { return comm().rank(); }
  int num_workers() const override { return comm().size(); }
  void barrier() override;
  const std::string& type() const override { return type_; }

  // collective::elastic::Participant (see the top of this file).
  void elastic_save() override;
  void elastic_abandon() override;
  void elastic_restore() override;
  void elastic_rebind() override;
  void elastic_sync() override;
  // True when built over a CommunicatorFn (able to re-bind).
  bool follows_group() const { return static_cast<bool>(follow_); }

 private:
  static constexpr int kSlots = 4;
  struct Entry {
    Key key;
    uint64_t id = 0;   // this store's number for the key (compression residuals)
    std::string name;  // "kv.<key>"
    Array value;
    Array saved;  // elastic: the value at the last commit (empty before one)
    uint64_t shard = 0;
    std::mutex submit_mu;  // orders submissions (names) of this key's pushes
    uint64_t pushes = 0;   // guarded by submit_mu
    // Per slot: the reduced gradient and the completion of the push using it.
    std::array<Array, kSlots> grad;
    std::array<Array, kSlots> half;   // fp16 compression: what travels on the ring
    std::array<Array, kSlots> codes;  // 1bit/2bit: this worker's wire form, allgathered
    Array rounded;                    // the sum rounded for an updater (16-bit keys)
    std::array<std::shared_ptr<Completion>, kSlots> busy;
  };
  using Apply = kv::UpdateRule;

  std::vector<Entry*> entries_for(const char* op, const std::vector<Key>& keys, size_t lists) const;
  // Sums `values`, submits the allreduce and queues its apply (+ the pull
  // into `outs` when given) on the key's shard; finishes one part of `done`.
  void push_key(Entry& e, const ArrayList& values, const ArrayList* outs,
                std::shared_ptr<const Apply> apply,
                std::shared_ptr<compress::Compressor> compressor,
                const std::shared_ptr<Completion>& done);
  static void copy_out(const Entry& e, const ArrayList& outs);
  // g = the rank-order sum of every worker's 1bit/2bit codes (`gathered`:
  // the allgather of their wire forms); throws when a worker's settings differ.
  static void sum_codes(const collective::Communicator& c, const Array& gathered,
                        const compress::Settings& settings, Array& g);
  // The bound communicator; Internal while none is (abandoned, not re-bound).
  collective::Communicator& comm() const;

  const std::string type_;
  std::unique_ptr<collective::Session> session_;  // null when given a communicator
  std::unique_ptr<collective::Communicator> own_comm_;
  collective::elastic::CommunicatorFn follow_;  // set: comm_ is borrowed from it
  collective::Communicator* comm_ = nullptr;    // null once abandoned
  mutable std::shared_mutex mu_;                // guards entries_' structure, int_keys_
  std::map<Key, std::unique_ptr<Entry>> entries_;
  std::optional<bool> int_keys_;
  kv::UpdateRuleSlot rule_;
  std::shared_ptr<compress::Compressor> compressor_;  // guarded by mu_; null: none
  std::atomic<uint64_t> next_id_{0};
  ShardedExecutor exec_;  // last: drained first on destruction
};

}  // namespace pushpull
