// SPDX-License-Identifier: Apache-2.0
// Test helpers: ranks as threads over an InProcessFabric, and deterministic
// inputs with exactly representable reductions in every dtype.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "pushpull/array.h"
#include "pushpull/kernels.h"
#include "transport/inproc/inprocess_transport.h"

namespace pushpull::collective::testing {

using transport::InProcessFabric;
using transport::Transport;

// Runs fn(r) for r in [0, n) on n threads; once all ended, rethrows the
// first exception any of them threw.
inline void on_threads(int n, const std::function<void(int)>& fn) {
  std::exception_ptr first;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  if (first) std::rethrow_exception(first);
}

// Runs fn(rank, transport) on a thread per transport of `eps` (rank = index).
inline void run_ranks(std::vector<std::unique_ptr<Transport>>& eps,
                      const std::function<void(int, Transport&)>& fn) {
  on_threads(static_cast<int>(eps.size()), [&](int r) { fn(r, *eps[static_cast<size_t>(r)]); });
}

// Runs fn(rank, transport) on n threads over a fresh InProcessFabric.
inline void run_ranks(int n, const std::function<void(int, Transport&)>& fn) {
  InProcessFabric fabric(n);
  std::vector<std::unique_ptr<Transport>> eps;
  for (int r = 0; r < n; ++r)
    eps.push_back(fabric.endpoint(r));
  run_ranks(eps, fn);
}

// Element i of rank r's input for `op` and `dtype`: small values whose
// reduction over up to 8 ranks is exact in every dtype.
inline double input_value(ReduceOp op, DType dtype, int r, int64_t i) {
  uint64_t h = static_cast<uint64_t>(i) * 2654435761u + static_cast<uint64_t>(r) * 40503u + 7;
  h ^= h >> 13;
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<double>(h % 4);
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return dtype == DType::kUInt8 ? static_cast<double>(h % 7) : static_cast<double>(h % 7) - 3;
    case ReduceOp::kProd:
      if (dtype == DType::kUInt8) return static_cast<double>(h % 2);
      if (dtype == DType::kInt8) return h % 2 ? -1.0 : 1.0;
      return static_cast<double>(1 + h % 2);
  }
  return 0;
}

inline double combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kProd:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return 0;
}

inline double reference(ReduceOp op, DType dtype, int n, int64_t i) {
  double acc = input_value(op, dtype, 0, i);
  for (int r = 1; r < n; ++r)
    acc = combine(op, acc, input_value(op, dtype, r, i));
  return acc;
}

inline Array make_input(ReduceOp op, DType dtype, int r, int64_t count) {
  Array a(Shape{count}, dtype);
  for (int64_t i = 0; i < count; ++i)
    set_element(a, i, input_value(op, dtype, r, i));
  return a;
}

}  // namespace pushpull::collective::testing
