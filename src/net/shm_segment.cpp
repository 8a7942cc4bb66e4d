// SPDX-License-Identifier: Apache-2.0
#include "net/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "net/hello.h"
#include "net/socket.h"
#include "net/wire.h"

namespace pushpull::net {
namespace {

constexpr uint64_t kSegMagic = 0x4d485354454e5050;  // "PPNETSHM"
constexpr uint32_t kSegVersion = 1;
constexpr size_t kTokenAt = 24;

std::string hex(const std::byte* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i)
    s += fmt::format("{:02x}", static_cast<unsigned>(p[i]));
  return s;
}

std::string path_of(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

// Whether the segment file `name` in directory `dirfd` names a creator pid
// that no longer exists, or has no header at all: its creator died between
// creating the name and writing the header, microseconds that the caller's
// two minutes long exceed (false when the file cannot be opened).
bool creator_gone(int dirfd, const char* name) {
  Fd fd(::openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return false;
  std::array<std::byte, 16> head{};
  if (::pread(fd.get(), head.data(), head.size(), 0) != 16) return true;
  if (load_le<uint64_t>(head.data()) != kSegMagic) return true;
  const auto pid = static_cast<pid_t>(load_le<uint32_t>(head.data() + 12));
  return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

int ShmSegment::sweep_stale(const std::string& dir, std::chrono::seconds older_than,
                            std::chrono::seconds orphan_after) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  const time_t now = ::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    if (!valid_name(e->d_name)) continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    const time_t age = now - st.st_mtime;
    if (age < orphan_after.count()) continue;
    if (age < older_than.count() && !creator_gone(::dirfd(d), e->d_name)) continue;
    if (::unlinkat(::dirfd(d), e->d_name, 0) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

bool ShmSegment::valid_name(const std::string& name) {
  const std::string prefix = kShmNamePrefix;
  if (name.size() != kShmNameBytes || name.compare(0, prefix.size(), prefix) != 0) return false;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    char ch = name[i];
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  }
  return true;
}

Status ShmSegment::create(size_t ring_bytes, const std::string& dir,
                          std::unique_ptr<ShmSegment>* out) {
  if (ring_bytes < kShmMinRingBytes || ring_bytes > kShmMaxRingBytes || ring_bytes % 4096 != 0) {
    return {ErrorCode::kInvalidArgument,
            fmt::format("ring size {} is not a multiple of 4 KiB in [{}, {}]", ring_bytes,
                        kShmMinRingBytes, kShmMaxRingBytes)};
  }
  std::unique_ptr<ShmSegment> s(new ShmSegment);
  s->dir_ = dir;
  s->ring_bytes_ = ring_bytes;
  s->map_bytes_ = kShmHeaderBytes + ring_bytes;
  s->token_ = random_nonce();
  Nonce id = random_nonce();
  s->name_ = kShmNamePrefix + hex(id.data(), 16);
  const std::string path = path_of(dir, s->name_);
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return {ErrorCode::kIoError, fmt::format("cannot create {}: {}", path, std::strerror(errno))};
  }
  s->linked_ = true;  // from here the destructor removes it on failure
  if (::ftruncate(fd.get(), static_cast<off_t>(s->map_bytes_)) != 0) {
    return {ErrorCode::kIoError, fmt::format("cannot size {}: {}", path, std::strerror(errno))};
  }
  // Populated now, at the setup: otherwise every first pass over the ring
  // takes a page fault per 4 KiB on both sides, on the message path.
  void* p = ::mmap(nullptr, s->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                   fd.get(), 0);
  if (p == MAP_FAILED) {
    return {ErrorCode::kIoError, fmt::format("cannot map {}: {}", path, std::strerror(errno))};
  }
  s->base_ = static_cast<std::byte*>(p);
  store_le<uint64_t>(s->base_, kSegMagic);
  store_le<uint32_t>(s->base_ + 8, kSegVersion);
  store_le<uint32_t>(s->base_ + 12, static_cast<uint32_t>(::getpid()));  // for sweep_stale
  store_le<uint64_t>(s->base_ + 16, ring_bytes);
  std::memcpy(s->base_ + kTokenAt, s->token_.data(), s->token_.size());
  *out = std::move(s);
  return Status::ok();
}

Status ShmSegment::open(const std::string& name, const std::string& dir,
                        std::unique_ptr<ShmSegment>* out) {
  if (!valid_name(name)) {
    return {ErrorCode::kProtocolError, "the segment name is not one pushpull makes"};
  }
  const std::string path = path_of(dir, name);
  Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    return {ErrorCode::kIoError,
            fmt::format("cannot open {}: {} (not on this host?)", path, std::strerror(errno))};
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return {ErrorCode::kIoError, fmt::format("{} is not a regular file", path)};
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return {ErrorCode::kIoError,
            fmt::format("{} belongs to another user or is open to others (mode {:o})", path,
                        st.st_mode & 0777)};
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < kShmHeaderBytes + kShmMinRingBytes || size > kShmHeaderBytes + kShmMaxRingBytes) {
    return {ErrorCode::kProtocolError, fmt::format("{} has an impossible size {}", path, size)};
  }
  std::unique_ptr<ShmSegment> s(new ShmSegment);
  s->dir_ = dir;
  s->name_ = name;
  s->map_bytes_ = static_cast<size_t>(size);
  void* p = ::mmap(nullptr, s->map_bytes_, PROT_READ, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) {
    return {ErrorCode::kIoError, fmt::format("cannot map {}: {}", path, std::strerror(errno))};
  }
  s->base_ = static_cast<std::byte*>(p);
  const uint64_t ring = load_le<uint64_t>(s->base_ + 16);
  if (load_le<uint64_t>(s->base_) != kSegMagic || load_le<uint32_t>(s->base_ + 8) != kSegVersion ||
      ring != size - kShmHeaderBytes || ring % 4096 != 0) {
    return {ErrorCode::kProtocolError,
            fmt::format("{} has no valid pushpull segment header", path)};
  }
  s->ring_bytes_ = static_cast<size_t>(ring);
  std::memcpy(s->token_.data(), s->base_ + kTokenAt, s->token_.size());
  *out = std::move(s);
  return Status::ok();
}

ShmSegment::~ShmSegment() {
  unlink();
  if (base_ != nullptr) ::munmap(base_, map_bytes_);
}

void ShmSegment::unlink() {
  if (!linked_) return;
  linked_ = false;
  ::unlink(path_of(dir_, name_).c_str());
}

void ShmSegment::write(uint64_t pos, const void* src, size_t n) {
  const size_t at = static_cast<size_t>(pos % ring_bytes_);
  const size_t first = std::min(n, ring_bytes_ - at);
  std::byte* ring = base_ + kShmHeaderBytes;
  std::memcpy(ring + at, src, first);
  if (n > first) std::memcpy(ring, static_cast<const std::byte*>(src) + first, n - first);
}

void ShmSegment::read(uint64_t pos, void* dst, size_t n) const {
  const size_t at = static_cast<size_t>(pos % ring_bytes_);
  const size_t first = std::min(n, ring_bytes_ - at);
  const std::byte* ring = base_ + kShmHeaderBytes;
  std::memcpy(dst, ring + at, first);
  if (n > first) std::memcpy(static_cast<std::byte*>(dst) + first, ring, n - first);
}

}  // namespace pushpull::net
