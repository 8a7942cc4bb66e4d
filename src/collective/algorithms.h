// SPDX-License-Identifier: Apache-2.0
// Collective algorithms over a Transport, run by one thread per rank (the
// engine's background thread, or a test's rank thread). Every rank calls the
// same function with the same `op_id`, sizes, dtype and op; `op_id` keeps the
// messages of different operations apart (see op_tag).
//
// Each algorithm is written once, as the schedule of its sends, receives and
// reductions (schedule.h), which the transport runs (Transport::run).
//
// Every wait on a peer has a deadline of `peer_timeout` from when it starts
// (progress deadline: a large transfer is not cut off for being large).
// Errors (PeerFailure, Timeout, ProtocolError) are thrown.
//
// Cost model (alpha = per-message latency, beta = seconds per byte, n ranks,
// S bytes): ring allreduce 2(n-1) alpha + 2 (n-1)/n S beta; halving-doubling
// 2 log2(n) alpha + 2 (n-1)/n S beta (+2 alpha + S beta for non-powers of 2);
// chain broadcast (n-2+k) (alpha + S/k beta) for k segments; binomial
// broadcast log2(n) (alpha + S beta); ring allgather (n-1) alpha + (n-1)/n S beta.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pushpull/dtype.h"
#include "pushpull/kernels.h"
#include "pushpull/options.h"
#include "transport/transport.h"

namespace pushpull::collective {

using transport::Block;
using transport::Clock;
using transport::Deadline;
using transport::Schedule;
using transport::Transport;

struct AlgoContext {
  Transport& transport;
  uint64_t op_id = 0;
  Millis peer_timeout{10000};
  uint64_t ring_segment_bytes = 1 << 20;
  uint64_t small_allreduce_bytes = 64 << 10;
  // Reused scratch memory (grown on demand); owned by the caller.
  std::vector<char>* scratch = nullptr;

  int rank() const { return transport.rank(); }
  int size() const { return transport.size(); }
  Deadline deadline() const { return Clock::now() + peer_timeout; }
};

// An empty schedule of `ctx`'s operation (schedule.h): its deadline and
// scratch memory; the algorithm fills in the messages and sizes.
inline Schedule schedule(const AlgoContext& ctx, std::string what, DType dtype = DType::kUInt8,
                         ReduceOp op = ReduceOp::kSum) {
  Schedule s;
  s.dtype = dtype;
  s.op = op;
  s.timeout = ctx.peer_timeout;
  s.scratch = ctx.scratch;
  s.what = std::move(what);
  return s;
}

// In place: data (count elements) becomes the reduction over all ranks,
// times `postscale` (an average's 1/n; the shared-memory arena applies it
// to each block while it is in cache). Picks the transport's host
// collectives when it has them (host_collectives.h), else halving-doubling
// below small_allreduce_bytes, the ring otherwise.
void allreduce(AlgoContext& ctx, void* data, size_t count, DType dtype, ReduceOp op,
               double postscale = 1.0);
void ring_allreduce(AlgoContext& ctx, void* data, size_t count, DType dtype, ReduceOp op);
void halving_doubling_allreduce(AlgoContext& ctx, void* data, size_t count, DType dtype,
                                ReduceOp op);

// The ring pipeline over `blocks` (one per rank, elements of `dtype` at
// base): with `reduce_scatter`, rank r ends holding the reduction of block r;
// with `allgather`, every rank's block r (already in place at rank r) reaches
// every rank. Both: allreduce. Segments of ring_segment_bytes (at least two
// per block when blocks are large enough) keep several transfers in flight.
void ring(AlgoContext& ctx, void* base, DType dtype, ReduceOp op, const std::vector<Block>& blocks,
          bool reduce_scatter, bool allgather);

// data (bytes) from `root` to every rank, in place. Binomial tree below
// small_allreduce_bytes, pipelined chain otherwise.
void broadcast(AlgoContext& ctx, void* data, size_t bytes, int root);

// Dissemination barrier: ceil(log2 n) rounds of one-byte messages.
void barrier(AlgoContext& ctx);

}  // namespace pushpull::collective
