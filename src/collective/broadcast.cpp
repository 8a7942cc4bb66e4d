// SPDX-License-Identifier: Apache-2.0
// Broadcast (binomial tree for small messages, pipelined chain for large
// ones) and the dissemination barrier.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "collective/algorithms.h"
#include "collective/host_collectives.h"
#include "collective/tcp_streams.h"

namespace pushpull::collective {
namespace {

constexpr size_t kMinChainSegment = 64 << 10;

void binomial(AlgoContext& ctx, char* data, size_t bytes, int root) {
  const int n = ctx.size();
  const int v = (ctx.rank() - root + n) % n;  // rank relative to the root
  const uint64_t tag = op_tag(ctx.op_id, 0);
  if (DirectStreams* tcp = stream_transport(ctx.transport, bytes)) {
    auto lock = tcp->lock_streams();
    StreamPump pump(*tcp, ctx.peer_timeout, fmt::format("broadcast (op {})", ctx.op_id));
    int mask = 1;
    for (; mask < n; mask <<= 1) {
      if (v & mask) {
        pump.wait_recv((v - mask + root) % n, pump.recv((v - mask + root) % n, tag, data, bytes));
        break;
      }
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (v + mask < n) pump.send((v + mask + root) % n, tag, data, bytes);
    pump.finish();
    return;
  }
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      int src = (v - mask + root) % n;
      irecv(ctx.transport, src, tag, data, bytes)
          .wait(ctx.deadline(), fmt::format("broadcast from rank {} (op {})", src, ctx.op_id));
      break;
    }
    mask <<= 1;
  }
  std::vector<Request> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n)
      sends.push_back(isend(ctx.transport, (v + mask + root) % n, tag, data, bytes));
  }
  for (auto& s : sends)
    s.wait(ctx.deadline(), fmt::format("broadcast send (op {})", ctx.op_id));
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
  if (DirectStreams* tcp = stream_transport(ctx.transport, range(0).second)) {
    auto lock = tcp->lock_streams();
    StreamPump pump(*tcp, ctx.peer_timeout, fmt::format("chain broadcast (op {})", ctx.op_id));
    std::vector<size_t> index(nseg, SIZE_MAX);
    for (size_t k = 0; k < nseg && v > 0; ++k)
      if (auto [off, len] = range(k); len)
        index[k] = pump.recv(prev, op_tag(ctx.op_id, static_cast<uint32_t>(k)), data + off, len);
    for (size_t k = 0; k < nseg; ++k) {
      auto [off, len] = range(k);
      if (index[k] != SIZE_MAX) pump.wait_recv(prev, index[k]);
      if (v + 1 < n && len)
        pump.send(next, op_tag(ctx.op_id, static_cast<uint32_t>(k)), data + off, len);
    }
    pump.finish();
    return;
  }
  std::vector<std::optional<Request>> recvs(nseg);
  if (v > 0) {
    for (size_t k = 0; k < nseg; ++k) {
      auto [off, len] = range(k);
      if (len)
        recvs[k] = irecv(ctx.transport, prev, op_tag(ctx.op_id, static_cast<uint32_t>(k)),
                         data + off, len);
    }
  }
  std::vector<Request> sends;
  for (size_t k = 0; k < nseg; ++k) {
    auto [off, len] = range(k);
    if (recvs[k])
      recvs[k]->wait(ctx.deadline(),
                     fmt::format("broadcast segment {} from rank {} (op {})", k, prev, ctx.op_id));
    if (v + 1 < n && len)
      sends.push_back(
          isend(ctx.transport, next, op_tag(ctx.op_id, static_cast<uint32_t>(k)), data + off, len));
  }
  for (auto& s : sends)
    s.wait(ctx.deadline(), fmt::format("broadcast send to rank {} (op {})", next, ctx.op_id));
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
  char out = 1, in = 0;
  uint32_t round = 0;
  if (HostCollectives* host = ctx.transport.host_collectives()) {
    host->barrier(ctx.peer_timeout);
    return;
  }
  if (DirectStreams* tcp = stream_transport(ctx.transport, sizeof out)) {
    auto lock = tcp->lock_streams();
    for (int dist = 1; dist < n; dist *= 2, ++round) {
      int to = (r + dist) % n, from = (r - dist + n) % n;
      StreamPump pump(*tcp, ctx.peer_timeout,
                      fmt::format("barrier round {} (op {})", round, ctx.op_id));
      pump.recv(from, op_tag(ctx.op_id, round), &in, 1);
      pump.send(to, op_tag(ctx.op_id, round), &out, 1);
      pump.finish();
    }
    return;
  }
  for (int dist = 1; dist < n; dist *= 2, ++round) {
    int to = (r + dist) % n, from = (r - dist + n) % n;
    auto rv = irecv(ctx.transport, from, op_tag(ctx.op_id, round), &in, 1);
    auto s = isend(ctx.transport, to, op_tag(ctx.op_id, round), &out, 1);
    rv.wait(ctx.deadline(), fmt::format("barrier round {} from rank {}", round, from));
    s.wait(ctx.deadline(), fmt::format("barrier round {} to rank {}", round, to));
  }
}

}  // namespace pushpull::collective
