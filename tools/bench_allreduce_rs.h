// SPDX-License-Identifier: Apache-2.0
// `pushpull bench allreduce --compression 2bit_rs,1bit_rs`: the alternative
// to the allgather of codes that dist_sync_allreduce uses
// (compress/gathered.h), timed beside it: BytePS's / 1-bit Adam's compressed
// reduce-scatter then allgather. Each rank encodes its gradient with its own
// residual; chunk j's codes go to rank j (an all-to-all), which decodes and
// sums the n codes of its chunk in rank order, re-encodes the sum with a
// second residual (its own, per chunk), and the re-encoded chunks are
// allgathered round the ring and decoded by every rank. A rank sends
// 2(n-1)/n of the codes instead of (n-1) times them, at the price of a
// second quantisation (the result is one code per value, not the sum of n).
// Benchmark only: nothing in the library runs it.
//
// Ownership: owns both residuals and the buffers. Thread safety: one thread.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "collective/algorithms.h"
#include "compress/compressor.h"

namespace pushpull::cli {

class RsCodes {
 public:
  // `s`: 2bit or 1bit; `count` float32 values per allreduce among n ranks.
  RsCodes(const compress::Settings& s, size_t count, int n, int rank);
  // out = every rank's chunk sums, re-encoded by their owners and decoded.
  // Uses two operation ids (op_id + 1, op_id + 2) and advances op_id by 2.
  void run(collective::AlgoContext& ctx, uint64_t& op_id, const float* grad, float* out);

 private:
  size_t begin(int j) const;  // first value of chunk j (a multiple of 32)
  size_t len(int j) const;
  size_t bytes_at(size_t values) const { return first_.codec().compressed_bytes(values); }

  compress::Compressor first_, second_;  // this rank's residual; its chunk's
  size_t count_, q_;
  int n_, rank_;
  std::vector<std::byte> mine_, theirs_, all_;
  std::vector<float> sum_;
};

}  // namespace pushpull::cli
