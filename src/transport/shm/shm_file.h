// SPDX-License-Identifier: Apache-2.0
// The one way pushpull makes, opens, maps and removes shared memory: the
// PS's rings (shm_segment.h), lent blocks (lend.h), the collectives'
// segments and host probes (transport/shm/shm_transport*, shm_host.h).
//
// A file of a kind (its name prefix) under a directory (/dev/shm, tmpfs):
// - create(): O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600, named prefix + 32
//   hex digits of 128 random bits (id(): nobody can create it first), or a
//   name whose randomness the caller owns (create_named); its pages
//   reserved (posix_fallocate: a full /dev/shm is an IoError here, never a
//   SIGBUS on a later write); mapped read-write;
// - open(): a peer's file, only when its name has the kind's form (no path)
//   and it is a regular file (no symlink followed, a FIFO never blocks the
//   open) owned by this effective user, with no group/other bits, of the
//   size the caller expects; mapped read-only or read-write;
// - unlink() once the peers mapped it (the destructor does if nobody did);
//   sweep_stale(): names of a kind that killed processes left behind.
// create_memfd() makes an anonymous file, named alike and sealed at its
// size; adopt() maps a descriptor (another process's, via /proc) after the
// owner and size checks.
//
// Errors: kIoError (the system refused, or not this user's private file),
// kProtocolError (a name or size pushpull never makes), kNotFound (no such
// name yet). Ownership and thread safety: a ShmFile owns its mapping, its
// name until unlink() and a memfd's descriptor; it is immutable apart from
// unlink(); its memory is the caller's to synchronise.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/hex.h"
#include "pushpull/error.h"
#include "transport/socket.h"

namespace pushpull::transport {

using ShmId = std::array<std::byte, 16>;

// Names of a kind: `prefix` + `hex_digits` lowercase hex digits, or
// (hex_digits 0) + 1..96 characters of [0-9a-z.-].
struct ShmKind {
  std::string_view prefix;
  size_t hex_digits = 32;
};

// A name is linked only while its setup runs (bounded by a connect or
// start-up timeout): one older than this was left by a process killed in
// that window, and the next setup on the host removes it (sweep_stale).
inline constexpr std::chrono::seconds kShmStaleAfter{3600};

struct ShmMapping {
  bool writable = false;
  bool populate = false;  // MAP_POPULATE: page faults at the setup, not on the message path
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
  // Sized, not reserved: a memfd lives on the kernel's internal tmpfs, which
  // has no size limit to hit. Keeps its descriptor (fd()).
  static Status create_memfd(const ShmKind& kind, size_t bytes, std::unique_ptr<ShmFile>* out);
  // Maps `fd` (taken) when it is this user's regular file of `bytes`.
  static Status adopt(Fd fd, const std::string& what, uint64_t bytes, ShmMapping map,
                      std::unique_ptr<ShmFile>* out);

  static bool valid_name(std::string_view name, const ShmKind& kind);
  // Removes this user's regular files of `kind` modified `older_than` ago,
  // or `orphan_after` ago when `creator_gone(read-only fd)`; returns how many.
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
  // Checks `fd` (a regular file of this user, of a size in [min, max],
  // private when `private_mode`) and maps it.
  Status check_and_map(int fd, const std::string& path, uint64_t min, uint64_t max,
                       bool private_mode, ShmMapping map);
  Status map_fd(int fd, const std::string& path, ShmMapping map);
  std::string dir_, name_;
  bool linked_ = false;  // we created the name and it is still there
  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
  ShmId id_{};
  Fd fd_;
};

// Whether no process `pid` exists (a creator or peer that died).
bool process_gone(int pid);

}  // namespace pushpull::transport
