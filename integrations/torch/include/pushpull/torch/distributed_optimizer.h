// SPDX-License-Identifier: Apache-2.0
// DistributedOptimizer: Horovod's hvd.DistributedOptimizer for torch::optim
// optimizers, over pushpull's collectives engine (no servers).
//
//   pushpull::collective::Session session(pushpull::Options::from_env());
//   auto& comm = session.communicator();
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//   pushpull::torch::DistributedOptimizer opt(sgd, model->named_parameters(), comm);
//   pushpull::torch::broadcast_parameters(model->named_parameters(), 0, comm);
//   pushpull::torch::broadcast_optimizer_state(sgd, 0, comm);
//   for (...) {
//     opt.zero_grad();
//     loss_mean(model, x, y).backward();  // each gradient's allreduce starts here
//     opt.step();                         // waits for them, then sgd.step()
//   }
//
// (Without a Session of your own: call pushpull::collective::init() and leave
// out the communicator argument; the process-default session is used.)
//
// Semantics (as Horovod's):
// - Every parameter the wrapped optimizer updates that requires grad is
//   averaged (Reduction::kAverage by default) across the ranks. A post hook on
//   the parameter's AccumulateGrad node starts its allreduce, in place on
//   .grad, as soon as the gradient of the last of `backward_passes_per_step`
//   backward passes is accumulated, so communication overlaps the rest of the
//   backward pass; the engine fuses gradients that are ready together.
// - step() = synchronize() + the wrapped optimizer's step(). synchronize()
//   submits whatever the hooks did not (a parameter that got fewer backward
//   passes, or none: then a zero gradient, so that every rank submits every
//   name and nobody stalls) and waits for every allreduce. Call synchronize()
//   yourself to clip or inspect the averaged gradients before step(); step()
//   then does not reduce them again.
// - With backward_passes_per_step = k the gradients of k backward passes are
//   summed locally (libtorch accumulates into .grad) and reduced once; with
//   average_aggregated_gradients they are divided by k too.
// - Allreduce names are `<name_prefix><parameter name>`, identical on every
//   rank, so every rank must wrap the same model (same names, shapes, dtypes);
//   a mismatch fails the step on every rank with InvalidArgument.
// - Loss: gradients are averaged over ranks, so use the loss averaged over
//   the local batch to get the gradient of the mean over the global batch.
// - compression = kFp16 (Horovod's Compression.fp16): a float32 or float64
//   gradient travels as float16 (a half-size copy is reduced, then cast back
//   into .grad); other dtypes travel as they are.
// - compression = kTwoBit / kOneBit (MXNet's codecs, compression_threshold t):
//   each rank encodes its gradient (times the prescale) plus its residual, a
//   float32 array per parameter that carries what the codes did not (error
//   feedback, as 1-bit Adam), the codes are allgathered and every rank sums
//   them in rank order (the same bits everywhere), then divides by the
//   ranks for kAverage. 2bit sends {-t, 0, +t} (t > 0), 1bit sends +1 where
//   the value with its residual is above t, else -1 (so scale t, or the
//   learning rate, to your gradients). Every rank must pass the same type and
//   threshold (else InvalidArgument from step() on every rank).
// - process_set (Horovod's process_set=): only these ranks reduce, among
//   themselves (kAverage divides by their number); a rank outside the set
//   steps on its own gradients (its optimizer is local, as Horovod's), and
//   every member must pass the same set.
// - gradient_predivide_factor f (Horovod's): each gradient is multiplied by
//   1/f before the sum and the average by f after (the same mean; f trades
//   overflow against underflow in low precision). kAverage only.
// - kAverage divides the sum by the ranks of the set, so a rank that joined
//   counts as zeros (as Horovod's).
// - groups / num_groups (Horovod's): a group's allreduces start together.
// - Sparse COO gradients (nn::Embedding with sparse(true)), as Horovod's:
//   by default every rank's nonzeros are allgathered (each one's indices and
//   values packed into one row of bytes, one allgather under
//   `<name_prefix><name>`, the name a dense gradient's allreduce has), among
//   the process set's members when there is one, and the gradient becomes
//   their coalesced sum (times 1 / members for kAverage, and 1 /
//   backward_passes_per_step with average_aggregated_gradients); op must be
//   kAverage or kSum, and compression and gradient_predivide_factor do not
//   apply (the values travel as they are). With sparse_as_dense the gradient
//   is densified and reduced as a dense one (compression applies), and the
//   wrapped optimizer gets a sparse gradient back (to_sparse with the same
//   sparse_dim), so a sparse-capable optimizer (torch::optim::Adagrad) keeps
//   working.
// - A rank whose sparse parameter got no gradient in a step must still take
//   part in its reduction, knowing that the others allgather sparse rows. It
//   knows when the parameter is declared (options.sparse_parameters, e.g.
//   sparse_parameters(*model): the weights of the Embedding / EmbeddingBag
//   modules with sparse(true)) or when an earlier step reduced it as sparse
//   on every rank: it then contributes an empty sparse gradient (a dense
//   gradient goes as its nonzero rows), and training goes on. Otherwise it
//   contributes dense zeros, which meet the others' allgather under one
//   name: step() fails at once on every rank with InvalidArgument naming the
//   parameter (declare it, pass sparse_as_dense, or give every rank a
//   gradient for it), instead of every rank waiting until the stall timeout.
// The policy (names, readiness, groups, scaling, compression) is the one
// pushpull.torch's Python DistributedOptimizer uses too:
// pushpull/frontend/gradient_reducer.h; this class adds tensors and hooks.
//
// Errors: InvalidArgument (naming the parameter and what to do) for a
// parameter of the optimizer missing from `named_parameters`, duplicate names,
// a sparse_parameters name not in named_parameters,
// a tensor that is not on the CPU, not contiguous or of a dtype the
// collectives do not reduce (float32/64, float16, bfloat16), an op other
// than kAverage or kSum,
// backward_passes_per_step < 1, a process set with a rank out of range or
// twice, a gradient_predivide_factor <= 0 or with kSum, and a backward pass beyond
// backward_passes_per_step before step() (raised from the tensor hook, before
// the gradient in flight is touched, so nothing is corrupted: backward()
// throws). The collectives' errors (PeerFailure, Timeout, mismatches) come out
// of step()/synchronize().
//
// Ownership: the optimizer, the parameters and the communicator are the
// caller's and must outlive this object. The destructor removes the hooks and
// waits (bounded by the communicator's wait_timeout) for allreduces still in
// flight, so no reduction writes into a gradient after it returns.
// Thread safety: step(), synchronize() and zero_grad() from one thread; the
// hooks may run on autograd threads (they lock). Blocking: synchronize() and
// step() block on the collectives, each wait bounded by wait_timeout (Timeout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pushpull/collective.h"

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}
namespace torch::nn {
class Module;
}

namespace pushpull::torch {

// Named tensors in a fixed order (e.g. from module->named_parameters():
// see named() below for the conversion).
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Horovod's Compression.none / Compression.fp16; pushpull's 2bit and 1bit
// (docs/collectives.md "Gradient compression").
enum class Compression { kNone, kFp16, kTwoBit, kOneBit };

struct DistributedOptimizerOptions {
  // Backward passes whose gradients are accumulated locally before one reduction.
  int backward_passes_per_step = 1;
  // Divide the accumulated gradient by backward_passes_per_step too.
  bool average_aggregated_gradients = false;
  // kAverage (Horovod's default) or kSum.
  collective::Reduction op = collective::Reduction::kAverage;
  // Allreduce names are name_prefix + parameter name.
  std::string name_prefix = "DistributedOptimizer.grad.";
  // Gradients of float32/float64 parameters travel as float16 with kFp16.
  Compression compression = Compression::kNone;
  // The ranks that reduce (a process set: distinct ranks of the
  // communicator); empty: every rank.
  std::vector<int> process_set = {};
  // Horovod's gradient_predivide_factor (> 0; with kAverage only).
  double gradient_predivide_factor = 1.0;
  // kTwoBit / kOneBit: the threshold (2bit > 0, 1bit finite; MXNet's 0.5).
  float compression_threshold = 0.5f;
  // Horovod's groups: lists of parameter names whose allreduces start
  // together once every member's gradient is ready (the engine fuses them);
  // the others go alone. Or, with no groups, num_groups > 0 splits the
  // reduced parameters in the optimizer's order into that many.
  std::vector<std::vector<std::string>> groups = {};
  int num_groups = 0;
  // Sparse gradients are densified for a dense allreduce (and handed back
  // sparse) instead of being allgathered.
  bool sparse_as_dense = false;
  // Names (as in named_parameters) of parameters whose gradients are sparse
  // COO with sparse_dim 1 (an embedding's) on every rank, e.g.
  // sparse_parameters(*model): a rank that did not use one in a step
  // contributes an empty sparse gradient. A name not in named_parameters:
  // InvalidArgument; one the optimizer does not reduce is ignored, and so is
  // the whole list with sparse_as_dense. Every rank must pass the same list.
  std::vector<std::string> sparse_parameters = {};
};

class DistributedOptimizer {
 public:
  // `named_parameters` must name every parameter of `optimizer` (more is
  // fine: only the optimizer's parameters are reduced). Throws
  // InvalidArgument as described above. Collective-free: nothing is sent.
  DistributedOptimizer(::torch::optim::Optimizer& optimizer, NamedTensors named_parameters,
                       collective::Communicator& communicator,
                       DistributedOptimizerOptions options = {});
  // The same over the process-default session (collective::init() first,
  // else InvalidArgument).
  DistributedOptimizer(::torch::optim::Optimizer& optimizer, NamedTensors named_parameters,
                       DistributedOptimizerOptions options = {});
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // synchronize(), then the wrapped optimizer's step().
  void step();
  // Submits the reductions the hooks did not start and waits for all.
  void synchronize();
  // The wrapped optimizer's zero_grad().
  void zero_grad();

  ::torch::optim::Optimizer& optimizer() const;
  collective::Communicator& communicator() const;
  // The reduced parameters, in the optimizer's order.
  size_t num_parameters() const;

  struct Stats {
    int64_t steps = 0;
    // Reductions started from hooks during backward / from synchronize().
    int64_t hook_allreduces = 0;
    int64_t sync_allreduces = 0;
    // Time synchronize() spent waiting (communication not hidden by backward).
    double wait_seconds = 0;
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Converts what module->named_parameters() / named_buffers() return (a
// torch::OrderedDict) or any range of (name, tensor) items.
template <typename Dict>
NamedTensors named(const Dict& dict) {
  NamedTensors out;
  for (const auto& item : dict)
    out.emplace_back(item.key(), item.value());
  return out;
}

// The names (as module.named_parameters() gives them) of the weights of the
// torch::nn::Embedding and EmbeddingBag modules in `module` (itself
// included) whose options have sparse(true): what
// DistributedOptimizerOptions::sparse_parameters takes. Pure; thread-safe
// as long as nobody changes the module meanwhile.
std::vector<std::string> sparse_parameters(const ::torch::nn::Module& module);

// Every rank's tensors become root_rank's (in place, through the
// collectives; names "broadcast_parameters.<name>"). Pass named_parameters()
// and, for batch-norm statistics, named_buffers() too. Tensors: CPU,
// contiguous, any dtype the collectives know. Blocks until done. Throws
// InvalidArgument for a bad root or tensor, and the collectives' errors
// (a rank with other names or shapes: InvalidArgument on every rank).
void broadcast_parameters(const NamedTensors& tensors, int root_rank,
                          collective::Communicator& communicator);
void broadcast_parameters(const NamedTensors& tensors, int root_rank);  // default session

// Every rank's optimizer state and hyperparameters (per parameter group:
// SGD's momentum buffers, Adam's step counts and moments, learning rates...)
// become root_rank's. The root serialises its optimizer (libtorch's own
// archive: parameter groups and per-parameter state in the optimizer's fixed
// parameter order), broadcasts the byte count and then the bytes, and the
// others load it after clearing their own state. Every rank must pass an
// optimizer of the same type over the same parameter shapes, in the same
// order; otherwise loading fails with InvalidArgument. Blocks until done.
void broadcast_optimizer_state(::torch::optim::Optimizer& optimizer, int root_rank,
                               collective::Communicator& communicator);
void broadcast_optimizer_state(::torch::optim::Optimizer& optimizer, int root_rank);

}  // namespace pushpull::torch
