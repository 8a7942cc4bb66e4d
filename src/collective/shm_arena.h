// SPDX-License-Identifier: Apache-2.0
// HostCollectives over ShmTransport's segments (host_collectives.h): the
// allreduce and barrier of a job whose ranks all share one host, driven by
// the algorithm's thread alone (no progress thread, no messages).
//
// Each rank's segment holds an ArenaCtl (below) and two slots. Ranks move
// forward through numbered phases: a rank publishes the phase it reached in
// its own ArenaCtl, and waits until every peer's is at least as far. Every
// rank runs the same operations in the same order and each operation
// advances the phase by the same amount on every rank, so the numbers agree
// without messages.
//
// - Small allreduce (bytes <= slot, less above 4 ranks): each rank copies
//   its input into its slot (alternating between two, so the next operation
//   need not wait for slow readers) in chunks, publishing each, and
//   reduces chunk k of all slots in rank order straight into its buffer
//   while it copies chunk k+1 (the same order everywhere: the same bits
//   everywhere; the chunks are still in cache); then publishes that it is
//   done reading. One copy and one pass of reduction; about a microsecond
//   plus the reduction.
// - Large allreduce, single copy (when every rank may read every peer's
//   memory with process_vm_readv, found at setup): each rank publishes its
//   buffer's address; rank r reduces block r, reading the peers' block r
//   straight from their buffers in cache-sized chunks; once all blocks are
//   reduced, each rank reads the others' reduced blocks straight into its
//   own buffer; a last phase says it is done reading, and no rank returns
//   (so no caller touches its buffer) before every rank has. Each byte
//   crosses between processes once, with no staging copy through the
//   segment.
// - Barrier: one phase.
//
// Waits spin briefly (yielding the CPU), then sleep on a futex in the
// waiter's ArenaCtl that publishers wake only when its `sleeping` flag is
// set; sleeps are sliced so a dead or closed peer (the transport's check)
// and the deadline are noticed.
//
// Thread safety: one operation at a time (the algorithm thread); wake() may
// be called from any thread. Ownership: the segments belong to the
// ShmTransport, which outlives this object.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collective/host_collectives.h"
#include "pushpull/error.h"

namespace pushpull::collective {

// In each rank's segment. The first line is written only by its owner, the
// second mostly by its peers.
struct alignas(64) ArenaCtl {
  std::atomic<uint64_t> phase;        // the last phase the owner reached
  std::atomic<uint64_t> addr;         // the owner's buffer in a single-copy allreduce
  uint64_t probe_addr;                // where the owner maps probe_magic
  uint64_t probe_magic;               // what a single-copy probe must read there
  std::atomic<uint32_t> single_copy;  // 0 not yet known, 1 the owner can read every peer, 2 not
  char pad[28];
  std::atomic<uint32_t> doorbell;  // bumped by a publisher that found the owner asleep
  std::atomic<uint32_t> sleeping;  // the owner is (about to be) in FUTEX_WAIT
  char pad2[56];
};
static_assert(sizeof(ArenaCtl) == 128);

class ShmArena final : public HostCollectives {
 public:
  struct Rank {
    ArenaCtl* ctl;  // in its segment, as mapped here
    char* slots;    // two slots of slot_bytes each
    int32_t pid;
  };
  // Why operations with `peer` fail (this transport closed, the peer dead
  // or closed), or ok.
  using Check = std::function<Status(int peer)>;
  // `ranks[rank]` is this rank. Slot allreduces go in chunks of
  // `chunk_bytes`. `single_copy`: every rank agreed that every rank can read
  // every other's memory. `name(r)`: how errors name rank r.
  ShmArena(int rank, std::vector<Rank> ranks, size_t slot_bytes, size_t chunk_bytes,
           bool single_copy, Check check, std::function<int(int)> name);

  bool handles_allreduce(size_t bytes) const override;
  void allreduce(void* data, size_t count, DType dtype, ReduceOp op, Millis peer_timeout,
                 double postscale = 1.0) override;
  void barrier(Millis peer_timeout) override;
  bool single_copy() const { return single_copy_; }
  // Wakes this rank's waiter (its transport closed).
  void wake();

 private:
  int size() const { return static_cast<int>(ranks_.size()); }
  void publish(uint64_t phase);
  void wait_all(uint64_t phase, Millis timeout, const char* what);
  void wait_for(int peer, uint64_t phase, Millis timeout, const char* what);
  void small_allreduce(char* data, size_t count, DType dtype, ReduceOp op, Millis timeout,
                       double postscale);
  void single_copy_allreduce(char* data, size_t count, DType dtype, ReduceOp op, Millis timeout,
                             double postscale);
  void read_peer(int peer, void* dst, uint64_t remote, size_t bytes);

  int rank_;
  std::vector<Rank> ranks_;
  size_t slot_bytes_;
  size_t chunk_bytes_;  // a slot allreduce's copy-and-reduce step
  // Allreduces up to this size go through the slots: the whole slot for up
  // to 4 ranks, less above (each rank reads every rank's slot, n times the
  // bytes, where single copy reads about twice them).
  size_t slot_limit_;
  bool single_copy_;
  Check check_;
  std::function<int(int)> name_;
  uint64_t phase_ = 0;         // the last phase this rank published
  uint64_t small_ops_ = 0;     // which slot the next small allreduce uses
  uint64_t slot_free_[2]{};    // the phase after which every rank is done reading a slot
  std::vector<char> scratch_;  // a chunk read from a peer
};

}  // namespace pushpull::collective
