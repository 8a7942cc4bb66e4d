// SPDX-License-Identifier: Apache-2.0
// Recursive halving-doubling allreduce (Rabenseifner) for small messages:
// log2(n) latency terms instead of the ring's 2(n-1); at most
// kFullExchangeBytes, recursive doubling (log2(n) whole-vector exchanges).
//
// Non-powers of two: with p the largest power of two <= n and rem = n - p,
// the first 2*rem ranks pair up; each even one hands its whole vector to its
// odd neighbour and sits out, so p ranks remain. They run a reduce-scatter by
// recursive halving (exchange half of the current range with the partner at
// distance p/2, p/4, ..., reduce the half kept) and an allgather by recursive
// doubling (the same exchanges in reverse, received straight into place).
// Finally each odd rank returns the result to the even rank that sat out.
// Every element is reduced in exactly one place and then copied, so all
// ranks end with bit-identical results. Written as a schedule (schedule.h):
// each exchange's send waits for the receives before it.
#include <utility>

#include <fmt/format.h>

#include "collective/algorithms.h"

namespace pushpull::collective {

using transport::halving_doubling_shape;
using transport::HalvingDoublingShape;
using transport::op_tag;
using transport::Schedule;

namespace {

// At most this many bytes: recursive doubling instead of halving-doubling.
constexpr size_t kFullExchangeBytes = 16 << 10;

}  // namespace

void halving_doubling_allreduce(AlgoContext& ctx, void* data_ptr, size_t count, DType dtype,
                                ReduceOp op) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1 || count == 0) return;
  const size_t esize = dtype_size(dtype), bytes = count * esize;
  char* data = static_cast<char*>(data_ptr);
  Schedule s = schedule(ctx, fmt::format("halving-doubling (op {})", ctx.op_id), dtype, op);
  s.message_bytes = bytes;
  // One message each way with `peer`; what arrives lands at `recv`, or in
  // scratch and is reduced into `reduce_into`. Message `index` of the
  // operation: the same sequence on every rank.
  auto exchange = [&](int peer, const char* send, size_t send_bytes, char* recv, size_t recv_bytes,
                      uint32_t index, char* reduce_into = nullptr, bool after_sends = false) {
    s.send(peer, op_tag(ctx.op_id, index), send, send_bytes);
    s.recv(peer, op_tag(ctx.op_id, index), recv, recv_bytes, reduce_into, after_sends);
  };
  uint32_t msg = 0;

  const HalvingDoublingShape shape = halving_doubling_shape(r, n);
  const int p = shape.p, newrank = shape.newrank;
  // Fold the extra ranks in.
  if (shape.folds(r)) {
    if (r % 2 == 0) {
      exchange(r + 1, data, bytes, nullptr, 0, msg);
    } else {
      exchange(r - 1, nullptr, 0, nullptr, bytes, msg, data);
    }
  }
  ++msg;
  auto real = [&](int nr) { return shape.real(nr); };

  if (newrank >= 0 && bytes <= kFullExchangeBytes) {
    // Small vectors: recursive doubling, whole vectors exchanged, log2(p)
    // rounds instead of 2 log2(p): latency dominates here, bytes do not.
    // a op b == b op a for every reduction, so the ranks stay bit-identical.
    for (int mask = 1; mask < p; mask *= 2) {
      // Reduced into what was just sent: only once it has gone.
      exchange(real(newrank ^ mask), data, bytes, nullptr, bytes, msg++, data, true);
    }
  } else if (newrank >= 0) {
    // Reduce-scatter by recursive halving; remember each level's range.
    std::vector<std::pair<size_t, size_t>> ranges;  // (lo, hi) before each halving
    size_t lo = 0, hi = count;
    for (int mask = p / 2; mask >= 1; mask /= 2) {
      int partner = real(newrank ^ mask);
      size_t mid = lo + (hi - lo) / 2;
      ranges.emplace_back(lo, hi);
      size_t keep_lo, keep_hi, give_lo, give_hi;
      if (newrank & mask) {
        keep_lo = mid, keep_hi = hi, give_lo = lo, give_hi = mid;
      } else {
        keep_lo = lo, keep_hi = mid, give_lo = mid, give_hi = hi;
      }
      exchange(partner, data + give_lo * esize, (give_hi - give_lo) * esize, nullptr,
               (keep_hi - keep_lo) * esize, msg++, data + keep_lo * esize);
      lo = keep_lo, hi = keep_hi;
    }
    // Allgather by recursive doubling: the same pairs in reverse order.
    for (int mask = 1; mask < p; mask *= 2) {
      int partner = real(newrank ^ mask);
      auto [plo, phi] = ranges.back();
      ranges.pop_back();
      // The partner holds the other half of [plo, phi).
      size_t olo = lo == plo ? hi : plo, ohi = lo == plo ? phi : lo;
      exchange(partner, data + lo * esize, (hi - lo) * esize, data + olo * esize,
               (ohi - olo) * esize, msg++);
      lo = plo, hi = phi;
    }
  }
  // The same message index on every rank whichever branch it took.
  msg = 1 + 2 * static_cast<uint32_t>(__builtin_ctz(static_cast<unsigned>(p)));

  // Unfold: odd ranks return the result to the even rank that sat out.
  if (shape.folds(r)) {
    if (r % 2 == 0)
      exchange(r + 1, nullptr, 0, data, bytes, msg);
    else
      exchange(r - 1, data, bytes, nullptr, 0, msg);
  }
  ctx.transport.run(s);
}

}  // namespace pushpull::collective
