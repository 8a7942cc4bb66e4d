// SPDX-License-Identifier: Apache-2.0
// Private helpers shared by distributed_optimizer.cpp and broadcast.cpp:
// tensors as the collectives' ArrayViews, waiting on several handles, the
// default session's communicator.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "pushpull/collective.h"
#include "pushpull/error.h"
#include "tensor_dtype.h"

namespace pushpull::torch::detail {

using collective::Communicator;
using collective::Handle;

// "" when the collectives can read and write `t` in place through data_ptr
// (after .contiguous() when `need_contiguous` is false).
inline std::string layout_problem(const at::Tensor& t, bool need_contiguous) {
  if (!t.defined()) return "is undefined";
  if (!t.device().is_cpu()) return "is not on the CPU (the collectives reduce host memory)";
  if (t.layout() != at::kStrided) return "is not a dense (strided) tensor";
  if (!dtype_of(t.scalar_type())) {
    return "has a dtype the collectives do not reduce (use float32/64, float16 or bfloat16)";
  }
  if (t.dim() > Shape::kMaxDims) {
    return "has more than " + std::to_string(Shape::kMaxDims) + " dimensions";
  }
  if (need_contiguous && !t.is_contiguous()) return "is not contiguous";
  return {};
}

inline ArrayView view_of(const at::Tensor& t) {
  return ArrayView(t.data_ptr(), *dtype_of(t.scalar_type()),
                   Shape(std::span<const int64_t>(t.sizes().data(), t.sizes().size())),
                   Device::cpu());
}

// Waits for every handle (all of them, even after a failure, so nothing is
// left writing into a tensor), then rethrows the first error.
inline double wait_all(Communicator& comm, const std::vector<Handle>& handles) {
  const auto t0 = std::chrono::steady_clock::now();
  std::exception_ptr first;
  for (const auto& h : handles) {
    if (!h.valid()) continue;
    try {
      comm.wait(h);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline Communicator& default_communicator(const char* what) {
  if (!collective::is_initialized()) {
    throw InvalidArgument(std::string(what) +
                          ": no communicator given and collectives are not initialised; call "
                          "pushpull::collective::init() first or pass a Session's communicator");
  }
  return collective::default_session().communicator();
}

}  // namespace pushpull::torch::detail
