// SPDX-License-Identifier: Apache-2.0
// Private helpers of distributed_optimizer.cpp for sparse COO gradients (an
// nn::Embedding with sparse(true)), as Horovod's sparse allreduce and
// pushpull.torch's sparse.py: every rank's nonzeros are allgathered, and the
// uncoalesced concatenation, coalesced (which sums duplicate indices), is the
// sum over the ranks.
//
// One allgather per gradient, under the name a dense gradient's allreduce has
// (reducer->op_name(i)): each nonzero is one row of bytes, its sparse_dim
// int64 indices then its values (allgather concatenates along the first
// dimension). A rank that contributes dense zeros where another contributes a
// sparse gradient then meets it under one name, and the negotiation fails
// both at once ("submitted differently") instead of each waiting for an op
// the other never submits until the stall timeout; explain_mismatch() turns
// that error into one naming the parameter.
//
// Ownership: a SparseGather owns the rows its allgather reads; it must stay
// alive until the handle completed (wait_sparse_gather). Thread safety: none
// of its own; the caller serialises access (the optimizer's mutex).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "pushpull/collective.h"
#include "pushpull/frontend/gradient_reducer.h"

namespace pushpull::torch::detail {

struct SparseGather {
  at::Tensor
      rows;  // this rank's packed nonzeros (uint8, nnz x row bytes): what the allgather reads
  collective::Handle handle;
  std::vector<int64_t> sizes;  // the gradient's (dense) sizes
  int64_t sparse_dim = 0;
  at::ScalarType dtype = at::kFloat;  // the values'
  bool started() const { return handle.valid(); }
};

// "" when `g` is a sparse COO gradient this path can send for `param`.
std::string sparse_grad_problem(const at::Tensor& g, const at::Tensor& param);

// Starts the allgather of `grad`'s packed nonzeros under `name` among
// `members` (empty: every rank). Throws the communicator's InvalidArgument.
SparseGather start_sparse_gather(collective::Communicator& comm, const std::string& name,
                                 const at::Tensor& grad, const std::vector<int>& members);

// Waits for the allgather (bounded by the communicator's wait_timeout) and
// returns the coalesced sum over the ranks times `scale`; on a failure, an
// undefined tensor, and `error` keeps the first error.
at::Tensor finish_sparse_gather(collective::Communicator& comm, SparseGather& gather, double scale,
                                std::exception_ptr& error);

// What multiplies the sum of the ranks' sparse gradients: 1 / (the set's
// members) for kAverage, and 1 / backward_passes_per_step with
// average_aggregated_gradients (the reducer's dense scaling).
double sparse_scale(const frontend::ReducerOptions& options, int members);

// True while the allgather of `gather` may still read its rows.
bool in_flight(const collective::Communicator& comm, const SparseGather& gather);

// Waits for the allgather of `gather` if still in flight, ignoring its error
// (the destructor's and a failed synchronize()'s clean-up).
void wait_sparse_gather(collective::Communicator& comm, const SparseGather& gather);

// An empty sparse gradient shaped like `param` with `sparse_dim` sparse
// dimensions: what a rank contributes for a parameter it did not use.
at::Tensor empty_sparse_like(const at::Tensor& param, int64_t sparse_dim);

// The sparse_dim every rank knows each reduced parameter (`reduced`, by
// name) to have before its first step: 1 (an embedding's) for the names in
// `declared`, else 0. Throws InvalidArgument for a declared name that is not
// in `named` (a name of named_parameters the optimizer does not reduce is
// fine: nothing to do).
std::vector<int64_t> declared_sparse_dims(
    const std::vector<std::string>& reduced, const std::vector<std::string>& declared,
    const std::vector<std::pair<std::string, at::Tensor>>& named);

// How this rank chose a parameter's kind in a step without knowing what the
// others do: no gradient (dense zeros), or a sparse one while no rank could
// know the parameter is sparse.
enum class Guess : uint8_t { kNone, kDenseZeros, kSparse };

// `error`, or, when it is the negotiation's "submitted differently" about
// the reduction of a parameter whose kind this rank guessed, with sparse
// rows on some ranks and another op on others, an
// InvalidArgument naming the parameter and what to do (the cause's text kept).
std::exception_ptr explain_mismatch(std::exception_ptr error, const std::vector<Guess>& guessed,
                                    const frontend::GradientReducer& reducer);

}  // namespace pushpull::torch::detail
