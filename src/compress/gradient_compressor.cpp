// SPDX-License-Identifier: Apache-2.0
// The public face of the codecs (include/pushpull/compression.h) over
// compress::Compressor and compress::sum_gathered.
#include "pushpull/compression.h"

#include "compress/compressor.h"
#include "compress/gathered.h"
#include "pushpull/error.h"

namespace pushpull {

struct GradientCompressor::Impl {
  explicit Impl(compress::Settings s) : c(s) {}
  compress::Compressor c;
};

GradientCompressor::GradientCompressor(const std::map<std::string, std::string>& params) {
  const compress::Settings s = compress::parse_settings(params);
  if (!s.enabled())
    throw InvalidArgument("GradientCompressor: compression type 'none' compresses nothing");
  impl_ = std::make_unique<Impl>(s);
}

GradientCompressor::~GradientCompressor() = default;

std::string GradientCompressor::describe() const {
  return impl_->c.settings().to_string();
}

bool GradientCompressor::gathers() const {
  return impl_->c.settings().quantises();
}

size_t GradientCompressor::encoded_bytes(size_t n) const {
  return impl_->c.encoded_bytes(n);
}

void GradientCompressor::encode(uint64_t id, const float* grad, size_t n, std::byte* out) {
  if (!gathers())
    throw InvalidArgument("GradientCompressor::encode: " + describe() +
                          " values are summed by an allreduce; use encode_fp16");
  impl_->c.encode(id, 0, n, 0, grad, n, out);
}

void GradientCompressor::encode_fp16(uint64_t id, const float* grad, size_t n, uint16_t* out) {
  if (gathers())
    throw InvalidArgument("GradientCompressor::encode_fp16: the compression is " + describe());
  impl_->c.encode_raw(id, 0, n, 0, grad, n, reinterpret_cast<std::byte*>(out));
}

void GradientCompressor::sum_gathered(std::span<const std::byte> gathered, int ranks, size_t n,
                                      float* out) const {
  if (!gathers())
    throw InvalidArgument("GradientCompressor::sum_gathered: " + describe() +
                          " values are summed by an allreduce");
  compress::sum_gathered(impl_->c.settings(), gathered, ranks, n, out).raise();
}

std::vector<float> GradientCompressor::residual(uint64_t id) const {
  return impl_->c.residual(id, 0);
}

}  // namespace pushpull
