// SPDX-License-Identifier: Apache-2.0
#include "base/secret_file.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <openssl/rand.h>

#include "base/hex.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

namespace pushpull::base {
namespace {

constexpr size_t kSecretBytes = 32;
constexpr size_t kMaxFileBytes = 4096;

// A place that cannot be made (no home, read-only home): the caller may
// fall back. Permission problems of an existing secret are never this.
struct PlaceError : IoError {
  using IoError::IoError;
};

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string parent_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The directory that holds the secret: created 0700 (parents too, as XDG
// asks), or, when it exists, owned by this uid and not writable by others:
// anyone who can write it could swap the file.
void ensure_private_dir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT)
      throw PlaceError(fmt::format("cannot use the directory {} for the job secret: {}", dir,
                                   errno_text(errno)));
    std::string parent = parent_of(dir);
    if (parent != dir) {
      struct stat pst {};
      if (::stat(parent.c_str(), &pst) != 0) ensure_private_dir(parent);
    }
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      throw PlaceError(fmt::format("cannot create the directory {} for the job secret: {}", dir,
                                   errno_text(errno)));
    if (::lstat(dir.c_str(), &st) != 0)
      throw PlaceError(fmt::format("cannot use the directory {} for the job secret: {}", dir,
                                   errno_text(errno)));
  }
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode))
    throw InvalidArgument(fmt::format(
        "{} (which should hold the job secret) is not a directory (a symbolic link or a file); "
        "remove it, or set PUSHPULL_SECRET_FILE to another place",
        dir));
  if (st.st_uid != ::geteuid())
    throw InvalidArgument(
        fmt::format("the directory {} (which should hold the job secret) is owned by uid {}, not "
                    "by you (uid {}); remove it, or set PUSHPULL_SECRET_FILE to another place",
                    dir, st.st_uid, ::geteuid()));
  if ((st.st_mode & 022) != 0)
    throw InvalidArgument(fmt::format(
        "the directory {} (which holds the job secret) is writable by group or others (mode "
        "{:04o}); run: chmod 700 {}",
        dir, st.st_mode & 07777, dir));
}

// Opens `path` for reading without following a symbolic link. Returns the
// descriptor, or -1 with errno set (ENOENT: missing; ELOOP: a symbolic
// link); throws InvalidArgument when the file is not private to this user.
int open_private(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  auto refuse = [&](const std::string& what) {
    ::close(fd);
    throw InvalidArgument(what);
  };
  if (!S_ISREG(st.st_mode))
    refuse(fmt::format("the job secret file {} is not a regular file; remove it", path));
  if (st.st_uid != ::geteuid())
    refuse(fmt::format(
        "the job secret file {} is owned by uid {}, not by you (uid {}): someone else may know "
        "it; remove it (a new one is made) or set PUSHPULL_JOB_SECRET",
        path, st.st_uid, ::geteuid()));
  if ((st.st_mode & 077) != 0)
    refuse(fmt::format(
        "the job secret file {} is readable or writable by group or others (mode {:04o}); it "
        "must be private to you: run chmod 600 {} (and consider the secret known: remove the "
        "file to get a new one)",
        path, st.st_mode & 07777, path));
  return fd;
}

std::string read_fd(int fd, const std::string& path) {
  std::string data;
  char buf[512];
  while (data.size() <= kMaxFileBytes) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw IoError(fmt::format("cannot read the job secret file {}: {}", path, errno_text(err)));
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (data.size() > kMaxFileBytes)
    throw IoError(
        fmt::format("the job secret file {} is larger than {} bytes", path, kMaxFileBytes));
  // One line: the trailing newline (and a CR of an edited file) is not part of it.
  auto end = data.find_first_of("\r\n");
  if (end != std::string::npos) data.resize(end);
  if (data.empty())
    throw IoError(
        fmt::format("the job secret file {} is empty; remove it (a new one is made) "
                    "or write a secret into it",
                    path));
  return data;
}

// Writes a fresh secret to an O_EXCL temporary file next to `path` and
// links it to `path` unless another process got there first. Returns true
// when this call created `path`.
bool create_secret(const std::string& path) {
  const std::string dir = parent_of(path);
  ensure_private_dir(dir);
  unsigned char raw[kSecretBytes];
  if (RAND_bytes(raw, sizeof raw) != 1)
    throw IoError("cannot make a job secret: OpenSSL RAND_bytes failed");
  unsigned char tag[8];
  if (RAND_bytes(tag, sizeof tag) != 1)
    throw IoError("cannot make a job secret: OpenSSL RAND_bytes failed");
  const std::string tmp = fmt::format("{}/.secret.{}.{}", dir, ::getpid(), to_hex(tag, sizeof tag));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    throw PlaceError(
        fmt::format("cannot create the job secret file in {}: {}", dir, errno_text(errno)));
  const std::string line = to_hex(raw, sizeof raw) + "\n";
  bool ok = ::fchmod(fd, 0600) == 0;  // whatever the umask
  for (size_t off = 0; ok && off < line.size();) {
    ssize_t n = ::write(fd, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      ok = false;
    else
      off += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  int err = ok ? 0 : errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    throw PlaceError(fmt::format("cannot write the job secret file {}: {}", tmp, errno_text(err)));
  }
  // link() never replaces: a racing process that linked first wins and
  // everyone reads its secret. Filesystems without hard links get
  // renameat2(RENAME_NOREPLACE), which is just as exclusive.
  bool created = ::link(tmp.c_str(), path.c_str()) == 0;
  err = created ? 0 : errno;
  if (!created && err != EEXIST) {
#ifdef SYS_renameat2
    constexpr unsigned kNoReplace = 1;  // RENAME_NOREPLACE
    created =
        ::syscall(SYS_renameat2, AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), kNoReplace) == 0;
    err = created ? 0 : errno;
#endif
  }
  ::unlink(tmp.c_str());
  if (!created && err != EEXIST)
    throw PlaceError(
        fmt::format("cannot create the job secret file {}: {}", path, errno_text(err)));
  if (created) {
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);  // the name survives a crash too
      ::close(dfd);
    }
  }
  return created;
}

std::string home_dir(const Environment& env) {
  if (auto h = env.get("HOME"); h && !h->empty()) return *h;
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &found) == 0 && found &&
      found->pw_dir && *found->pw_dir)
    return found->pw_dir;
  return {};
}

}  // namespace

std::string user_secret_path(const Environment& env) {
  if (auto p = env.get("PUSHPULL_SECRET_FILE"); p && !p->empty()) return *p;
  // XDG: a relative XDG_CONFIG_HOME is invalid and ignored.
  if (auto x = env.get("XDG_CONFIG_HOME"); x && !x->empty() && (*x)[0] == '/')
    return *x + "/pushpull/secret";
  std::string home = home_dir(env);
  if (home.empty()) return {};
  return home + "/.config/pushpull/secret";
}

std::string fallback_secret_path() {
  return fmt::format("/tmp/pushpull-{}/secret", ::geteuid());
}

std::string read_secret_file(const std::string& path) {
  int fd = open_private(path);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP)
      throw InvalidArgument(fmt::format(
          "the job secret file {} is a symbolic link; secrets are not read through links "
          "(someone else may control its target): point PUSHPULL_JOB_SECRET_FILE at a regular "
          "file (a Kubernetes Secret volume presents its keys as links: mount the key with "
          "subPath, docs/launch.md \"Kubernetes\")",
          path));
    throw IoError(fmt::format("cannot open the job secret file {}: {}", path, errno_text(err)));
  }
  return read_fd(fd, path);
}

UserSecret load_or_create_secret(const std::string& path) {
  UserSecret out;
  out.path = path;
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fd = open_private(path);
    if (fd >= 0) {
      out.secret = read_fd(fd, path);
      return out;
    }
    if (errno != ENOENT) {
      if (errno == ELOOP)
        throw InvalidArgument(fmt::format(
            "the job secret file {} is a symbolic link; secrets are not read through links "
            "(someone else may control its target): remove it",
            path));
      if (errno == ENOTDIR || errno == EACCES)
        throw PlaceError(
            fmt::format("cannot open the job secret file {}: {}", path, errno_text(errno)));
      throw IoError(fmt::format("cannot open the job secret file {}: {}", path, errno_text(errno)));
    }
    out.created = create_secret(path) || out.created;
  }
  throw IoError(fmt::format("the job secret file {} keeps disappearing", path));
}

UserSecret user_secret(const Environment& env) {
  const bool configured = env.get("PUSHPULL_SECRET_FILE").value_or("").size() > 0;
  const std::string path = user_secret_path(env);
  std::string why;
  if (!path.empty()) {
    try {
      return load_or_create_secret(path);
    } catch (const PlaceError& e) {
      if (configured) throw;
      why = e.what();
    }
  } else {
    if (configured) throw InvalidArgument("PUSHPULL_SECRET_FILE is empty");
    why = "neither HOME nor XDG_CONFIG_HOME is set and this user has no home directory";
  }
  UserSecret out = load_or_create_secret(fallback_secret_path());
  out.fallback = true;
  static std::once_flag once;
  std::call_once(once, [&] {
    PP_WARN(
        "{}; using the per-host job secret {} instead (jobs across hosts then need the same "
        "PUSHPULL_JOB_SECRET or PUSHPULL_JOB_SECRET_FILE on every host)",
        why, out.path);
  });
  return out;
}

}  // namespace pushpull::base
