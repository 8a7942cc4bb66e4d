// SPDX-License-Identifier: Apache-2.0
// The scalar definitions of the codecs, one value at a time with
// branches, exactly as two_bit.h and one_bit.h state them. Not used on any
// data path: the tests check the vectorised kernels (compress/kernels.h)
// against them bit for bit, and `pushpull bench codec` times both in the
// same run.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>

namespace pushpull::compress::reference {

void two_bit_encode(const float* grad, float* residual, std::byte* out, size_t n, float threshold);
void two_bit_decode_add(const std::byte* in, float* acc, size_t n, float threshold);
void one_bit_encode(const float* grad, float* residual, std::byte* out, size_t n, float threshold);
void one_bit_decode_add(const std::byte* in, float* acc, size_t n);
// fp16.h's definition with the scalar half conversions of pushpull/dtype.h.
void fp16_encode(const float* grad, float* residual, std::byte* out, size_t n);

}  // namespace pushpull::compress::reference
