// SPDX-License-Identifier: Apache-2.0
// The one way pushpull makes, opens, maps and removes shared memory: the
// PS's payload rings (net/shm_segment.h), lent blocks (net/lend.h), the
// collectives' segments (collective/shm_transport*) and their host probes
// (collective/shm_host.h) are all ShmFiles. The security-critical code is
// here once.
//
// A file of a kind (its name prefix) under a directory (/dev/shm, tmpfs):
// - create(): O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600, named prefix + 32
//   hex digits of 128 random bits (id(); unguessable, so nobody creates it
//   first: a squat), or a name the caller chose (create_named, whose
//   randomness the caller owns); its pages reserved up front
//   (posix_fallocate: a full /dev/shm is an IoError here, never a SIGBUS on
//   a later write), mapped read-write;
// - open(): a peer's file, only when its name has the kind's form (no
//   path), it is a regular file (never through a symlink) owned by this
//   effective user, without group/other permission bits, and of the size
//   the caller expects; mapped read-only or read-write;
// - unlink(): the creator removes the name once its peers mapped it (the
//   destructor does if nobody did), so nothing outlives the processes;
// - sweep_stale(): names of a kind left by processes killed before they
//   unlinked them (this user's regular files only, symlinks not followed).
// create_memfd() makes an anonymous file (memfd_create) with the same
// naming and sealed against resizing; adopt() maps a descriptor another
// process's /proc entry gave (lend.h) after the same owner and size checks.
//
// Errors are Status values: kIoError when the system refuses or the file is
// not this user's private file, kProtocolError for a name or size pushpull
// would never make, kNotFound when the name does not exist (yet).
//
// Ownership and thread safety: a ShmFile owns its mapping, its name until
// unlink() (creator only) and, for a memfd, its descriptor; destruction
// unmaps and unlinks a name still linked. Its memory is the caller's to
// synchronise; the object itself is immutable apart from unlink().
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "net/socket.h"
#include "pushpull/error.h"

namespace pushpull::net {

using ShmId = std::array<std::byte, 16>;

// A kind of file: names are `prefix` + exactly `hex_digits` lowercase hex
// digits, or (hex_digits 0) + 1..96 characters of [0-9a-z.-].
struct ShmKind {
  std::string_view prefix;
  size_t hex_digits = 32;
};

struct ShmMapping {
  bool writable = false;
  // Fault every page in at the setup (MAP_POPULATE) instead of on the
  // message path.
  bool populate = false;
};

class ShmFile {
 public:
  static Status create(const std::string& dir, const ShmKind& kind, size_t bytes, ShmMapping map,
                       std::unique_ptr<ShmFile>* out);
  static Status create_named(const std::string& dir, const std::string& name, const ShmKind& kind,
                             size_t bytes, ShmMapping map, std::unique_ptr<ShmFile>* out);
  // Opens `dir`/`name` when it passes the checks above and its size is in
  // [min_bytes, max_bytes] (equal: exact).
  static Status open(const std::string& dir, const std::string& name, const ShmKind& kind,
                     uint64_t min_bytes, uint64_t max_bytes, ShmMapping map,
                     std::unique_ptr<ShmFile>* out);
  // An anonymous file named like create()'s, sized (not reserved: memfds
  // live on the kernel's internal tmpfs, which has no size limit to hit)
  // and sealed against shrinking and growing; keeps its descriptor (fd()).
  static Status create_memfd(const ShmKind& kind, size_t bytes, std::unique_ptr<ShmFile>* out);
  // Maps the open descriptor `fd` (taken) when it is a regular file owned
  // by this effective user, exactly `bytes` long; `what` names it in errors.
  static Status adopt(Fd fd, const std::string& what, uint64_t bytes, ShmMapping map,
                      std::unique_ptr<ShmFile>* out);

  static bool valid_name(std::string_view name, const ShmKind& kind);
  // Removes from `dir` this user's regular files of `kind` last modified at
  // least `older_than` ago, or at least `orphan_after` ago when
  // `creator_gone` (given a read-only descriptor of the file) says so.
  // Returns how many it removed.
  static int sweep_stale(const std::string& dir, const ShmKind& kind,
                         std::chrono::seconds older_than,
                         std::chrono::seconds orphan_after = std::chrono::seconds{0},
                         const std::function<bool(int fd)>& creator_gone = nullptr);

  ~ShmFile();
  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;

  std::byte* data() const { return base_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }
  const ShmId& id() const { return id_; }  // create() and create_memfd() only
  int fd() const { return fd_.get(); }     // create_memfd() only; else -1
  // Removes the name (creator only; idempotent).
  void unlink();

 private:
  ShmFile() = default;
  Status map_fd(int fd, const std::string& path, ShmMapping map);
  std::string dir_, name_;
  bool linked_ = false;  // we created the name and it is still there
  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
  ShmId id_{};
  Fd fd_;
};

// 2 * n lowercase hex digits.
std::string to_hex(const std::byte* p, size_t n);

}  // namespace pushpull::net
