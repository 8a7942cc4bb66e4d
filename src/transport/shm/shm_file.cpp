// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "transport/hello.h"

namespace pushpull::transport {
namespace {

std::string path_of(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

ShmId random_id() {
  const Nonce n = random_nonce();
  ShmId id{};
  std::memcpy(id.data(), n.data(), id.size());
  return id;
}

Status io_error(const std::string& what, const std::string& path, int err) {
  return {ErrorCode::kIoError, fmt::format("cannot {} {}: {}", what, path, std::strerror(err))};
}

}  // namespace

bool process_gone(int pid) {
  return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
}

bool ShmFile::valid_name(std::string_view name, const ShmKind& kind) {
  if (name.size() <= kind.prefix.size() || name.substr(0, kind.prefix.size()) != kind.prefix)
    return false;
  const std::string_view rest = name.substr(kind.prefix.size());
  if (kind.hex_digits > 0) {
    if (rest.size() != kind.hex_digits) return false;
    for (char ch : rest)
      if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
    return true;
  }
  if (rest.size() > 96) return false;
  for (char ch : rest)
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || ch == '.' || ch == '-'))
      return false;
  return true;
}

Status ShmFile::map_fd(int fd, const std::string& path, ShmMapping map) {
  const int prot = PROT_READ | (map.writable ? PROT_WRITE : 0);
  void* p = ::mmap(nullptr, bytes_, prot, MAP_SHARED | (map.populate ? MAP_POPULATE : 0), fd, 0);
  if (p == MAP_FAILED) return io_error("map", path, errno);
  base_ = static_cast<std::byte*>(p);
  return Status::ok();
}

Status ShmFile::create(const std::string& dir, const ShmKind& kind, size_t bytes, ShmMapping map,
                       std::unique_ptr<ShmFile>* out) {
  const ShmId id = random_id();
  Status st = create_named(dir, std::string(kind.prefix) + to_hex(id.data(), id.size()),
                           ShmKind{kind.prefix, 0}, bytes, map, out);
  if (st) (*out)->id_ = id;
  return st;
}

Status ShmFile::create_named(const std::string& dir, const std::string& name, const ShmKind& kind,
                             size_t bytes, ShmMapping map, std::unique_ptr<ShmFile>* out) {
  if (!valid_name(name, kind) || bytes == 0)
    return {ErrorCode::kInvalidArgument,
            fmt::format("no shared-memory file '{}' of {} bytes is made", name, bytes)};
  std::unique_ptr<ShmFile> f(new ShmFile);
  f->dir_ = dir;
  f->name_ = name;
  f->bytes_ = bytes;
  const std::string path = path_of(dir, name);
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return io_error("create", path, errno);
  f->linked_ = true;  // from here the destructor removes it on failure
  // Reserved now: a full /dev/shm is a clean error here, not a SIGBUS on
  // the first write into a page nobody could provide.
  if (int e = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); e != 0)
    return {ErrorCode::kIoError,
            fmt::format("cannot size {} to {} bytes: {}", path, bytes, std::strerror(e))};
  map.writable = true;
  if (Status st = f->map_fd(fd.get(), path, map); !st) return st;
  *out = std::move(f);
  return Status::ok();
}

Status ShmFile::open(const std::string& dir, const std::string& name, const ShmKind& kind,
                     uint64_t min_bytes, uint64_t max_bytes, ShmMapping map,
                     std::unique_ptr<ShmFile>* out) {
  if (!valid_name(name, kind))
    return {ErrorCode::kProtocolError, "the shared-memory file's name is not one pushpull makes"};
  const std::string path = path_of(dir, name);
  // Non-blocking: a FIFO at the name must not block us in open().
  Fd fd(::open(path.c_str(),
               (map.writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    const int err = errno;
    return {err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIoError,
            fmt::format("cannot open {}: {} (not on this host?)", path, std::strerror(err))};
  }
  std::unique_ptr<ShmFile> f(new ShmFile);
  f->dir_ = dir;
  f->name_ = name;
  if (Status s = f->check_and_map(fd.get(), path, min_bytes, max_bytes, true, map); !s) return s;
  *out = std::move(f);
  return Status::ok();
}

Status ShmFile::check_and_map(int fd, const std::string& path, uint64_t min, uint64_t max,
                              bool private_mode, ShmMapping map) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return {ErrorCode::kIoError, fmt::format("{} is not a regular file; refusing it", path)};
  // Owned by this user even when we are root: never another user's memory.
  if (st.st_uid != ::geteuid() || (private_mode && (st.st_mode & 077) != 0))
    return {ErrorCode::kIoError,
            fmt::format("{} belongs to another user or is open to others (mode {:o}); refusing it",
                        path, st.st_mode & 0777)};
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < min || size > max || size == 0)
    return {ErrorCode::kProtocolError,
            fmt::format("{} has size {}, not {}", path, size,
                        min == max ? fmt::format("{}", min) : fmt::format("{}..{}", min, max))};
  bytes_ = static_cast<size_t>(size);
  return map_fd(fd, path, map);
}

Status ShmFile::create_memfd(const ShmKind& kind, size_t bytes, std::unique_ptr<ShmFile>* out) {
  std::unique_ptr<ShmFile> f(new ShmFile);
  f->id_ = random_id();
  f->name_ = std::string(kind.prefix) + to_hex(f->id_.data(), f->id_.size());
  f->bytes_ = bytes;
  f->fd_.reset(::memfd_create(f->name_.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!f->fd_.valid())
    return {ErrorCode::kIoError, fmt::format("memfd_create: {}", std::strerror(errno))};
  if (::ftruncate(f->fd_.get(), static_cast<off_t>(bytes)) != 0)
    return {ErrorCode::kIoError,
            fmt::format("ftruncate {} bytes: {}", bytes, std::strerror(errno))};
  // Sealed at its size: a reader's mapping can never lose its pages (a
  // shrunk file would fault the reader), and the reader checks the seals.
  if (::fcntl(f->fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return {ErrorCode::kIoError, fmt::format("sealing: {}", std::strerror(errno))};
  if (Status st = f->map_fd(f->fd_.get(), f->name_, ShmMapping{.writable = true}); !st) return st;
  *out = std::move(f);
  return Status::ok();
}

Status ShmFile::adopt(Fd fd, const std::string& what, uint64_t bytes, ShmMapping map,
                      std::unique_ptr<ShmFile>* out) {
  std::unique_ptr<ShmFile> f(new ShmFile);
  if (Status s = f->check_and_map(fd.get(), what, bytes, bytes, false, map); !s)
    return {ErrorCode::kIoError, s.message()};
  *out = std::move(f);
  return Status::ok();
}

int ShmFile::sweep_stale(const std::string& dir, const ShmKind& kind,
                         std::chrono::seconds older_than, std::chrono::seconds orphan_after,
                         const std::function<bool(int fd)>& creator_gone) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  const time_t now = ::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    if (!valid_name(e->d_name, kind)) continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    const time_t age = now - st.st_mtime;
    if (age < older_than.count()) {
      if (!creator_gone || age < orphan_after.count()) continue;
      Fd fd(::openat(::dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
      if (!fd.valid() || !creator_gone(fd.get())) continue;
    }
    if (::unlinkat(::dirfd(d), e->d_name, 0) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

ShmFile::~ShmFile() {
  unlink();
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

void ShmFile::unlink() {
  if (!linked_) return;
  linked_ = false;
  ::unlink(path_of(dir_, name_).c_str());
}

}  // namespace pushpull::transport
