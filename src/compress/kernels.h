// SPDX-License-Identifier: Apache-2.0
// The codecs' inner loops (2bit, 1bit, fp16's encoder), written without per-element
// branches so the compiler vectorises them, and compiled for several
// instruction sets (SSE2, AVX2, AVX-512; picked at load time, as
// base/kernels.cpp does). Each produces bit-for-bit what the scalar
// definitions in two_bit.h / one_bit.h say (tests/compress/codec_kernels_test.cpp
// checks against compress/reference.h): same codes, same residuals, same
// float operations in the same order.
//
// Encoders are fused with the error-feedback update (one pass over grad and
// residual); decoders either add into an accumulator (a server summing
// pushes) or write (a worker's pull). `out`/`in` need no alignment; `n`
// counts values; the last word's unused bits are written 0 and ignored when
// read. The caller has checked that the encoded bytes are there.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>

namespace pushpull::compress::kernels {

void two_bit_encode(const float* grad, float* residual, std::byte* out, size_t n, float threshold);
void two_bit_decode_add(const std::byte* in, float* acc, size_t n, float threshold);
// out[i] = 0 + decoded value i (the same bits as decode_add into zeros).
void two_bit_decode(const std::byte* in, float* out, size_t n, float threshold);

void one_bit_encode(const float* grad, float* residual, std::byte* out, size_t n, float threshold);
void one_bit_decode_add(const std::byte* in, float* acc, size_t n);
void one_bit_decode(const std::byte* in, float* out, size_t n);

// fp16 (fp16.h): a block at a time through the F16C bulk converters of
// pushpull/dtype.h, the clamp and residual loops vectorised around them.
void fp16_encode(const float* grad, float* residual, std::byte* out, size_t n);

// Encoders that also leave in `values` (their input) what the encoding
// decodes to, bit for bit what encode then decode would write, in one pass:
// a server encoding a round's value for its pulls.
void two_bit_encode_keep(float* values, float* residual, std::byte* out, size_t n, float threshold);
void one_bit_encode_keep(float* values, float* residual, std::byte* out, size_t n, float threshold);
void fp16_encode_keep(float* values, float* residual, std::byte* out, size_t n);

}  // namespace pushpull::compress::kernels
