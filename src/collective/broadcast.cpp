// SPDX-License-Identifier: Apache-2.0
// Broadcast (binomial tree for small messages, pipelined chain for large
// ones) and the dissemination barrier, each as a schedule (schedule.h).
#include <algorithm>

#include <fmt/format.h>

#include "collective/algorithms.h"
#include "transport/host_collectives.h"

namespace pushpull::collective {

using transport::HostCollectives;
using transport::op_tag;
using transport::Schedule;

namespace {

constexpr size_t kMinChainSegment = 64 << 10;

void binomial(AlgoContext& ctx, char* data, size_t bytes, int root) {
  const int n = ctx.size();
  const int v = (ctx.rank() - root + n) % n;  // rank relative to the root
  const uint64_t tag = op_tag(ctx.op_id, 0);
  Schedule s = schedule(ctx, fmt::format("broadcast (op {})", ctx.op_id));
  s.message_bytes = bytes;
  int mask = 1;
  for (; mask < n; mask <<= 1) {
    if (v & mask) {
      s.recv((v - mask + root) % n, tag, data, bytes);
      break;
    }
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < n) s.send((v + mask + root) % n, tag, data, bytes);
  ctx.transport.run(s);
}

// Ranks in a line from the root; segment k is forwarded as soon as it has
// arrived, so all links carry data at once.
void chain(AlgoContext& ctx, char* data, size_t bytes, int root) {
  const int n = ctx.size();
  const int v = (ctx.rank() - root + n) % n;
  const int prev = (ctx.rank() - 1 + n) % n, next = (ctx.rank() + 1) % n;
  size_t seg = std::max<uint64_t>(ctx.ring_segment_bytes, 1);
  // Enough segments that the line fills: at least ~2 per hop when large.
  size_t nseg =
      std::max<size_t>((bytes + seg - 1) / seg,
                       std::min<size_t>(2 * static_cast<size_t>(n), bytes / kMinChainSegment));
  nseg = std::max<size_t>(nseg, 1);
  auto range = [&](size_t k) {
    size_t lo = bytes * k / nseg, hi = bytes * (k + 1) / nseg;
    return std::pair{lo, hi - lo};
  };
  Schedule s = schedule(ctx, fmt::format("chain broadcast (op {})", ctx.op_id));
  s.message_bytes = range(0).second;
  for (size_t k = 0; k < nseg; ++k) {
    auto [off, len] = range(k);
    const uint64_t tag = op_tag(ctx.op_id, static_cast<uint32_t>(k));
    if (v > 0) s.recv(prev, tag, data + off, len);
    if (v + 1 < n) s.send(next, tag, data + off, len);  // once it is in
  }
  ctx.transport.run(s);
}

}  // namespace

void broadcast(AlgoContext& ctx, void* data, size_t bytes, int root) {
  if (ctx.size() == 1 || bytes == 0) return;
  if (bytes < ctx.small_allreduce_bytes || ctx.size() == 2)
    binomial(ctx, static_cast<char*>(data), bytes, root);
  else
    chain(ctx, static_cast<char*>(data), bytes, root);
}

void barrier(AlgoContext& ctx) {
  const int n = ctx.size(), r = ctx.rank();
  if (HostCollectives* host = ctx.transport.host_collectives()) {
    host->barrier(ctx.peer_timeout);
    return;
  }
  // Round k's message goes once round k - 1's has arrived.
  static const char out = 1;
  char in[32];  // one byte per round: ceil(log2 n) <= 31
  Schedule s = schedule(ctx, fmt::format("barrier (op {})", ctx.op_id));
  s.message_bytes = 1;
  uint32_t round = 0;
  for (int dist = 1; dist < n; dist *= 2, ++round) {
    s.send((r + dist) % n, op_tag(ctx.op_id, round), &out, 1);
    s.recv((r - dist + n) % n, op_tag(ctx.op_id, round), &in[round], 1);
  }
  ctx.transport.run(s);
}

}  // namespace pushpull::collective
