// SPDX-License-Identifier: Apache-2.0
// One rank's part of a collective as data: the sends, the receives and the
// reductions, and what each waits for. An algorithm (ring.cpp,
// broadcast.cpp, halving_doubling.cpp) is written once, as a function that
// builds a Schedule; the transport runs it (Transport::run): the TCP
// transport on its direct streams, driven by the calling thread
// (tcp_streams.h), every other transport through post_send/post_recv
// (run_posted below). So an algorithm knows nothing of how bytes move.
//
// Order and dependencies:
// - Receives complete in list order: receive i is waited for, then its
//   reduction (if any) runs, then receive i + 1. "done" counts the
//   receives completed so far.
// - A send may go once `after` receives are done (its data is final then);
//   sends go out in list order (so `after` never decreases), FIFO per peer.
// - A receive with dst == nullptr lands in scratch memory the executor
//   owns (a few slots, reused: how many is the executor's choice) and is
//   reduced from there into `reduce_into`; a receive with a dst lands there,
//   and is reduced into `reduce_into` too if that is set.
// - An executor may post or read a receive early (before the earlier ones
//   are done), so its destination must not be read or written by anything
//   still to come before it. The algorithms' data flow ensures that: a
//   peer sends into a region only after it received what this rank sent
//   from it.
//
// Every rank of an operation builds its schedule from the same op_id,
// sizes and shape, so the messages on a pair of ranks match in order.
//
// Thread safety: a Schedule is plain data, read by one executor at a time.
// Ownership: it points into the caller's buffers, which must outlive run().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pushpull/dtype.h"
#include "pushpull/kernels.h"
#include "pushpull/options.h"

namespace pushpull::transport {

class Transport;

struct Schedule {
  struct Send {
    int peer;
    uint64_t tag;
    const void* data;
    size_t bytes;
    size_t after;  // receives done before it may go
  };
  struct Recv {
    int peer;
    uint64_t tag;
    void* dst;  // nullptr: a scratch slot of the executor's
    size_t bytes;
    void* reduce_into = nullptr;  // reduce(op, dtype, reduce_into, received, bytes / esize)
    // The reduction waits until every send that went before it is out of
    // the caller's memory: it overwrites what they send, and the peer's
    // message arriving says nothing about this rank's having left.
    bool after_sends = false;
  };
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  DType dtype = DType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  // The operation's largest message, the same on every rank: a transport
  // that moves messages of some sizes another way decides by it, so every
  // rank takes the same path (ShmDataTransport).
  size_t message_bytes = 0;
  // The operation's size, the same on every rank: an executor may hand
  // large ones' sending and receiving to helper threads (tcp_streams.h).
  size_t footprint = 0;
  Millis timeout{10000};                 // progress deadline of every wait
  std::vector<char>* scratch = nullptr;  // the caller's, grown by the executor
  std::string what;                      // names the operation in errors: "ring (op 12)"

  void send(int peer, uint64_t tag, const void* data, size_t bytes) {
    if (bytes > 0) sends.push_back(Send{peer, tag, data, bytes, recvs.size()});
  }
  void recv(int peer, uint64_t tag, void* dst, size_t bytes, void* reduce_into = nullptr,
            bool after_sends = false) {
    if (bytes > 0) recvs.push_back(Recv{peer, tag, dst, bytes, reduce_into, after_sends});
  }
  // The largest receive into scratch (the executor's slot size).
  size_t scratch_bytes() const;
};

// Runs `s` with post_send/post_recv on `t`: a window of receives posted
// ahead (each scratch one in its own slot), every send posted as soon as it
// may go, each wait bounded by s.timeout. Throws the first error
// (PeerFailure, Timeout, ProtocolError); waits for every posted send first.
void run_posted(Transport& t, const Schedule& s);

// How the algorithms split work among ranks; here because the transports
// choose their links and the host collectives their blocks by them too.
// A rank's block of a buffer, in elements.
struct Block {
  size_t offset = 0;
  size_t count = 0;
};
// `count` elements split in `n` blocks, the first count % n one element larger.
std::vector<Block> even_blocks(size_t count, int n);

// Halving-doubling's shape for rank r of n: p, the largest power of two <= n,
// ranks take part in the XOR exchanges; the first 2 rem ranks (rem = n - p)
// fold in pairs first (r and r ^ 1): the even one sits out (newrank -1), the
// odd one continues as r / 2; the others as r - rem. real() maps a new rank
// back. The algorithm runs it; the mesh connects its partners up front
// (tcp_transport_mesh.cpp).
struct HalvingDoublingShape {
  int p = 1, rem = 0, newrank = -1;
  bool folds(int r) const { return r < 2 * rem; }
  int real(int nr) const { return nr < rem ? 2 * nr + 1 : nr + rem; }
};
inline HalvingDoublingShape halving_doubling_shape(int r, int n) {
  HalvingDoublingShape s;
  while (s.p * 2 <= n)
    s.p *= 2;
  s.rem = n - s.p;
  s.newrank = !s.folds(r) ? r - s.rem : (r % 2 == 0 ? -1 : r / 2);
  return s;
}

}  // namespace pushpull::transport
