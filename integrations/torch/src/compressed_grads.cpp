// SPDX-License-Identifier: Apache-2.0
#include "compressed_grads.h"

#include <span>

#include <fmt/format.h>

namespace pushpull::torch::detail {

// fmt's shortest form reads back as the same float (the parser's input is text).
CompressedGrads::CompressedGrads(const char* type, float threshold)
    : codec_({{"type", type}, {"threshold", fmt::format("{}", threshold)}}) {}

at::Tensor CompressedGrads::encode(size_t index, const at::Tensor& g, double scale) {
  // A float32 copy: the gradient itself stays as autograd left it.
  at::Tensor f = g.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  if (scale != 1.0) f.mul_(scale);
  const auto n = static_cast<size_t>(f.numel());
  at::Tensor codes = at::empty({static_cast<int64_t>(codec_.encoded_bytes(n))}, at::kByte);
  codec_.encode(index, f.data_ptr<float>(), n, static_cast<std::byte*>(codes.data_ptr()));
  return codes;
}

at::Tensor CompressedGrads::sum(const Array& gathered, int members, const at::Tensor& like,
                                double scale) const {
  at::Tensor out = at::empty(like.sizes(), at::kFloat);
  const std::span<const std::byte> bytes(static_cast<const std::byte*>(gathered.data()),
                                         gathered.nbytes());
  codec_.sum_gathered(bytes, members, static_cast<size_t>(out.numel()), out.data_ptr<float>());
  if (scale != 1.0) out.mul_(scale);
  return out;
}

}  // namespace pushpull::torch::detail
