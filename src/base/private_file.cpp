// SPDX-License-Identifier: Apache-2.0
#include "base/private_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::base {
namespace {

[[noreturn]] void fail(std::string_view what, const std::string& path, const std::string& why) {
  throw IoError(fmt::format("{}: refusing to write '{}': {}", what, path, why));
}

[[noreturn]] void fail_errno(std::string_view what, const std::string& path, std::string_view op) {
  const int err = errno;
  if (err == ELOOP) fail(what, path, "it is a symbolic link (pushpull never writes through one)");
  fail(what, path, fmt::format("{}: {}", op, std::strerror(err)));
}

std::string owner_problem(const struct stat& st) {
  if (st.st_uid != ::geteuid())
    return fmt::format("it is owned by uid {}, not by this user (uid {})", st.st_uid, ::geteuid());
  return "";
}

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Refuses `path` when it, or a directory on its way, is a symbolic link
// that another user (not root) owns: in a shared sticky directory (/tmp)
// anyone may plant one at a name the job will use (the kernel's
// fs.protected_symlinks, often off, would refuse it too). This user's own
// links (to a scratch volume) are followed.
void refuse_foreign_links(std::string_view what, const std::string& path) {
  for (size_t at = path.find('/', 1);; at = path.find('/', at + 1)) {
    const std::string prefix = at == std::string::npos ? path : path.substr(0, at);
    struct stat link {};
    if (!prefix.empty() && ::lstat(prefix.c_str(), &link) == 0 && S_ISLNK(link.st_mode) &&
        link.st_uid != ::geteuid() && link.st_uid != 0)
      fail(what, prefix, fmt::format("it is a symbolic link owned by uid {}", link.st_uid));
    if (at == std::string::npos) return;
  }
}

// 64 random bits for a temporary name: O_EXCL does the protecting, the
// randomness only keeps concurrent writers and leftovers from colliding.
std::string random_suffix() {
  uint64_t r = 0;
  if (::getrandom(&r, sizeof r, 0) != static_cast<ssize_t>(sizeof r))
    r = static_cast<uint64_t>(::getpid()) << 32 ^ static_cast<uint64_t>(::time(nullptr));
  return fmt::format("{:016x}", r);
}

bool write_all(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

int open_private_for_write(const std::string& path, std::string_view what) {
  refuse_foreign_links(what, parent_of(path));
  // No O_TRUNC: the file is checked before anything in it is lost.
  // O_NONBLOCK: a FIFO planted at the name cannot block the open.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
  if (fd < 0) {
    // Another user's symlink in a sticky directory may fail with EACCES
    // (protected_symlinks, some kernels) rather than ELOOP: say what it is.
    const int err = errno;
    struct stat link {};
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
      errno = ELOOP;
    else
      errno = err;
    fail_errno(what, path, "open");
  }
  struct stat st {};
  std::string why;
  if (::fstat(fd, &st) != 0)
    why = fmt::format("fstat: {}", std::strerror(errno));
  else if (!S_ISREG(st.st_mode))
    why = "it is not a regular file";
  else if (why = owner_problem(st); !why.empty()) {
  } else if (st.st_nlink != 1)
    why = fmt::format("it has {} hard links", st.st_nlink);
  else if (::ftruncate(fd, 0) != 0)
    why = fmt::format("truncate: {}", std::strerror(errno));
  else if ((st.st_mode & 07777) != 0600 && ::fchmod(fd, 0600) != 0)
    why = fmt::format("chmod 0600: {}", std::strerror(errno));
  else if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
    why = fmt::format("fcntl: {}", std::strerror(errno));
  if (!why.empty()) {
    ::close(fd);
    fail(what, path, why);
  }
  return fd;
}

std::FILE* fopen_private(const std::string& path, std::string_view what) {
  int fd = open_private_for_write(path, what);
  std::FILE* f = ::fdopen(fd, "w");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    errno = err;
    fail_errno(what, path, "fdopen");
  }
  return f;
}

void write_private_file(const std::string& path, std::string_view bytes, std::string_view what,
                        bool durable) {
  refuse_foreign_links(what, parent_of(path));
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    // A symlink of this user is replaced (not followed) by the rename; one
    // of another user, like their file, is refused.
    if (std::string why = owner_problem(st); !why.empty()) fail(what, path, why);
    if (S_ISDIR(st.st_mode)) fail(what, path, "it is a directory");
  }
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    tmp = fmt::format("{}.tmp-{}", path, random_suffix());
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) fail_errno(what, tmp, "create");
  auto give_up = [&](std::string_view op) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = err;
    fail_errno(what, tmp, op);
  };
  if (!write_all(fd, bytes)) give_up("write");
  if (durable && ::fsync(fd) != 0) give_up("fsync");
  if (::close(fd) != 0) {
    fd = -1;
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    fail_errno(what, tmp, "close");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    fail_errno(what, path, "rename");
  }
  if (durable) {
    int dfd = ::open(parent_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);  // the rename itself survives a crash
      ::close(dfd);
    }
  }
}

void make_private_dirs(const std::string& dir, std::string_view what) {
  if (dir.empty()) return;
  // Each prefix ending before a '/', then the whole path; never through a
  // link another user planted on the way.
  refuse_foreign_links(what, dir);
  for (size_t at = dir.find('/', 1);; at = dir.find('/', at + 1)) {
    const std::string prefix = at == std::string::npos ? dir : dir.substr(0, at);
    if (!prefix.empty() && prefix != "." && prefix != "..") {
      if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) fail_errno(what, prefix, "mkdir");
    }
    if (at == std::string::npos) break;
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) fail_errno(what, dir, "stat");
  // A symlink of this user or root (e.g. to a scratch volume) is theirs to
  // make; one planted by another user is not followed.
  if (S_ISLNK(st.st_mode)) {
    if (st.st_uid != ::geteuid() && st.st_uid != 0)
      fail(what, dir, fmt::format("it is a symbolic link owned by uid {}", st.st_uid));
    if (::stat(dir.c_str(), &st) != 0) fail_errno(what, dir, "stat");
  }
  if (!S_ISDIR(st.st_mode)) fail(what, dir, "it is not a directory");
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    fail(what, dir,
         fmt::format("the directory is owned by uid {}, not by this user (uid {}) or root",
                     st.st_uid, ::geteuid()));
}

}  // namespace pushpull::base
