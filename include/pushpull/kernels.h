// SPDX-License-Identifier: Apache-2.0
// Element-wise kernels used on every hot path: reductions (dst op= src),
// copies, scaling and dtype conversion.
//
// The loops are written so the compiler vectorises them, and compiled for
// several instruction sets (SSE2, AVX2, AVX-512) with the best one picked at
// load time, so one binary is fast on every x86-64 machine. 16-bit floats are
// widened to float32, combined, and rounded back once (sum in float32).
//
// `n` counts elements. dst and src may be the same pointer but must not
// otherwise overlap. Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "pushpull/dtype.h"

namespace pushpull {

enum class ReduceOp : uint8_t { kSum = 0, kProd = 1, kMin = 2, kMax = 3 };
std::string_view reduce_op_name(ReduceOp op);  // "sum", "prod", "min", "max"
std::optional<ReduceOp> parse_reduce_op(std::string_view name);

// dst[i] = dst[i] op src[i].
void reduce(ReduceOp op, DType dtype, void* dst, const void* src, size_t n);
inline void reduce_sum(DType dtype, void* dst, const void* src, size_t n) {
  reduce(ReduceOp::kSum, dtype, dst, src, n);
}
// dst[i] = a[i] op b[i] (out of place; dst may equal a).
void reduce3(ReduceOp op, DType dtype, void* dst, const void* a, const void* b, size_t n);
// dst[i] *= alpha (integers: rounded toward zero).
void scale(DType dtype, void* dst, double alpha, size_t n);
// memcpy of n elements.
void copy(DType dtype, void* dst, const void* src, size_t n);
// dst (dst_type) = src (src_type), element by element.
void convert(DType dst_type, void* dst, DType src_type, const void* src, size_t n);
// The identity of `op` for `dtype` written into n elements (0 for sum, 1 for
// prod, +max for min, lowest for max).
void fill_identity(ReduceOp op, DType dtype, void* dst, size_t n);

}  // namespace pushpull
