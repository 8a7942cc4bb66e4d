// SPDX-License-Identifier: Apache-2.0
#include "sparse_gradients.h"

#include <exception>

#include "pushpull/log.h"
#include "tensor_collectives.h"

namespace pushpull::torch::detail {
namespace {

at::Tensor tensor_of(const Array& a) {
  const auto dims = a.shape().dims();
  const auto type = a.dtype() == DType::kInt64      ? at::kLong
                    : a.dtype() == DType::kFloat64  ? at::kDouble
                    : a.dtype() == DType::kFloat16  ? at::kHalf
                    : a.dtype() == DType::kBFloat16 ? at::kBFloat16
                                                    : at::kFloat;
  std::vector<int64_t> sizes(dims.begin(), dims.end());
  if (a.numel() == 0) return at::empty(sizes, at::TensorOptions().dtype(type));
  // The Array is freed after this call: a copy outlives it.
  return at::from_blob(a.data(), sizes, at::TensorOptions().dtype(type)).clone();
}

}  // namespace

std::string sparse_grad_problem(const at::Tensor& g, const at::Tensor& param) {
  if (!g.device().is_cpu()) return "is not on the CPU (the collectives reduce host memory)";
  const auto t = g.scalar_type();
  if (t != at::kFloat && t != at::kDouble && t != at::kHalf && t != at::kBFloat16)
    return "has a dtype the collectives do not reduce (use float32/64, float16 or bfloat16)";
  if (g.sizes() != param.sizes() || t != param.scalar_type())
    return "but the parameter is " + describe(param);
  if (g.sparse_dim() < 1 || g.dense_dim() + 1 > Shape::kMaxDims)
    return "has a sparse layout the allgathers cannot carry";
  return {};
}

SparseGather start_sparse_gather(collective::Communicator& comm, const std::string& name,
                                 const at::Tensor& grad, const std::vector<int>& members) {
  SparseGather s;
  s.sizes.assign(grad.sizes().begin(), grad.sizes().end());
  s.sparse_dim = grad.sparse_dim();
  s.indices = grad._indices().t().contiguous();
  s.values = grad._values().contiguous();
  s.indices_handle = comm.allgather_async(name + ".indices", view_of(s.indices), members);
  try {
    s.values_handle = comm.allgather_async(name + ".values", view_of(s.values), members);
  } catch (...) {
    wait_sparse_gather(comm, s);  // the indices' allgather reads s.indices
    throw;
  }
  return s;
}

at::Tensor finish_sparse_gather(collective::Communicator& comm, SparseGather& s, double scale,
                                std::exception_ptr& error) {
  Array parts[2];
  bool ok = true;
  for (int k = 0; k < 2; ++k) {
    try {
      parts[k] = comm.take_output(k == 0 ? s.indices_handle : s.values_handle);
    } catch (...) {
      ok = false;
      if (!error) error = std::current_exception();
    }
  }
  if (!ok) return {};
  at::Tensor v = tensor_of(parts[1]);
  if (scale != 1.0) v.mul_(scale);
  // Built without checks of its own (they would sort): coalesce() sums duplicates.
  return at::_sparse_coo_tensor_unsafe(tensor_of(parts[0]).t(), v, s.sizes).coalesce();
}

double sparse_scale(const frontend::ReducerOptions& o, int members) {
  double scale = o.op == collective::Reduction::kAverage ? 1.0 / members : 1.0;
  if (o.average_aggregated_gradients && o.backward_passes_per_step > 1)
    scale /= o.backward_passes_per_step;
  return scale;
}

bool in_flight(const collective::Communicator& comm, const SparseGather& s) {
  return (s.indices_handle.valid() && !comm.poll(s.indices_handle)) ||
         (s.values_handle.valid() && !comm.poll(s.values_handle));
}

void wait_sparse_gather(collective::Communicator& comm, const SparseGather& s) {
  for (const auto* h : {&s.indices_handle, &s.values_handle}) {
    if (!h->valid()) continue;
    try {
      comm.wait(*h);
    } catch (const std::exception& e) {
      PP_WARN("DistributedOptimizer: a sparse gradient's allgather failed: {}", e.what());
    }
  }
}

at::Tensor empty_sparse_like(const at::Tensor& param, int64_t sparse_dim) {
  return at::zeros_like(param).to_sparse(sparse_dim);
}

}  // namespace pushpull::torch::detail
