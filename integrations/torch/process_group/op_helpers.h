// SPDX-License-Identifier: Apache-2.0
// Private helpers of ProcessGroupPushpull's operations (process_group_*.cpp):
// c10d reductions as the engine's, the engine name part of a dtype, the
// contiguous buffer the engine works on and copies of results back into
// the caller's tensors. Stateless; no thread-safety concerns.
#pragma once

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>

#include "pushpull/array.h"
#include "pushpull/collective.h"
#include "pushpull/error.h"
#include "tensors.h"

namespace pushpull::torch_pg::detail {

inline collective::Reduction reduction_of(const c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return collective::Reduction::kSum;
    case c10d::ReduceOp::AVG:
      return collective::Reduction::kAverage;
    case c10d::ReduceOp::MIN:
      return collective::Reduction::kMin;
    case c10d::ReduceOp::MAX:
      return collective::Reduction::kMax;
    case c10d::ReduceOp::PRODUCT:
      return collective::Reduction::kProduct;
    default:
      throw Unsupported(fmt::format(
          "pushpull ProcessGroup: {}: reduce op {} is not supported; pushpull reduces with SUM, "
          "AVG, MIN, MAX and PRODUCT (no bitwise ops, no PREMUL_SUM)",
          what, static_cast<int>(op.op_)));
  }
}

inline std::string dtype_str(const at::Tensor& t) {
  return std::string(dtype_name(*detail::engine_dtype(t.scalar_type())));
}

// The tensor the engine works on: `t` itself when contiguous, else a copy.
inline at::Tensor contiguous(const at::Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

// Copies `from` (contiguous, same dtype and numel) into `to` unless they are one tensor.
inline void copy_back(const at::Tensor& to, const at::Tensor& from) {
  if (to.data_ptr() != from.data_ptr()) to.copy_(from.view(to.sizes()));
}

// Copies an engine result (numel elements of `like`'s dtype) into `to`.
inline void copy_result(const Array& a, const at::Tensor& to, int64_t offset_elements = 0) {
  const auto item = static_cast<int64_t>(dtype_size(a.dtype()));
  auto* base = static_cast<char*>(a.data()) + offset_elements * item;
  to.copy_(detail::wrap(base, to.numel(), to).view(to.sizes()));
}

// An allgather's result: `ranks` rows of `n` elements (the engine checked
// that every rank passed n).
inline const Array& check_gathered(const Array& all, int64_t n, int64_t ranks) {
  if (all.numel() != n * ranks) {
    throw Internal(fmt::format("pushpull ProcessGroup: allgather returned {} elements, not {} x {}",
                               all.numel(), ranks, n));
  }
  return all;
}

inline void check_root(int64_t root, int size, const char* what) {
  if (root < 0 || root >= size) {
    throw Unsupported(fmt::format("pushpull ProcessGroup: {}: root rank {} is not in 0..{}", what,
                                  root, size - 1));
  }
}

}  // namespace pushpull::torch_pg::detail
