// SPDX-License-Identifier: Apache-2.0
#include "net/buffer_pool.h"

#include <bit>

namespace pushpull::net {
namespace {
constexpr size_t kMinClass = 8;   // 256 B
constexpr size_t kMaxClass = 26;  // 64 MiB
}  // namespace

struct Buffer::State {
  std::mutex mu;
  size_t max_cached;
  std::vector<std::unique_ptr<std::byte[]>> free[kMaxClass + 1];
};

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::move(o.data_);
    size_ = o.size_;
    capacity_ = o.capacity_;
    pool_ = std::move(o.pool_);
    o.size_ = o.capacity_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (data_ && pool_) {
    size_t cls = static_cast<size_t>(std::countr_zero(capacity_));
    if (std::has_single_bit(capacity_) && cls <= kMaxClass) {
      std::lock_guard lock(pool_->mu);
      if (pool_->free[cls].size() < pool_->max_cached) pool_->free[cls].push_back(std::move(data_));
    }
  }
  data_.reset();
  pool_.reset();
  size_ = capacity_ = 0;
}

BufferPool::BufferPool(size_t max_cached) : state_(std::make_shared<Buffer::State>()) {
  state_->max_cached = max_cached;
}

Buffer BufferPool::acquire(size_t size) {
  Buffer b;
  b.size_ = size;
  if (size == 0) return b;
  size_t cls = std::max(kMinClass, static_cast<size_t>(std::bit_width(size - 1)));
  if (cls > kMaxClass) {
    b.data_.reset(new std::byte[size]);
    b.capacity_ = size;
    return b;
  }
  b.capacity_ = size_t{1} << cls;
  b.pool_ = state_;
  {
    std::lock_guard lock(state_->mu);
    auto& list = state_->free[cls];
    if (!list.empty()) {
      b.data_ = std::move(list.back());
      list.pop_back();
      return b;
    }
  }
  b.data_.reset(new std::byte[b.capacity_]);
  return b;
}

size_t BufferPool::cached() const {
  std::lock_guard lock(state_->mu);
  size_t n = 0;
  for (auto& l : state_->free)
    n += l.size();
  return n;
}

}  // namespace pushpull::net
