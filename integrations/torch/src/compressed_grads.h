// SPDX-License-Identifier: Apache-2.0
// The DistributedOptimizer's 1bit/2bit gradients (Compression::kTwoBit /
// kOneBit): each rank encodes its gradient plus its residual (error
// feedback, one residual per parameter and rank), the codes are allgathered
// under the parameter's name, and every rank sums all of them in rank order
// (pushpull/compression.h), so every rank gets the same averaged gradient.
//
// Ownership: owns the residuals. Thread safety: encode() of one parameter at
// a time (the optimizer's lock); sum() from any thread.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>

#include "pushpull/array.h"
#include "pushpull/compression.h"

namespace pushpull::torch::detail {

class CompressedGrads {
 public:
  // type: "2bit" or "1bit"; InvalidArgument for a bad threshold (the
  // stores' parser: 2bit > 0, 1bit finite).
  CompressedGrads(const char* type, float threshold);
  // The wire form of `g` * scale (in float32) with the residual of parameter
  // `index`: a uint8 tensor of encoded_bytes(numel) to allgather.
  at::Tensor encode(size_t index, const at::Tensor& g, double scale);
  // The rank-order sum of the `members` wire forms in `gathered`, times
  // scale, as a float32 tensor shaped like `like`. Throws when a rank used
  // other settings (InvalidArgument) or the bytes are malformed.
  at::Tensor sum(const Array& gathered, int members, const at::Tensor& like, double scale) const;

 private:
  mutable GradientCompressor codec_;
};

}  // namespace pushpull::torch::detail
