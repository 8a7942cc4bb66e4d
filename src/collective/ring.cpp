// SPDX-License-Identifier: Apache-2.0
// Ring reduce-scatter / allgather / allreduce, pipelined in segments.
//
// Step t of the reduce-scatter sends block (r-t-1) to the right neighbour and
// receives block (r-t-2) from the left one, reducing it into place, so after
// n-1 steps rank r holds the full reduction of block r. Allgather step s sends
// block (r-s) and receives block (r-s-1) straight into place. Every block is
// cut into the same number of segments; segment k of step t+1 only needs
// segment k of step t, so as soon as one segment has been received (and
// reduced) it is forwarded, while later segments are still on the wire: the
// schedule (schedule.h) says just that, and the transport's executor keeps
// several receives in flight, so sending, receiving and reducing overlap.
#include <algorithm>

#include <fmt/format.h>

#include "collective/algorithms.h"
#include "transport/host_collectives.h"

namespace pushpull::collective {

using transport::Block;
using transport::even_blocks;
using transport::HostCollectives;
using transport::op_tag;
using transport::Schedule;

namespace {

constexpr size_t kMinPipelineBytes = 64 << 10;  // below: one segment per block

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

}  // namespace

void ring(AlgoContext& ctx, void* base_ptr, DType dtype, ReduceOp op,
          const std::vector<Block>& blocks, bool reduce_scatter, bool allgather) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1) return;
  const size_t esize = dtype_size(dtype);
  char* base = static_cast<char*>(base_ptr);
  size_t max_count = 0;
  for (const auto& b : blocks)
    max_count = std::max(max_count, b.count);
  const size_t max_bytes = max_count * esize;
  const size_t seg_bytes = std::max<uint64_t>(ctx.ring_segment_bytes, esize);
  size_t nseg = std::max<size_t>(1, (max_bytes + seg_bytes - 1) / seg_bytes);
  if (nseg == 1 && max_bytes >= 2 * kMinPipelineBytes) nseg = 2;

  const int rs_steps = reduce_scatter ? n - 1 : 0;
  const int steps = rs_steps + (allgather ? n - 1 : 0);
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  auto send_block = [&](int t) {
    return t < rs_steps ? mod(r - t - 1, n) : mod(r - (t - rs_steps), n);
  };
  auto recv_block = [&](int t) {
    return t < rs_steps ? mod(r - t - 2, n) : mod(r - (t - rs_steps) - 1, n);
  };
  // Segment k of a block: elements [count*k/nseg, count*(k+1)/nseg).
  auto seg = [&](int blk, size_t k) {
    const Block& b = blocks[static_cast<size_t>(blk)];
    size_t lo = b.count * k / nseg, hi = b.count * (k + 1) / nseg;
    return Block{b.offset + lo, hi - lo};
  };

  const size_t units = static_cast<size_t>(steps) * nseg;
  auto tag = [&](size_t unit) { return op_tag(ctx.op_id, static_cast<uint32_t>(unit)); };
  Schedule s = schedule(ctx, fmt::format("ring (op {})", ctx.op_id), dtype, op);
  // Messages are the blocks' segments; the decision by block size is the
  // same on every rank.
  s.message_bytes = max_bytes;
  s.footprint = max_bytes * static_cast<size_t>(n);
  auto send = [&](size_t u) {
    Block b = seg(send_block(static_cast<int>(u / nseg)), u % nseg);
    s.send(right, tag(u), base + b.offset * esize, b.count * esize);
  };
  for (size_t k = 0; k < nseg; ++k)
    send(k);
  for (size_t u = 0; u < units; ++u) {
    const int t = static_cast<int>(u / nseg);
    Block b = seg(recv_block(t), u % nseg);
    char* at = base + b.offset * esize;
    if (t < rs_steps)
      s.recv(left, tag(u), nullptr, b.count * esize, at);  // into scratch, reduced into place
    else
      s.recv(left, tag(u), at, b.count * esize);
    if (t + 1 < steps) send(u + nseg);  // segment k of the next step once this one is in
  }
  ctx.transport.run(s);
}

void ring_allreduce(AlgoContext& ctx, void* data, size_t count, DType dtype, ReduceOp op) {
  ring(ctx, data, dtype, op, even_blocks(count, ctx.size()), true, true);
}

void allreduce(AlgoContext& ctx, void* data, size_t count, DType dtype, ReduceOp op,
               double postscale) {
  if (count == 0) return;
  if (HostCollectives* host = ctx.transport.host_collectives();
      host && ctx.size() > 1 && host->handles_allreduce(count * dtype_size(dtype))) {
    host->allreduce(data, count, dtype, op, ctx.peer_timeout, postscale);
    return;
  }
  if (ctx.size() > 1) {
    if (count * dtype_size(dtype) < ctx.small_allreduce_bytes)
      halving_doubling_allreduce(ctx, data, count, dtype, op);
    else
      ring_allreduce(ctx, data, count, dtype, op);
  }
  if (postscale != 1.0) scale(dtype, data, postscale, count);
}

}  // namespace pushpull::collective
