// SPDX-License-Identifier: Apache-2.0
// Reusable receive buffers, so the hot path does not allocate per message.
//
// Buffers come in power-of-two size classes from 256 B to 64 MiB; a released
// buffer goes back to its class's free list (at most `max_cached` per class),
// larger ones are freed. Buffer is move-only and returns itself to the pool
// when destroyed; it keeps the pool's state alive (shared ownership: a
// handler may keep a payload after its MessageTransport is gone).
//
// A lending pool (TransportConfig::lend_buffers; a replicating server's
// store) carves buffers of 256 KiB to 32 MiB out of memfd-backed LendBlocks
// ("slabs" of 32 MiB, or one block for a larger class) instead of the heap,
// so a node can lend what it holds to a peer on the same host (transport/shm/lend.h). Such buffers
// always go back to their free list (a slab is never split back), so the pool keeps its peak; slabs
// hold one descriptor each, at most kMaxSlabs per pool (the heap after that, and when a block
// cannot be made). The pool owns its slabs (they live as long as it or any of its buffers) and
// finds the one a pointer lies in (find_lent), so lending needs no process-wide registry.
//
// Thread safety: acquire(), find_lent() and Buffer destruction may happen
// on any thread.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "transport/shm/lend.h"

namespace pushpull::transport {

class BufferPool;

class Buffer {
 public:
  Buffer() = default;
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::byte* data() { return data_.ptr(); }
  const std::byte* data() const { return data_.ptr(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  void reset();

 private:
  friend class BufferPool;
  struct State;
  // Heap memory, or a piece of a lendable slab.
  struct Storage {
    std::unique_ptr<std::byte[]> heap;
    std::shared_ptr<LendBlock> slab;
    std::byte* lent = nullptr;  // inside *slab
    std::byte* ptr() const { return lent ? lent : heap.get(); }
    explicit operator bool() const { return heap || lent; }
  };
  Storage data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
  std::shared_ptr<State> pool_;
};

class BufferPool {
 public:
  // The smallest buffer a lending pool takes from a slab (256 KiB).
  static constexpr size_t kLendMinBytes = size_t{1} << 18;
  explicit BufferPool(size_t max_cached = 8, bool lending = false);
  // A buffer of exactly `size` bytes (contents unspecified).
  Buffer acquire(size_t size);
  // Buffers currently cached (for tests).
  size_t cached() const;
  // The LendRef of [data, data + bytes) when that range lies inside one of
  // this pool's slabs (a buffer it handed out, live or cached); nullopt
  // otherwise (the heap, another pool's memory, a pool that does not lend).
  std::optional<LendRef> find_lent(const void* data, size_t bytes) const;

 private:
  std::shared_ptr<Buffer::State> state_;
};

}  // namespace pushpull::transport
