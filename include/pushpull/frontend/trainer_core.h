// SPDX-License-Identifier: Apache-2.0
// TrainerCore: the Trainers' step, written once for both torch front ends
// (the libtorch pushpull::torch::Trainer and pushpull.torch.Trainer) over
// ArrayViews, key ids and one small interface to the framework's tensors.
// Each binding keeps only its framework's glue: finding and checking
// tensors, autograd hooks, its errors' wording, the GIL.
//
// What it does (the contract of both Trainers, docs/torch.md, docs/python.md):
// - keys: parameter i is key key_base + i, small ones packed into flat keys
//   (frontend/key_packing.h); the flat buffers are the core's;
// - init(): replica 0's weights into the store (packed ones gathered first),
//   every replica pulled back from it (the store keeps worker 0's);
// - grad_ready(i): a hook saw one of parameter i's gradients; when its key is
//   complete (frontend/push_schedule.h) the core starts the key's exchange
//   (pushpull_async: the push and the pull of its result, priority -i);
// - step(batch): checks every gradient not pushed yet before pushing any,
//   pushes them, waits, then writes the results: update_on_kvstore, the store
//   ran the optimizer (rescale_grad = user's * scale / (batch * workers), set
//   once at the first step, as Gluon does) and the new weights land in every
//   replica; otherwise the summed gradient is scaled by 1 / (batch * workers)
//   and either create_optimizer(spec) updates replica 0 (copied to the
//   others) or, with local_optimizer = false, the framework's optimizer runs
//   after step() returns, reading summed(i).
// A step that throws ends its round anyway (the next one starts clean).
//
// Ownership: the core owns its buffers and handles; the TrainerTensors and the
// store the getter returns must outlive it. Thread safety: init(), step()
// and the destructor from one thread at a time; grad_ready() from any
// thread (the replicas' backward passes), with a mutex inside. Blocking:
// init(), step() and the destructor block on the store (each wait bounded by
// the store's wait_timeout), always inside TrainerTensors::blocking().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pushpull/array.h"
#include "pushpull/frontend/key_packing.h"
#include "pushpull/frontend/push_schedule.h"
#include "pushpull/kvstore.h"
#include "pushpull/optimizer.h"

namespace pushpull::frontend {

struct TrainerCoreOptions {
  bool update_on_kvstore = true;
  bool push_from_hooks = true;
  int64_t key_base = 0;
  double scale = 1.0;  // multiplies rescale_grad (Gluon's `scale`)
  int64_t fuse_below = 256 << 10;
  int64_t bucket_bytes = 1 << 20;
  // Without update_on_kvstore: true, create_optimizer(spec) updates here;
  // false, the framework's optimizer does (the spec is not used).
  bool local_optimizer = true;
};

// The framework's side, asked for tensors when they are used.
class TrainerTensors {
 public:
  virtual ~TrainerTensors() = default;
  // Parameter i's weights on replica d: float32, contiguous, CPU, of the
  // shape given to the core.
  virtual ArrayView weight(size_t i, int d) = 0;
  // Parameter i's gradient on replica d, checked: throws (naming the
  // parameter) when it is missing or unusable. It must stay valid until the
  // step() that collects its exchange has returned.
  virtual ArrayView gradient(size_t i, int d) = 0;
  // Runs a call that blocks on the store (Python: with the GIL released).
  // The core holds none of its locks when it calls this.
  virtual void blocking(const std::function<void()>& call) { call(); }
  // update_on_kvstore: step(batch_size) after a first step of another size
  // (the store's rescale_grad stays the first one's, as in Gluon).
  virtual void batch_changed(int64_t /*batch_size*/, int64_t /*first_batch_size*/,
                             int /*num_workers*/) {}
};

class TrainerCore {
 public:
  // shapes: parameter i's shape (float32 elements). The store is looked up
  // at every call. InvalidArgument for an impossible combination (no
  // parameters, scale <= 0, bad packing sizes, a local update on an async
  // store, an unknown optimizer). Does not touch the store's data.
  TrainerCore(std::function<KVStore&()> store, OptimizerSpec spec, std::vector<Shape> shapes,
              int replicas, TrainerCoreOptions options, TrainerTensors& tensors);
  // Waits for exchanges that hooks started and no step() collected (they
  // still read gradients and write weights); their errors are dropped.
  ~TrainerCore();
  TrainerCore(const TrainerCore&) = delete;
  TrainerCore& operator=(const TrainerCore&) = delete;

  const std::vector<KeyUnit>& units() const { return units_; }
  size_t unit_of(size_t i) const { return unit_of_.at(i); }
  // "key 3", or "packed in key 2": how messages name parameter i's key.
  std::string key_label(size_t i) const;
  const TrainerCoreOptions& options() const { return opt_; }

  // Idempotent; step() calls it first.
  void init();
  // One of parameter i's gradients is in (a hook). kPush: the core started
  // its key's exchange; kSecond: a gradient too many this round (the binding
  // raises its error); kWait otherwise. Rethrows what starting failed with
  // (step() then pushes that key).
  PushSchedule::Ready grad_ready(size_t i);
  void step(int64_t batch_size);
  // local_optimizer = false: parameter i's summed gradient, scaled by the
  // last step (valid as long as the core).
  ArrayView summed(size_t i) const;

  struct Stats {
    int64_t steps = 0;
    int64_t hook_pushes = 0;  // keys pushed from hooks / from step()
    int64_t step_pushes = 0;
    double wait_seconds = 0;  // step()'s time waiting for the store
  };
  Stats stats() const;
  // An exchange started may still read gradients or write weights (a step
  // that threw, hooks' pushes no step collected).
  bool in_flight() const;

 private:
  // Per unit, the flat buffers: a packed unit's gradients (one per replica)
  // and weights (local optimizer); the result when it does not land in the
  // weights themselves (packed: the new weights, or the summed gradient;
  // unpacked: the summed gradient of a local update).
  struct Buffers {
    std::vector<std::vector<float>> grads;
    std::vector<float> weight;
    std::vector<float> value;
    bool holds_result = false;  // the exchange's result lands in `value`
  };
  ArrayList gradients(size_t u);
  ArrayList outputs(size_t u);
  KVHandle exchange(size_t u, const ArrayList& grads);
  void rescale(int64_t batch_size);
  void finish(size_t u, int64_t global_batch);
  void local_update(size_t u, int64_t global_batch);
  // Copies replica d's weights of unit u into `flat`, or back.
  void gather(size_t u, int d, float* flat);
  void scatter(size_t u, const float* flat, int d);
  // A checked view from the framework (its size is trusted by memcpy).
  ArrayView checked(const ArrayView& v, size_t i, const char* what) const;

  std::function<KVStore&()> store_;
  OptimizerSpec spec_;
  std::vector<Shape> shapes_;
  int k_;
  TrainerCoreOptions opt_;
  TrainerTensors& tensors_;
  std::vector<KeyUnit> units_;
  std::vector<size_t> unit_of_;
  std::vector<Buffers> buffers_;
  std::unique_ptr<Optimizer> local_;  // local_optimizer without update_on_kvstore
  bool initialised_ = false;
  int64_t first_batch_ = 0;  // update_on_kvstore: what the store's optimizer was scaled for

  mutable std::mutex mu_;          // the round's state shared with the hooks:
  PushSchedule schedule_;          // (its own lock)
  std::vector<KVHandle> handles_;  // per unit: this round's exchange (mu_)
  std::vector<KVHandle> stale_;    // exchanges of failed rounds, maybe still running (mu_)
  Stats stats_;                    // (mu_)
};

}  // namespace pushpull::frontend
