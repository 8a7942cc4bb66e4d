// SPDX-License-Identifier: Apache-2.0
// KVStore: MXNet's key-value store for data-parallel training.
//
//   auto kv = pushpull::create_kvstore("local");
//   kv->init("weight", w);             // stores a copy
//   kv->push("weight", {g0, g1});      // sum of the devices' arrays
//   kv->pull("weight", {w0, w1});      // copies the stored value into each
//
// Semantics (every type):
// - Keys are integers or strings; one store never mixes the two kinds.
// - push sums the list of arrays given for a key. Without an updater the sum
//   replaces the stored value; with one, updater(key, summed, stored) runs and
//   may change `stored`. set_optimizer installs an updater that runs one of
//   the optimizers of pushpull/optimizer.h with per-key state.
// - pull copies the stored value into every output array.
// - Operations on one key take effect in call order; different keys may be
//   processed concurrently. The *_async calls return at once with a handle;
//   the other calls block until done. A pull's outputs are complete when the
//   call (or its handle's wait) returns.
// - Bad input (a key never initialised, a shape or dtype other than the key's,
//   an empty list, mixed key kinds, a null array, an array not on the CPU) is
//   rejected by the call itself, before anything changes: InvalidArgument, or
//   NotFound for an unknown key, AlreadyExists for a second init.
// - float16/bfloat16 values are summed in float32 and rounded once; the
//   optimizers update them in float32 (see multi_precision).
//
// Memory: the arrays passed to an async call must stay valid, and a push's
// inputs unchanged, until its handle is done (blocking calls: until return).
//
// Thread safety: every method may be called from any thread. Calls made from
// several threads are ordered as the store receives them. The updater runs on
// the store's threads, concurrently for different keys, never for one key.
//
// Blocking: every wait has a deadline, Options::kvstore.wait_timeout
// (PUSHPULL_KVSTORE_WAIT_TIMEOUT_MS); passing it throws Timeout.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pushpull/array.h"
#include "pushpull/key.h"
#include "pushpull/optimizer.h"
#include "pushpull/options.h"

namespace pushpull {

class Completion;  // src/base/executor.h

// The completion of one asynchronous operation (all its keys). Copyable; a
// default-constructed handle is done. Waiting twice is fine.
class KVHandle {
 public:
  KVHandle() = default;
  explicit KVHandle(std::shared_ptr<Completion> c);
  bool done() const;
  // Blocks until the operation finished or `timeout` passed. Throws the
  // operation's error (e.g. one thrown by an updater) or Timeout.
  void wait(Millis timeout) const;

 private:
  std::shared_ptr<Completion> c_;
};

// The arrays of one key, one per device.
using ArrayList = std::vector<ArrayView>;
// updater(key, summed, stored): `summed` is the sum of the pushed arrays (read
// it only), `stored` the value to update in place.
using Updater =
    std::function<void(const Key& key, const ArrayView& summed, const ArrayView& stored)>;

class KVStore {
 public:
  virtual ~KVStore();
  KVStore(const KVStore&) = delete;
  KVStore& operator=(const KVStore&) = delete;

  // ---- The interface every store type implements (batches of keys) ----

  // Stores a copy of values[i] under keys[i]; blocks until stored.
  virtual void init(const std::vector<Key>& keys, const std::vector<ArrayView>& values) = 0;
  // values[i]: the arrays pushed for keys[i] (one per device, at least one).
  virtual KVHandle push_async(const std::vector<Key>& keys, const std::vector<ArrayList>& values,
                              int priority = 0) = 0;
  virtual KVHandle pull_async(const std::vector<Key>& keys, const std::vector<ArrayList>& outs,
                              int priority = 0) = 0;
  // Push then pull, as one operation per key.
  virtual KVHandle pushpull_async(const std::vector<Key>& keys,
                                  const std::vector<ArrayList>& values,
                                  const std::vector<ArrayList>& outs, int priority = 0) = 0;
  // Pulls only the rows `row_ids` (1-D int64 or int32; duplicates and any
  // order allowed) of a key whose value has at least one dimension. outs[j]
  // has the value's shape: the listed rows get the value's rows, every other
  // row is zero (MXNet's row_sparse_pull into a dense array).
  virtual KVHandle row_sparse_pull_async(const Key& key, const ArrayList& outs,
                                         const ArrayView& row_ids, int priority = 0) = 0;
  // Blocks until every operation issued before the call finished.
  virtual void wait_all() = 0;

  // Applies to pushes issued after the call (those in flight keep the old one).
  virtual void set_updater(Updater updater) = 0;
  // An updater running create_optimizer(spec) (InvalidArgument for a bad spec).
  virtual void set_optimizer(const OptimizerSpec& spec) = 0;
  // Waits for the operations in flight, then saves / loads the optimizer's
  // per-key states (format: docs/kvstore.md). InvalidArgument without an
  // optimizer; IoError naming the file when it cannot be read or is corrupt.
  virtual void save_optimizer_states(const std::string& path) = 0;
  virtual void load_optimizer_states(const std::string& path) = 0;
  // MXNet's gradient compression: {"type": "none"|"2bit"|"1bit"|"fp16",
  // "threshold": "0.5"} (threshold for 1bit/2bit only), with error feedback.
  // dist_sync/dist_async compress every type of push to the servers;
  // dist_sync_allreduce takes fp16 only; local stores refuse any type but
  // none (nothing travels). InvalidArgument for bad or refused settings, the
  // same text on every store (docs/kvstore.md "Gradient compression").
  virtual void set_gradient_compression(const std::map<std::string, std::string>& params) = 0;

  virtual int rank() const = 0;
  virtual int num_workers() const = 0;
  // Blocks until every worker reached it (at once for local stores).
  virtual void barrier() = 0;
  // The type name given to create_kvstore ("local", "device", ...).
  virtual const std::string& type() const = 0;
  // A restarted parameter-server worker (pushpull launch --max-restarts,
  // docs/ps.md "Worker restart"): the rounds its rank had completed on every
  // key when it rejoined, known once init() returned; training resumes at
  // round restart_round() + 1 (the data position). 0 for every other store.
  virtual int64_t restart_round() const { return 0; }

  // ---- Blocking conveniences ----

  Millis wait_timeout() const { return wait_timeout_; }
  void wait(const KVHandle& h) const { h.wait(wait_timeout_); }

  void init(const Key& key, const ArrayView& value) { init(std::vector<Key>{key}, {value}); }

  void push(const Key& key, const ArrayView& value, int priority = 0);
  void push(const Key& key, const ArrayList& values, int priority = 0);
  void push(const std::vector<Key>& keys, const std::vector<ArrayView>& values, int priority = 0);
  void push(const std::vector<Key>& keys, const std::vector<ArrayList>& values, int priority = 0);

  void pull(const Key& key, const ArrayView& out, int priority = 0);
  void pull(const Key& key, const ArrayList& outs, int priority = 0);
  void pull(const std::vector<Key>& keys, const std::vector<ArrayView>& outs, int priority = 0);
  void pull(const std::vector<Key>& keys, const std::vector<ArrayList>& outs, int priority = 0);

  void pushpull(const Key& key, const ArrayView& value, const ArrayView& out, int priority = 0);
  void pushpull(const Key& key, const ArrayList& values, const ArrayList& outs, int priority = 0);
  void pushpull(const std::vector<Key>& keys, const std::vector<ArrayList>& values,
                const std::vector<ArrayList>& outs, int priority = 0);

  void row_sparse_pull(const Key& key, const ArrayView& out, const ArrayView& row_ids,
                       int priority = 0);
  void row_sparse_pull(const Key& key, const ArrayList& outs, const ArrayView& row_ids,
                       int priority = 0);

 protected:
  explicit KVStore(Millis wait_timeout) : wait_timeout_(wait_timeout) {}

 private:
  Millis wait_timeout_;
};

// Makes a store of `type`:
//   local, local_update_cpu, local_allreduce_cpu: sums and updates on the CPU
//   device, local_allreduce_device: sums on the arrays' device (on the CPU,
//     the same as local)
// Unknown type → InvalidArgument listing the valid ones.
std::unique_ptr<KVStore> create_kvstore(std::string_view type, const Options& options = Options{});
// The type names create_kvstore accepts.
std::vector<std::string> kvstore_types();

}  // namespace pushpull
