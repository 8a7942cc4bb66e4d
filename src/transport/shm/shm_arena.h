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
// - Allreduce, reduce-scatter through the slots: a slot mirrors the
//   buffer's layout, split into one block per rank. In steps of a chunk of
//   every block, each rank copies its input for the other ranks' blocks
//   into its slot (alternating between two slots, so the next operation
//   need not wait for slow readers) and publishes; reduces its own block's
//   chunk from every rank's input in rank order (the same bits
//   everywhere) into its slot and its buffer, and publishes; then copies
//   the peers' reduced chunks into its buffer. Per rank, each byte is
//   copied about twice and reduced once over 1/n of the buffer, and the
//   chunks a peer wrote are read while still in cache. An allreduce larger
//   than a slot goes in slot-sized segments, one after the other; this
//   beat reading the peers' buffers directly (process_vm_readv, which pins
//   every page) by 2-3x at 2-64 MiB (docs/performance.md).
// - How a rank writes its slot (SlotStores): with cached stores the peers
//   read the chunk from this core's cache, which is fastest when the cores
//   share a cache and the buffers are warm (the allreduce benchmark's
//   case); with streaming (non-temporal) stores the chunk goes to memory
//   and the peers read it from there, which was 3x faster for a training
//   step's cold 256 MiB of gradients on some runs of the 2-core test host
//   and 1.6x slower on others (docs/performance.md). Auto measures both on
//   allreduces of at least kTunedBytes by the CPU time they cost this rank
//   (waits for peers left out: they say what else the host ran) and keeps
//   the cheaper, trying the other again every kRetryEvery such operations.
//   Either way every rank reduces in rank order, so the result's bits do
//   not depend on it.
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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pushpull/array.h"
#include "pushpull/error.h"
#include "transport/host_collectives.h"

namespace pushpull::transport {

enum class SlotStores : uint8_t { kAuto = 0, kCached = 1, kStreaming = 2 };
// "auto", "cached", "streaming" (PUSHPULL_SHM_ARENA_STORES); nullopt otherwise.
std::optional<SlotStores> parse_slot_stores(std::string_view text);

// In each rank's segment. The first line is written only by its owner, the
// second mostly by its peers.
struct alignas(64) ArenaCtl {
  std::atomic<uint64_t> phase;  // the last phase the owner reached
  char pad[56];
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
  };
  // Why operations with `peer` fail (this transport closed, the peer dead
  // or closed), or ok.
  using Check = std::function<Status(int peer)>;
  // `ranks[rank]` is this rank. Allreduces move `chunk_bytes` per step.
  // `name(r)`: how errors name rank r.
  ShmArena(int rank, std::vector<Rank> ranks, size_t slot_bytes, size_t chunk_bytes, Check check,
           std::function<int(int)> name, SlotStores stores = SlotStores::kAuto);

  // Auto's choice is measured on allreduces of at least this many bytes
  // (smaller ones stay in cache: cached stores).
  static constexpr size_t kTunedBytes = size_t{4} << 20;
  static constexpr uint64_t kRetryEvery = 31;

  bool handles_allreduce(size_t bytes) const override;
  void allreduce(void* data, size_t count, DType dtype, ReduceOp op, Millis peer_timeout,
                 double postscale = 1.0) override;
  void barrier(Millis peer_timeout) override;
  // Wakes this rank's waiter (its transport closed).
  void wake();

 private:
  int size() const { return static_cast<int>(ranks_.size()); }
  void publish(uint64_t phase);
  void wait_all(uint64_t phase, Millis timeout, const char* what);
  void wait_for(int peer, uint64_t phase, Millis timeout, const char* what);
  // One segment: at most slot_bytes_.
  void slot_allreduce(char* data, size_t count, DType dtype, ReduceOp op, Millis timeout,
                      double postscale, bool streaming);
  // Auto: which stores the next tuned allreduce uses, and what it measured.
  bool pick_streaming();
  void record(bool streaming, double bytes_per_second);

  int rank_;
  std::vector<Rank> ranks_;
  size_t slot_bytes_;
  size_t chunk_bytes_;  // a slot allreduce's step
  Check check_;
  std::function<int(int)> name_;
  uint64_t phase_ = 0;       // the last phase this rank published
  uint64_t slot_ops_ = 0;    // which slot the next segment uses
  uint64_t slot_free_[2]{};  // the phase after which every rank is done reading a slot
  SlotStores stores_;
  // A streaming step reduces here first (in cache), then streams the result
  // into the slot and copies it into the buffer (64-byte aligned).
  Array scratch_;
  uint64_t tuned_ops_ = 0;
  double rate_[2]{};  // bytes/s of tuned allreduces, [cached, streaming] (moving averages)
};

}  // namespace pushpull::transport
