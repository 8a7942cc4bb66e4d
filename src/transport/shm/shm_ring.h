// SPDX-License-Identifier: Apache-2.0
// The one single-producer single-consumer byte ring of pushpull's shared
// memory, under the PS's payload rings (shm_segment.h) and the collectives'
// inbound rings (transport/shm/shm_transport_impl.h); each keeps its own
// message framing and doorbells.
//
// Positions are offsets into an endless byte stream (uint64_t); stream byte
// p lives at p % size(). The producer owns head (bytes ever written) and may
// write [head, tail + size); the consumer owns tail and may read [tail,
// head). Where the positions live in the shared memory (the collectives),
// ShmRingCtl holds them: each side publishes its own with release after
// copying and reads the other's with acquire. The PS carries them in its
// TCP frames instead (shm_setup.h).
//
// Thread safety: one producer and one consumer at a time; callers bound
// positions by free()/used(). Ownership: points into a mapping its owner holds.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace pushpull::transport {

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

}  // namespace pushpull::transport
