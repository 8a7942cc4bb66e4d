// SPDX-License-Identifier: Apache-2.0
// An optional capability of a transport whose ranks all share one host's
// memory (Transport::host_collectives()): collectives that need no messages,
// driven entirely by the calling algorithm thread, with no hand-off to a
// progress thread (shm_arena.h implements it over ShmTransport's segments).
//
// Every rank of an operation asks handles_allreduce() with the same size and
// gets the same answer (it depends only on the size and on what the ranks
// agreed at setup), so every rank takes the same path. Operations run in the
// same order on every rank, like every collective.
//
// Thread safety: one operation at a time per rank (the algorithm thread).
#pragma once

#include <cstddef>

#include "pushpull/dtype.h"
#include "pushpull/kernels.h"
#include "pushpull/options.h"

namespace pushpull::transport {

class HostCollectives {
 public:
  virtual ~HostCollectives() = default;
  // Whether allreduce() takes an operation of `bytes`.
  virtual bool handles_allreduce(size_t bytes) const = 0;
  // In place: data (count elements) becomes the reduction over all ranks,
  // times `postscale` (kernels' scale()). Every wait on a peer ends within
  // `peer_timeout` (Timeout naming the peer), or earlier with PeerFailure
  // when the peer died or closed.
  virtual void allreduce(void* data, size_t count, DType dtype, ReduceOp op, Millis peer_timeout,
                         double postscale = 1.0) = 0;
  // Returns once every rank has entered the barrier.
  virtual void barrier(Millis peer_timeout) = 0;
};

}  // namespace pushpull::transport
