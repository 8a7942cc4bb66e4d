// SPDX-License-Identifier: Apache-2.0
// Trainer: keeps the parameters of a libtorch model in sync through a KVStore,
// in the shape of Gluon's gluon.Trainer.
//
//   auto kv = pushpull::create_kvstore("dist_sync", pushpull::Options::from_env());
//   pushpull::torch::Trainer trainer({replica0->parameters(), replica1->parameters()},
//                                    pushpull::OptimizerSpec::parse("sgd:learning_rate=0.1"),
//                                    *kv, /*update_on_kvstore=*/true);
//   trainer.init();                       // optional: step() does it on first use
//   for (...) {
//     // forward + backward on every replica, loss summed over the samples
//     trainer.step(batch_size);           // batch_size: samples of this worker
//     // zero the replicas' gradients
//   }
//
// Model: one replica of the model per device of this worker (replicas[d][i] is
// parameter i on device d; every replica lists the same shapes in the same
// order). Parameter i is key `key_base + i` in the store, except that
// parameters under `fuse_below` bytes (256 KiB) are packed, in order, into flat
// keys of up to `bucket_bytes` (1 MiB), each under the key of its first
// parameter: one message instead of one per bias or norm, as DDP packs its
// gradients into buckets (the pushpull optimizers are elementwise, so the
// update is the same). keys() lists the keys used; fuse_below = 0 gives
// every parameter its own key. init() stores replica 0's values (the store
// keeps rank 0's: "worker 0 wins") and pulls them into every replica of every
// worker, so all replicas start identical.
//
// step(batch_size): every gradient is pushed as the key's ArrayList (one per
// replica: the store sums them, then sums across workers), with priority -i,
// so the first layers, which the next forward pass needs first, go first. Then
//  - update_on_kvstore: the store runs the optimizer (set_optimizer with
//    rescale_grad = scale / (batch_size * num_workers)) and step() pulls the
//    new weights into every replica;
//  - otherwise: step() pulls the summed gradient, scales it by
//    1 / (batch_size * num_workers) and runs create_optimizer(spec) locally on
//    replica 0, then copies replica 0's weights into the others.
// Gradients must be sums over the samples (a loss with reduction "sum"), as in
// Gluon, where rescale_grad turns them into the mean over the global batch.
//
// Early pushes: from the second step on, a gradient is pushed from an autograd
// hook (a post hook on the parameter's AccumulateGrad node) as soon as every
// replica's gradient of that parameter is accumulated, its pull requested
// right behind it (pushpull_async), so both directions overlap the rest of the
// backward pass; step() then pushes only what is left and waits. The new
// value may therefore land in a parameter before step() returns (backward no
// longer reads it by then): read parameters after step(). A packed key is
// pushed once the last of its parameters has its gradients (copied into the
// key's flat buffer); its result is copied back in step(). The first step pushes everything from
// step(), because the store gets its optimizer (whose scale needs batch_size) there. A parameter
// may get one gradient per replica between two steps: for gradient accumulation over several
// backward passes, set push_from_hooks = false.
//
// Tensors: defined, float32, contiguous, on the CPU, at most 8 dimensions, and
// requiring grad; their gradients the same. They cross into the store as
// ArrayViews over data_ptr (no copy; a packed key's are copied), so a pushed
// gradient must not change, and a weight must not be read, until step() returns.
//
// Errors: InvalidArgument naming the parameter (index, replica, shape, what is
// wrong and what to do) for bad tensors, a parameter without a gradient at
// step(), or update_on_kvstore = false on a dist_async store; the store's and
// optimizer's exceptions pass through. A bad gradient seen in a hook makes the
// backward() call throw.
//
// Thread safety: step() and init() from one thread at a time; the replicas'
// backward passes may run concurrently in different threads (the hooks are
// thread safe). The parameter tensors and the store must outlive the Trainer.
// Blocking: init() and step() block on the store, each wait bounded by the
// store's wait_timeout (Timeout). A step() that throws still ends its round.
//
// The step itself is frontend::TrainerCore (include/pushpull/frontend/
// trainer_core.h), which pushpull.torch.Trainer binds too; this class adds
// libtorch's checks, messages and hooks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pushpull/kvstore.h"
#include "pushpull/optimizer.h"

namespace at {
class Tensor;
}

namespace pushpull::torch {

// The parameters of one model replica, in a fixed order.
using ParameterList = std::vector<at::Tensor>;

struct TrainerOptions {
  bool update_on_kvstore = true;
  // Push each gradient from an autograd hook as soon as it is ready (see above).
  bool push_from_hooks = true;
  // Parameter i is key key_base + i (several trainers can share one store).
  int64_t key_base = 0;
  // Multiplies rescale_grad (Gluon's `scale`).
  double scale = 1.0;
  // Parameters of fewer bytes are packed into flat keys of at most
  // bucket_bytes (see above); 0: no packing.
  int64_t fuse_below = 256 << 10;
  int64_t bucket_bytes = 1 << 20;
};

class Trainer {
 public:
  // Throws InvalidArgument for bad tensors, a bad optimizer spec or an
  // impossible combination (see the file comment). Does not touch the store.
  Trainer(std::vector<ParameterList> replicas, OptimizerSpec optimizer, KVStore& kvstore,
          TrainerOptions options);
  Trainer(std::vector<ParameterList> replicas, OptimizerSpec optimizer, KVStore& kvstore,
          bool update_on_kvstore = true);
  // One device.
  Trainer(ParameterList parameters, OptimizerSpec optimizer, KVStore& kvstore,
          bool update_on_kvstore = true);
  // Removes the hooks. Waits for nothing: call step() (or kvstore.wait_all())
  // first if pushes may be in flight.
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Initialises the keys and pulls the initial weights into every replica.
  // Idempotent; step() calls it on first use.
  void init();
  // See the file comment. `batch_size`: the samples this worker processed
  // since the last step, over all its replicas (> 0).
  void step(int64_t batch_size);

  size_t num_parameters() const;
  // The store keys this Trainer uses, ascending (one per packed group or
  // unpacked parameter).
  std::vector<Key> keys() const;
  int num_devices() const;
  bool update_on_kvstore() const;
  KVStore& kvstore() const;

  struct Stats {
    int64_t steps = 0;
    // Keys pushed from hooks during backward / from step().
    int64_t hook_pushes = 0;
    int64_t step_pushes = 0;
    // Time step() spent waiting for the store (communication not hidden by
    // the backward pass), in seconds.
    double wait_seconds = 0;
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pushpull::torch
