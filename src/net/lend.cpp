// SPDX-License-Identifier: Apache-2.0
#include "net/lend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/metrics.h"
#include "net/hello.h"
#include "net/wire.h"

namespace pushpull::net {
namespace {

std::string hex(const LendToken& t) {
  std::string s;
  for (std::byte b : t)
    s += fmt::format("{:02x}", static_cast<unsigned>(b));
  return s;
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

Status LendBlock::create(size_t bytes, std::unique_ptr<LendBlock>* out) {
  std::unique_ptr<LendBlock> b(new LendBlock());
  Nonce n = random_nonce();
  std::memcpy(b->token_.data(), n.data(), b->token_.size());
  const std::string name = kLendNamePrefix + hex(b->token_);
  b->fd_ = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (b->fd_ < 0) {
    return {ErrorCode::kIoError, fmt::format("memfd_create: {}", std::strerror(errno))};
  }
  if (::ftruncate(b->fd_, static_cast<off_t>(bytes)) != 0) {
    return {ErrorCode::kIoError,
            fmt::format("ftruncate {} bytes: {}", bytes, std::strerror(errno))};
  }
  // Sealed at its size: a reader's mapping can never lose its pages (a
  // shrunk file would fault the reader), and the reader checks the seals.
  if (::fcntl(b->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return {ErrorCode::kIoError, fmt::format("sealing: {}", std::strerror(errno))};
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd_, 0);
  if (p == MAP_FAILED) {
    return {ErrorCode::kIoError, fmt::format("mmap {} bytes: {}", bytes, std::strerror(errno))};
  }
  b->data_ = static_cast<std::byte*>(p);
  b->bytes_ = bytes;
  *out = std::move(b);
  return Status::ok();
}

LendBlock::~LendBlock() {
  if (data_) ::munmap(data_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

std::optional<LendRef> LendBlock::ref(const void* data, size_t bytes) const {
  // Compared as integers: a pointer into another object is not ordered
  // against data_ by the language.
  const auto p = reinterpret_cast<uintptr_t>(data), base = reinterpret_cast<uintptr_t>(data_);
  if (p < base || p - base > bytes_ || bytes > bytes_ - (p - base)) return std::nullopt;
  const size_t offset = p - base;
  return LendRef{static_cast<uint32_t>(::getpid()), fd_, token_, bytes_, offset, bytes};
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
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return refused(r, fmt::format("open {}: {}", path, std::strerror(errno)));
    // Checked on the descriptor we hold: what it names cannot change now.
    const std::string got = read_link(fmt::format("/proc/self/fd/{}", fd));
    struct stat st {};
    // Owned by this user as well: a root reader never maps another
    // user's memory, whatever the token says.
    const bool size_ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
                         static_cast<uint64_t>(st.st_size) == r.block_bytes;
    // Its owner cannot shrink it under our mapping (which would fault us).
    const int seals = ::fcntl(fd, F_GET_SEALS);
    const bool sealed = seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_SEAL);
    if (got != want || !size_ok || !sealed) {
      ::close(fd);
      return refused(r, got != want ? fmt::format("it is '{}', not the block named", got)
                        : !size_ok  ? std::string("its owner or size is not the block's")
                                    : std::string("it is not sealed against shrinking"));
    }
    void* p = ::mmap(nullptr, r.block_bytes, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) return refused(r, fmt::format("mmap: {}", std::strerror(err)));
    const size_t bytes = r.block_bytes;
    lru_.push_front(Mapping{r, std::shared_ptr<const std::byte>(
                                   static_cast<const std::byte*>(p), [bytes](const std::byte* q) {
                                     ::munmap(const_cast<std::byte*>(q), bytes);
                                   })});
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

}  // namespace pushpull::net
