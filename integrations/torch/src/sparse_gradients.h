// SPDX-License-Identifier: Apache-2.0
// Private helpers of distributed_optimizer.cpp for sparse COO gradients (an
// nn::Embedding with sparse(true)), as Horovod's sparse allreduce and
// pushpull.torch's sparse.py: every rank's indices (transposed, nnz x
// sparse_dim, because allgather concatenates along the first dimension) and
// values are allgathered, and the uncoalesced concatenation, coalesced (which
// sums duplicate indices), is the sum over the ranks.
//
// Ownership: a SparseGather owns the tensors its allgathers read; it must stay
// alive until both handles completed (wait_sparse_gather). Thread safety: none
// of its own; the caller serialises access (the optimizer's mutex).
#pragma once

#include <ATen/ATen.h>

#include <exception>
#include <string>
#include <vector>

#include "pushpull/collective.h"
#include "pushpull/frontend/gradient_reducer.h"

namespace pushpull::torch::detail {

struct SparseGather {
  at::Tensor indices, values;  // this rank's, what the allgathers read
  collective::Handle indices_handle, values_handle;
  std::vector<int64_t> sizes;  // the gradient's (dense) sizes
  int64_t sparse_dim = 0;
  bool started() const { return indices_handle.valid() || values_handle.valid(); }
};

// "" when `g` is a sparse COO gradient this path can send for `param`.
std::string sparse_grad_problem(const at::Tensor& g, const at::Tensor& param);

// Starts the two allgathers, `<name>.indices` and `<name>.values`, among
// `members` (empty: every rank). Throws the communicator's InvalidArgument.
SparseGather start_sparse_gather(collective::Communicator& comm, const std::string& name,
                                 const at::Tensor& grad, const std::vector<int>& members);

// Waits for both allgathers (each bounded by the communicator's
// wait_timeout; both are waited for even when the first fails) and returns
// the coalesced sum over the ranks times `scale`; on a failure, an undefined
// tensor, and `error` keeps the first error.
at::Tensor finish_sparse_gather(collective::Communicator& comm, SparseGather& gather, double scale,
                                std::exception_ptr& error);

// What multiplies the sum of the ranks' sparse gradients: 1 / (the set's
// members) for kAverage, and 1 / backward_passes_per_step with
// average_aggregated_gradients (the reducer's dense scaling).
double sparse_scale(const frontend::ReducerOptions& options, int members);

// True while an allgather of `gather` may still read its tensors.
bool in_flight(const collective::Communicator& comm, const SparseGather& gather);

// Waits for whatever of `gather` is still in flight, ignoring its errors
// (the destructor's and a failed synchronize()'s clean-up).
void wait_sparse_gather(collective::Communicator& comm, const SparseGather& gather);

// An empty sparse gradient shaped like `param` with `sparse_dim` sparse
// dimensions: what a rank contributes for a parameter it did not use.
at::Tensor empty_sparse_like(const at::Tensor& param, int64_t sparse_dim);

}  // namespace pushpull::torch::detail
