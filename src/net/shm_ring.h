// SPDX-License-Identifier: Apache-2.0
// The one single-producer single-consumer byte ring of pushpull's shared
// memory: the PS's payload rings (net/shm_segment.h) and the collectives'
// inbound rings (collective/shm_transport_impl.h). Each keeps its own
// message framing and doorbells; the ring is only bytes.
//
// Positions are byte offsets into an endless stream (uint64_t: never wraps
// in practice); stream byte p lives at p % size(). The producer owns `head`
// (bytes ever written), the consumer `tail` (bytes ever read); the producer
// may write [head, tail + size), the consumer read [tail, head).
// ShmRing::copy_in/copy_out copy across the wrap. Where both positions live
// in the shared memory itself (the collectives), ShmRingCtl holds them as
// atomics: the producer publishes head with release after copying in, the
// consumer reads it with acquire before copying out (and the same for
// tail the other way). The PS keeps its positions in its TCP frames
// instead (net/shm_setup.h) and uses only ShmRing.
//
// Thread safety: one producer thread and one consumer thread at a time;
// the ring never checks positions: callers bound them by free()/used().
// Ownership: a ShmRing points into memory its owner maps (a ShmFile).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace pushpull::net {

class ShmRing {
 public:
  ShmRing() = default;
  ShmRing(std::byte* data, size_t bytes) : data_(data), bytes_(bytes) {}

  size_t size() const { return bytes_; }
  // What the producer may still write / the consumer may read.
  uint64_t free(uint64_t head, uint64_t tail) const { return bytes_ - (head - tail); }
  static uint64_t used(uint64_t head, uint64_t tail) { return head - tail; }

  // Copies n <= size() bytes to / from stream position `pos`. A null `dst`
  // skips the bytes (a message nobody wants).
  void copy_in(uint64_t pos, const void* src, size_t n) const {
    const size_t at = static_cast<size_t>(pos % bytes_);
    const size_t first = std::min(n, bytes_ - at);
    std::memcpy(data_ + at, src, first);
    if (n > first) std::memcpy(data_, static_cast<const std::byte*>(src) + first, n - first);
  }
  void copy_out(uint64_t pos, void* dst, size_t n) const {
    if (dst == nullptr) return;
    const size_t at = static_cast<size_t>(pos % bytes_);
    const size_t first = std::min(n, bytes_ - at);
    std::memcpy(dst, data_ + at, first);
    if (n > first) std::memcpy(static_cast<std::byte*>(dst) + first, data_, n - first);
  }

 private:
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
};

// Both positions of a ring in shared memory, each on its own cache line
// (the producer's and the consumer's stores do not share one).
struct alignas(64) ShmRingCtl {
  std::atomic<uint64_t> head;  // bytes ever written (producer)
  char pad[56];
  std::atomic<uint64_t> tail;  // bytes ever read (consumer)
  char pad2[56];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && sizeof(ShmRingCtl) == 128);

}  // namespace pushpull::net
