// SPDX-License-Identifier: Apache-2.0
// Gradient compression for programs that drive the collectives themselves
// (the libtorch DistributedOptimizer, the Python Horovod-style optimizer):
// the codecs of the KVStores' set_gradient_compression (2bit, 1bit, fp16,
// docs/kvstore.md "Gradient compression"), each with an error-feedback
// residual per tensor, and the sum of every rank's codes after an
// allgather.
//
// 1bit and 2bit codes cannot be added on the way round a ring, so:
//   1. each rank encodes its gradient (plus its residual) with encode();
//   2. the encoded bytes are allgathered (Communicator::allgather_async of a
//      uint8 array of encoded_bytes(n));
//   3. each rank sums them with sum_gathered(): every rank decodes every
//      rank's codes and adds them in rank order, so all ranks get the same
//      bits (docs/collectives.md "Gradient compression").
// fp16 values can be added on the way: encode_fp16() fills a float16 array
// for an allreduce.
//
// Every rank must use the same settings: sum_gathered reads each rank's
// 8-byte header and fails with InvalidArgument naming the rank and both
// settings otherwise (a ProtocolError for bytes that are no wire form).
//
// Ownership: owns the residuals (a float32 array per tensor id, zero at the
// first encode). Thread safety: every method may be called from any thread;
// encodes of one id are serialised.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace pushpull {

class GradientCompressor {
 public:
  // MXNet-style parameters, {"type": "1bit", "threshold": "0.5"}, checked by
  // the one parser every store uses (InvalidArgument); "none" is refused too.
  explicit GradientCompressor(const std::map<std::string, std::string>& params);
  ~GradientCompressor();
  GradientCompressor(const GradientCompressor&) = delete;
  GradientCompressor& operator=(const GradientCompressor&) = delete;

  // "2bit(threshold=0.5)", "fp16", ...
  std::string describe() const;
  // 1bit/2bit: the codes travel by allgather (encode + sum_gathered); fp16:
  // by allreduce of float16 (encode_fp16).
  bool gathers() const;

  // Bytes encode() writes for n values (an 8-byte header included).
  size_t encoded_bytes(size_t n) const;
  // 1bit/2bit: residual(id) += grad; writes the wire form of n values to
  // `out` (encoded_bytes(n) bytes); the residual keeps what was not sent.
  // InvalidArgument when n differs from earlier encodes of the id, or for fp16.
  void encode(uint64_t id, const float* grad, size_t n, std::byte* out);
  // fp16: the same into n IEEE float16 values (no header), for an allreduce.
  void encode_fp16(uint64_t id, const float* grad, size_t n, uint16_t* out);
  // out[0, n) = the rank-order sum of the `ranks` wire forms of n values
  // back to back in `gathered` (an allgather's output). Throws as above;
  // `out` is untouched on an error.
  void sum_gathered(std::span<const std::byte> gathered, int ranks, size_t n, float* out) const;
  // A copy of the residual of `id` (empty before its first encode).
  std::vector<float> residual(uint64_t id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pushpull
