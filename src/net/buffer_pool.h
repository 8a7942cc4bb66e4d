// SPDX-License-Identifier: Apache-2.0
// Reusable receive buffers, so the hot path does not allocate per message.
//
// Buffers come in power-of-two size classes from 256 B to 64 MiB; a released
// buffer goes back to its class's free list (at most `max_cached` per class),
// larger ones are freed. Buffer is move-only and returns itself to the pool
// when destroyed; it keeps the pool's state alive (shared ownership: a
// handler may keep a payload after its Transport is gone).
//
// Thread safety: acquire() and Buffer destruction may happen on any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace pushpull::net {

class BufferPool;

class Buffer {
 public:
  Buffer() = default;
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  void reset();

 private:
  friend class BufferPool;
  struct State;
  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
  std::shared_ptr<State> pool_;
};

class BufferPool {
 public:
  explicit BufferPool(size_t max_cached = 8);
  // A buffer of exactly `size` bytes (contents unspecified).
  Buffer acquire(size_t size);
  // Buffers currently cached (for tests).
  size_t cached() const;

 private:
  std::shared_ptr<Buffer::State> state_;
};

}  // namespace pushpull::net
