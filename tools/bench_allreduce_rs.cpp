// SPDX-License-Identifier: Apache-2.0
#include "bench_allreduce_rs.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "compress/gathered.h"

namespace pushpull::cli {

RsCodes::RsCodes(const compress::Settings& s, size_t count, int n, int rank)
    : first_(s), second_(s), count_(count), n_(n), rank_(rank) {
  // Chunks of whole 32-value words, so each chunk's codes are whole bytes of
  // the encoding of the whole array (16 values a word for 2bit, 32 for 1bit).
  q_ = (count + static_cast<size_t>(n) * 32 - 1) / (static_cast<size_t>(n) * 32) * 32;
  mine_.resize(bytes_at(count));
  all_.resize(bytes_at(count));
  theirs_.resize(static_cast<size_t>(n) * bytes_at(len(rank)));
  sum_.resize(len(rank));
}

size_t RsCodes::begin(int j) const {
  return std::min(count_, static_cast<size_t>(j) * q_);
}
size_t RsCodes::len(int j) const {
  return std::min(count_, begin(j) + q_) - begin(j);
}

void RsCodes::run(collective::AlgoContext& ctx, uint64_t& op_id, const float* grad, float* out) {
  transport::Transport& t = ctx.transport;
  first_.encode_raw(0, 0, count_, 0, grad, count_, mine_.data());
  // All-to-all: chunk j's codes to rank j; rank r's of this rank's chunk in.
  ctx.op_id = ++op_id;
  const size_t part = bytes_at(len(rank_));
  std::vector<transport::Request> reqs;
  for (int p = 0; p < n_; ++p) {
    if (p == rank_) {
      if (part) std::memcpy(theirs_.data() + p * part, mine_.data() + bytes_at(begin(p)), part);
      continue;
    }
    const uint64_t tag = transport::op_tag(ctx.op_id, 0);
    if (len(p))
      reqs.push_back(
          transport::isend(t, p, tag, mine_.data() + bytes_at(begin(p)), bytes_at(len(p))));
    if (part) reqs.push_back(transport::irecv(t, p, tag, theirs_.data() + p * part, part));
  }
  for (auto& r : reqs)
    r.wait(ctx.deadline(), fmt::format("compressed reduce-scatter (op {})", ctx.op_id));
  // The owner's sum of its chunk, re-encoded with its own residual in place.
  std::vector<const std::byte*> parts;
  for (int p = 0; p < n_; ++p)
    parts.push_back(theirs_.data() + p * part);
  compress::sum_in_rank_order(first_.codec(), parts, len(rank_), sum_.data());
  if (part)
    second_.encode_raw(0, 0, len(rank_), 0, sum_.data(), len(rank_),
                       all_.data() + bytes_at(begin(rank_)));
  // Allgather of the re-encoded chunks, then every rank decodes them all.
  ctx.op_id = ++op_id;
  std::vector<transport::Block> blocks;
  for (int j = 0; j < n_; ++j)
    blocks.push_back({bytes_at(begin(j)), bytes_at(len(j))});
  collective::ring(ctx, all_.data(), DType::kUInt8, ReduceOp::kSum, blocks, false, true);
  first_.codec().decompress(all_.data(), out, count_);
}

}  // namespace pushpull::cli
