// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/lend.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/metrics.h"
#include "transport/wire.h"

namespace pushpull::transport {
namespace {

std::string hex(const LendToken& t) {
  return to_hex(t.data(), t.size());
}

// What readlink shows for a memfd named for `token`.
std::string memfd_link(const LendToken& token) {
  return fmt::format("/memfd:{}{} (deleted)", kLendNamePrefix, hex(token));
}

std::string read_link(const std::string& path) {
  char buf[256];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  return n <= 0 || static_cast<size_t>(n) >= sizeof buf ? ""
                                                        : std::string(buf, static_cast<size_t>(n));
}

Status refused(const LendRef& r, const std::string& why) {
  return {ErrorCode::kIoError, fmt::format("cannot read block {} of process {} (fd {}): {}",
                                           hex(r.token).substr(0, 8), r.pid, r.fd, why)};
}

}  // namespace

// pid, fd, token, block size, offset, bytes.
static_assert(4 + 4 + sizeof(LendToken) + 3 * 8 == kLendRefBytes);

std::vector<std::byte> encode_lend_ref(const LendRef& r) {
  Writer w;
  w.u<uint32_t>(r.pid).u<int32_t>(r.fd).bytes(r.token);
  w.u<uint64_t>(r.block_bytes).u<uint64_t>(r.offset).u<uint64_t>(r.bytes);
  return w.data();
}

Status decode_lend_ref(std::span<const std::byte> in, LendRef* out) {
  Reader r(in);
  LendRef v;
  v.pid = r.u<uint32_t>();
  v.fd = r.u<int32_t>();
  r.bytes(v.token);
  v.block_bytes = r.u<uint64_t>();
  v.offset = r.u<uint64_t>();
  v.bytes = r.u<uint64_t>();
  if (!r.done()) return {ErrorCode::kProtocolError, "lent block reference: malformed"};
  if (v.fd < 0 || v.pid == 0 || v.offset > v.block_bytes || v.bytes > v.block_bytes - v.offset)
    return {ErrorCode::kProtocolError,
            fmt::format("lent block reference: range {}+{} outside a block of {} bytes (fd {})",
                        v.offset, v.bytes, v.block_bytes, v.fd)};
  *out = v;
  return Status::ok();
}

static_assert(sizeof(LendToken) == sizeof(ShmId));

Status LendBlock::create(size_t bytes, std::unique_ptr<LendBlock>* out) {
  std::unique_ptr<LendBlock> b(new LendBlock());
  if (Status st = ShmFile::create_memfd(ShmKind{kLendNamePrefix, 32}, bytes, &b->file_); !st)
    return st;
  *out = std::move(b);
  return Status::ok();
}

std::optional<LendRef> LendBlock::ref(const void* data, size_t bytes) const {
  // Compared as integers: a pointer into another object is not ordered
  // against data() by the language.
  const auto p = reinterpret_cast<uintptr_t>(data),
             base = reinterpret_cast<uintptr_t>(file_->data());
  const size_t size = file_->size();
  if (p < base || p - base > size || bytes > size - (p - base)) return std::nullopt;
  const size_t offset = p - base;
  return LendRef{static_cast<uint32_t>(::getpid()), file_->fd(), file_->id(), size, offset, bytes};
}

LendReader::LendReader(size_t max_mapped) : max_mapped_(max_mapped) {}

LendReader::~LendReader() {
  std::lock_guard lock(mu_);
  while (!lru_.empty())
    drop(lru_.begin());
}

void LendReader::drop(std::list<Mapping>::iterator it) {
  mapped_ -= it->id.block_bytes;
  lru_.erase(it);
}

Status LendReader::copy(const LendRef& r, void* dst) {
  std::shared_ptr<const std::byte> range;
  if (Status st = pin(r, &range); !st) return st;
  // Outside the lock: copies from several threads run at once, and a
  // mapping dropped meanwhile stays until this copy is over.
  if (r.bytes) std::memcpy(dst, range.get(), r.bytes);
  return Status::ok();
}

Status LendReader::pin(const LendRef& r, std::shared_ptr<const std::byte>* range) {
  std::shared_ptr<const std::byte> block;
  if (Status st = map(r, &block); !st) return st;
  // Aliasing: shares the mapping's count, so dropping it from the LRU (or
  // forget()) leaves a pinned range mapped.
  *range = std::shared_ptr<const std::byte>(block, block.get() + r.offset);
  metrics::add(metrics::Counter::kNetLentBytes, static_cast<int64_t>(r.bytes));
  return Status::ok();
}

Status LendReader::map(const LendRef& r, std::shared_ptr<const std::byte>* block) {
  std::lock_guard lock(mu_);
  auto same_block = [&](const Mapping& m) {
    return m.id.pid == r.pid && m.id.fd == r.fd && m.id.token == r.token &&
           m.id.block_bytes == r.block_bytes;
  };
  auto it = std::find_if(lru_.begin(), lru_.end(), same_block);
  if (it == lru_.end()) {
    // A descriptor number now naming another block was closed by its owner:
    // its old mapping only keeps freed memory alive.
    for (auto m = lru_.begin(); m != lru_.end();) {
      auto next = std::next(m);
      if (m->id.pid == r.pid && m->id.fd == r.fd) drop(m);
      m = next;
    }
    const std::string want = memfd_link(r.token);
    const std::string path = fmt::format("/proc/{}/fd/{}", r.pid, r.fd);
    // Looked at before opening (and opened non-blocking): a descriptor that
    // is a FIFO or a device is never opened, so it cannot block us.
    if (std::string first = read_link(path); first != want)
      return refused(r, first.empty() ? fmt::format("no {}", path)
                                      : fmt::format("it is '{}', not the block named", first));
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    if (!fd.valid()) return refused(r, fmt::format("open {}: {}", path, std::strerror(errno)));
    // Checked on the descriptor we hold: what it names cannot change now.
    const std::string got = read_link(fmt::format("/proc/self/fd/{}", fd.get()));
    if (got != want) return refused(r, fmt::format("it is '{}', not the block named", got));
    // Its owner cannot shrink it under our mapping (which would fault us).
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK) || !(seals & F_SEAL_SEAL))
      return refused(r, "it is not sealed against shrinking");
    std::unique_ptr<ShmFile> file;
    if (Status st = ShmFile::adopt(std::move(fd), path, r.block_bytes, ShmMapping{}, &file); !st)
      return refused(r, st.message());
    std::shared_ptr<ShmFile> mapped(std::move(file));
    lru_.push_front(Mapping{r, std::shared_ptr<const std::byte>(mapped, mapped->data())});
    lru_.front().id.offset = lru_.front().id.bytes = 0;
    mapped_ += r.block_bytes;
    while (mapped_ > max_mapped_ && lru_.size() > 1)
      drop(std::prev(lru_.end()));
    it = lru_.begin();
  } else if (it != lru_.begin()) {
    lru_.splice(lru_.begin(), lru_, it);
    it = lru_.begin();
  }
  *block = it->data;
  return Status::ok();
}

void LendReader::forget(uint32_t pid) {
  std::lock_guard lock(mu_);
  for (auto m = lru_.begin(); m != lru_.end();) {
    auto next = std::next(m);
    if (m->id.pid == pid) drop(m);
    m = next;
  }
}

size_t LendReader::mapped_bytes() const {
  std::lock_guard lock(mu_);
  return mapped_;
}

}  // namespace pushpull::transport
