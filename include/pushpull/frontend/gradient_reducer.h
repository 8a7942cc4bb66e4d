// SPDX-License-Identifier: Apache-2.0
// GradientReducer: the DistributedOptimizer's policy, written once for both
// torch front ends (the libtorch pushpull::torch::DistributedOptimizer and
// pushpull.torch's Horovod-style DistributedOptimizer): under which name each
// gradient is reduced, when it is ready (backward_passes_per_step, groups),
// how it travels (op, gradient_predivide_factor, process set, compression
// none / fp16 / 2bit / 1bit with a residual per parameter) and how the result
// lands back in the gradient. Torch-free: gradients are ArrayViews; each
// binding keeps only its framework's glue (hooks, tensors, errors).
//
// Parameters are indices 0..n-1 (the optimizer's order of the parameters
// that are reduced); every rank must build the reducer over the same names.
// One round (one optimizer step):
//   1. a hook before accumulation calls before_accumulate(i): it throws
//      InvalidArgument for a backward pass beyond backward_passes_per_step,
//      before the gradient being reduced is touched;
//   2. a hook after accumulation calls grad_ready(i): the parameters whose
//      reductions start now (i once its last pass arrived; a whole group once
//      every member is ready). The binding calls submit(j, gradient of j) for
//      each (an unused parameter's gradient: zeros, the binding's to make);
//   3. synchronize (the binding's step): take_unsubmitted() hands out the
//      rest (a group whole), the binding submits them, then synchronize()
//      waits for every reduction and writes each result into the view given
//      to submit(). A parameter the binding reduces itself (Python's sparse
//      gradients) is released with finish_external(j) instead.
// Semantics: op kAverage is a sum times gradient_predivide_factor / (ranks of
// the set) (each gradient is first scaled by 1 / factor), so a rank that
// joined counts as zeros, as Horovod's; kSum is the sum. fp16 reduces a
// float16 copy of a float32/float64 gradient; 2bit/1bit allgather each rank's
// codes (gradient plus residual) and every rank sums them in rank order
// (pushpull/compression.h). A rank outside the process set (or alone, with
// reduce_alone false) reduces nothing: active() is false, and its binding
// steps on local gradients (times local_scale()).
//
// Ownership: the communicator is the caller's and must outlive the reducer
// (or, given as a function, every call of it).
// A view given to submit() must stay alive and unchanged until synchronize()
// (or the destructor) returns; the reducer owns its fp16 copies and codes.
// The destructor waits (bounded by the communicator's wait_timeout) for
// reductions in flight. Thread safety: every method may be called from any
// thread (hooks run on autograd's threads); synchronize() holds no lock while
// it waits. Blocking: synchronize() and the destructor only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pushpull/array.h"
#include "pushpull/collective.h"

namespace pushpull::frontend {

// Horovod's Compression.none / fp16; MXNet's 2bit and 1bit codecs.
enum class GradCompression { kNone, kFp16, kTwoBit, kOneBit };

struct ReducerOptions {
  // Front end named in error messages.
  std::string who = "DistributedOptimizer";
  // Backward passes accumulated locally before one reduction (>= 1).
  int backward_passes_per_step = 1;
  // Divide the accumulated gradient by backward_passes_per_step too.
  bool average_aggregated_gradients = false;
  // kAverage or kSum.
  collective::Reduction op = collective::Reduction::kAverage;
  // Reduction names are name_prefix + the parameter's name.
  std::string name_prefix = {};
  GradCompression compression = GradCompression::kNone;
  // 2bit (> 0) / 1bit (finite) threshold.
  float compression_threshold = 0.5f;
  // Distinct ranks of the communicator that reduce; empty: every rank.
  std::vector<int> process_set = {};
  // Horovod's gradient_predivide_factor (> 0; other than 1 with kAverage only).
  double gradient_predivide_factor = 1.0;
  // Horovod's groups: lists of parameter indices whose reductions start
  // together (the engine fuses them); the others go alone. Or, when groups
  // is empty, num_groups > 0 splits the parameters in order into that many.
  std::vector<std::vector<size_t>> groups = {};
  int num_groups = 0;
  // Reduce even when this rank's set has one rank (the libtorch front end
  // does; Horovod's Python one steps locally).
  bool reduce_alone = true;
};

class GradientReducer {
 public:
  // Checks the options (InvalidArgument naming the bad one: passes < 1, op,
  // predivide, a process-set rank out of range or twice, a duplicate name, a
  // group index out of range or in two groups). Collective-free.
  GradientReducer(collective::Communicator& comm, std::vector<std::string> names,
                  ReducerOptions options);
  // The communicator of the moment (Python's process-default session, which
  // an elastic job re-forms): called for every operation; without a process
  // set the ranks are the current communicator's.
  using CommunicatorFn = std::function<collective::Communicator&()>;
  GradientReducer(CommunicatorFn comm, std::vector<std::string> names, ReducerOptions options);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  size_t size() const;
  const std::string& name(size_t i) const;     // the parameter's name
  const std::string& op_name(size_t i) const;  // name_prefix + name
  const ReducerOptions& options() const;
  bool member() const;  // in the process set (or there is none)
  int members() const;  // ranks of the set (every rank without one)
  bool active() const;  // this rank reduces: member, and not alone unless reduce_alone
  // 1 / backward_passes_per_step with average_aggregated_gradients, else 1:
  // what an inactive rank's binding multiplies its gradients by.
  double local_scale() const;
  // The group of parameter i (-1: alone).
  int group_of(size_t i) const;

  void before_accumulate(size_t i) const;
  std::vector<size_t> grad_ready(size_t i);
  std::vector<size_t> take_unsubmitted();
  // Starts parameter i's reduction of `grad` (CPU, contiguous, float32/64,
  // float16 or bfloat16), scaled in place when a factor applies (none:
  // fp16 and 2bit/1bit work on copies). On an error nothing started and i
  // is handed out again by take_unsubmitted().
  void submit(size_t i, ArrayView grad);
  // The binding could not submit i (a bad gradient): take_unsubmitted()
  // hands it out again. Nothing when i is not claimed or already submitted.
  void hand_back(size_t i);
  void finish_external(size_t i);
  // Waits for every reduction submitted so far (all of them, even after a
  // failure), writes the results into their views and ends the round;
  // rethrows the first error (then the views' contents are undefined).
  // Returns the seconds it waited.
  double synchronize();
  // Ends the round without waiting (an elastic reset: the old session failed
  // its operations): every parameter starts afresh; reductions that may
  // still run count in in_flight() until they are over.
  void abandon_round();
  // True when a reduction started by this reducer may still write into a
  // view or read it (after synchronize() failed with Timeout, say): the
  // binding keeps the views' memory alive until this is false.
  bool in_flight() const;
  // True between a claim (grad_ready / take_unsubmitted) and the end of the
  // round for any parameter.
  bool pending() const;

  struct Stats {
    int64_t hook_reductions = 0;  // started from grad_ready
    int64_t sync_reductions = 0;  // started from take_unsubmitted
    double wait_seconds = 0;      // spent in synchronize()
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pushpull::frontend
