// SPDX-License-Identifier: Apache-2.0
// Private helpers of ProcessGroupPushpull: which torch tensors pushpull's
// engine can reduce, how they are refused (a RuntimeError in Python naming
// the operation, the tensor and what to do), and tensors as ArrayViews.
//
// Views are flat (numel elements, or one row of them for allgathers): c10d
// collectives match tensors by element count, and a flat view has no
// dimension limit.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "pushpull/array.h"
#include "pushpull/dtype.h"
#include "tensor_dtype.h"

namespace pushpull::torch_pg::detail {

// The refusal of an argument: std::runtime_error, so torch and pybind11 raise
// it as RuntimeError.
class Unsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using pushpull::torch::detail::describe;
// The engine's dtype of a scalar type (nullopt: none).
inline std::optional<DType> engine_dtype(at::ScalarType t) {
  return pushpull::torch::detail::dtype_of(t);
}

// Throws Unsupported unless the engine can work on `t` (after .contiguous()).
// `what` names the tensor, e.g. "allreduce: tensor 0".
inline void check_tensor(const at::Tensor& t, const std::string& what) {
  const std::string where = "pushpull ProcessGroup: " + what + " (" + describe(t) + ")";
  if (!t.defined()) throw Unsupported(where + " is undefined");
  if (t.is_sparse() || t.layout() != at::kStrided) {
    throw Unsupported(where +
                      " is not a dense tensor; sparse tensors are not supported (call "
                      ".to_dense(), or use the gloo backend for sparse collectives)");
  }
  if (!t.device().is_cpu()) {
    throw Unsupported(where +
                      " is not on the CPU; pushpull reduces host memory only (call .cpu(), or "
                      "use the nccl backend for CUDA tensors)");
  }
  if (!engine_dtype(t.scalar_type())) {
    throw Unsupported(where +
                      " has a dtype pushpull does not reduce; supported: float32, float64, "
                      "float16, bfloat16, int32, int64, int8, uint8");
  }
}

// Exactly one tensor per call: c10d's lists hold one tensor per device, and
// pushpull reduces one CPU tensor per rank.
inline void check_single(const std::vector<at::Tensor>& tensors, const std::string& op) {
  if (tensors.size() != 1) {
    throw Unsupported("pushpull ProcessGroup: " + op + " takes exactly one tensor per rank, got " +
                      std::to_string(tensors.size()) +
                      " (lists of several tensors per process are for several GPUs)");
  }
}

inline void check_same(const at::Tensor& t, const at::Tensor& ref, const std::string& what) {
  if (t.scalar_type() != ref.scalar_type() || t.numel() != ref.numel()) {
    throw Unsupported("pushpull ProcessGroup: " + what + " (" + describe(t) +
                      ") must have the dtype and number of elements of the input (" +
                      describe(ref) + ")");
  }
}

// A flat view of a contiguous CPU tensor of an engine dtype.
inline ArrayView flat_view(const at::Tensor& t) {
  return ArrayView(t.data_ptr(), *engine_dtype(t.scalar_type()), Shape{t.numel()}, Device::cpu());
}

// A one-row view (1, numel) for allgathers: the engine then checks that
// every rank passed the same number of elements (all but the first
// dimension must agree) instead of concatenating different sizes.
inline ArrayView row_view(const at::Tensor& t) {
  return ArrayView(t.data_ptr(), *engine_dtype(t.scalar_type()), Shape{1, t.numel()},
                   Device::cpu());
}

// A tensor over `data` (not owned) with `like`'s dtype and `numel` elements.
inline at::Tensor wrap(void* data, int64_t numel, const at::Tensor& like) {
  return at::from_blob(data, {numel}, at::TensorOptions().dtype(like.scalar_type()));
}

}  // namespace pushpull::torch_pg::detail
