// SPDX-License-Identifier: Apache-2.0
#include "transport/buffer_pool.h"

#include <algorithm>
#include <bit>
#include <cstdint>

namespace pushpull::transport {
namespace {
constexpr size_t kMinClass = 8;                                               // 256 B
constexpr size_t kMaxClass = 26;                                              // 64 MiB
constexpr size_t kLendClass = std::bit_width(BufferPool::kLendMinBytes - 1);  // 256 KiB
constexpr size_t kSlabClass = 25;  // 32 MiB slabs (a larger class: one block per buffer)
constexpr size_t kMaxSlabs = 256;  // descriptors a lending pool may hold
}  // namespace

struct Buffer::State {
  std::mutex mu;
  size_t max_cached;
  bool lending = false;
  std::vector<Buffer::Storage> free[kMaxClass + 1];
  // Every slab made, by its first byte (find_lent). Owned here as well as by
  // the pieces: a piece always comes back (see reset()), so a slab lives as
  // long as the pool's state anyway.
  std::map<uintptr_t, std::shared_ptr<LendBlock>> slabs;
  // Under mu: a new slab for class `cls`, cut into buffers, all but one put
  // on the free list; false when none can be made (the heap then).
  bool add_slab(size_t cls, Buffer::Storage* out) {
    if (slabs.size() >= kMaxSlabs) return false;
    const size_t piece = size_t{1} << cls, bytes = std::max(piece, size_t{1} << kSlabClass);
    std::unique_ptr<LendBlock> made;
    if (!LendBlock::create(bytes, &made)) return false;  // the heap then: nothing to report
    std::shared_ptr<LendBlock> slab = std::move(made);
    slabs.emplace(reinterpret_cast<uintptr_t>(slab->data()), slab);
    for (size_t at = bytes; at >= piece * 2; at -= piece)
      free[cls].push_back(Buffer::Storage{nullptr, slab, slab->data() + at - piece});
    *out = Buffer::Storage{nullptr, slab, slab->data()};
    return true;
  }
};

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::move(o.data_);
    o.data_.lent = nullptr;
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
      // A slab's piece always goes back: the slab is not split back up.
      if (data_.lent || pool_->free[cls].size() < pool_->max_cached)
        pool_->free[cls].push_back(std::move(data_));
    }
  }
  data_ = Storage{};
  pool_.reset();
  size_ = capacity_ = 0;
}

BufferPool::BufferPool(size_t max_cached, bool lending)
    : state_(std::make_shared<Buffer::State>()) {
  state_->max_cached = max_cached;
  state_->lending = lending;
}

Buffer BufferPool::acquire(size_t size) {
  Buffer b;
  b.size_ = size;
  if (size == 0) return b;
  size_t cls = std::max(kMinClass, static_cast<size_t>(std::bit_width(size - 1)));
  if (cls > kMaxClass) {
    b.data_.heap.reset(new std::byte[size]);
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
  if (state_->lending && cls >= kLendClass) {
    std::lock_guard lock(state_->mu);
    if (state_->add_slab(cls, &b.data_)) return b;
  }
  b.data_.heap.reset(new std::byte[b.capacity_]);
  return b;
}

std::optional<LendRef> BufferPool::find_lent(const void* data, size_t bytes) const {
  std::lock_guard lock(state_->mu);
  auto it = state_->slabs.upper_bound(reinterpret_cast<uintptr_t>(data));
  if (it == state_->slabs.begin()) return std::nullopt;
  return std::prev(it)->second->ref(data, bytes);
}

size_t BufferPool::cached() const {
  std::lock_guard lock(state_->mu);
  size_t n = 0;
  for (auto& l : state_->free)
    n += l.size();
  return n;
}

}  // namespace pushpull::transport
