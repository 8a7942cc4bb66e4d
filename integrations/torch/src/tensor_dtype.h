// SPDX-License-Identifier: Apache-2.0
// Private helpers shared by the libtorch integration and the torch.distributed
// backend (process_group/): a tensor's engine dtype and a short description of
// a tensor for error messages. Pure functions; thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "pushpull/dtype.h"

namespace pushpull::torch::detail {

inline std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::string s = std::string(c10::toString(t.scalar_type())) + "[";
  for (int64_t i = 0; i < t.dim(); ++i)
    s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "] on " + t.device().str();
}

// The collectives' dtype of a tensor's scalar type; nullopt when they have none.
inline std::optional<DType> dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kDouble:
      return DType::kFloat64;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kInt:
      return DType::kInt32;
    case at::kLong:
      return DType::kInt64;
    case at::kChar:
      return DType::kInt8;
    case at::kByte:
      return DType::kUInt8;
    default:
      return std::nullopt;
  }
}

}  // namespace pushpull::torch::detail
