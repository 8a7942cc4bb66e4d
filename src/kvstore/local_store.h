// SPDX-License-Identifier: Apache-2.0
// The single-process store behind the types local, device and their MXNet
// aliases: values live in host memory, pushes are summed and applied by a
// ShardedExecutor owned by the store, so one key's operations run in call
// order and different keys in parallel.
//
// Ownership: owns its values, its optimizer and its threads. The executor is
// the last member, so it is destroyed (draining queued work) first.
// Thread safety: as KVStore (every method from any thread).
#pragma once

#include "kvstore/update_rule.h"

#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>

#include "base/executor.h"
#include "pushpull/kvstore.h"

namespace pushpull {

class LocalStore final : public KVStore {
 public:
  LocalStore(std::string type, const Options& options);
  ~LocalStore() override;

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

  int rank() const override { return 0; }
  int num_workers() const override { return 1; }
  void barrier() override {}
  const std::string& type() const override { return type_; }

 private:
  struct Entry {
    Entry(Key k, const ArrayView& v);
    Key key;
    Array value;
    uint64_t shard;
    // float32 sums for 16-bit values, the summed gradient otherwise; only the
    // key's executor thread touches them.
    Array sum, sum32, tmp32;
  };
  using Apply = kv::UpdateRule;

  // Validation (throws, changes nothing). Returns the entries of `keys`.
  std::vector<Entry*> entries_for(const char* op, const std::vector<Key>& keys, size_t lists) const;

  // Executor-side work.
  void do_push(Entry& e, const ArrayList& values, const Apply* apply);
  void do_pull(Entry& e, const ArrayList& outs);

  const std::string type_;
  mutable std::shared_mutex mu_;  // guards the map's structure, int_keys_
  std::map<Key, std::unique_ptr<Entry>> entries_;
  std::optional<bool> int_keys_;  // set by the first init
  kv::UpdateRuleSlot rule_;
  ShardedExecutor exec_;
};

}  // namespace pushpull
