// SPDX-License-Identifier: Apache-2.0
// One direction of a connection's same-host shared-memory path: a ring of
// payload bytes in a file under /dev/shm (tmpfs), written by the node that
// created it and read by its peer (transport/shm/shm_setup.h has the protocol).
//
// Layout: a 4 KiB header page {magic u64, version u32, creator pid u32, ring
// bytes u64, proof content 16 bytes} (little-endian) and then the ring. The
// segment is its own proof of the same host (transport/host_identity.h): its
// creator's record (record(): key, id, the content prove() wrote) travels
// in the setup, and the peer maps it only once verify() found it.
//
// Security: the file is a transport::ShmFile (transport/shm/shm_file.h has the checks:
// O_EXCL | O_NOFOLLOW, mode 0600, an unguessable name "pushpull-net-" + 32
// hex digits, pages reserved; a peer's opened only when it is this user's
// private regular file) and mapped read-only by the peer. Its creator
// unlinks the name as soon as the peer proved it mapped it (or when the
// setup ends otherwise), so nothing is left behind and nobody else can
// open it afterwards. open() also checks the header (magic, version, ring
// size matching the file's). A name left behind by a process killed during
// the setup (before its peer's proof) is removed when a MessageTransport
// with shared memory next starts on this host (sweep_stale): once its
// creator is gone (or it never got a header) and it is two minutes old, or
// in any case once it is an hour old.
//
// The ring is a transport::ShmRing (transport/shm/shm_ring.h): positions are byte offsets
// into an endless stream, carried in the TCP frames, never in the segment.
//
// Ownership and thread safety: a ShmSegment owns its mapping and (creator)
// the name until unlink(); destruction unmaps and unlinks a name still
// linked. The object is not synchronised: the MessageTransport guards each one.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "pushpull/error.h"
#include "transport/host_identity.h"
#include "transport/shm/shm_file.h"
#include "transport/shm/shm_ring.h"

namespace pushpull::transport {

inline constexpr size_t kShmHeaderBytes = 4096;
inline constexpr size_t kShmMinRingBytes = 64 << 10;
inline constexpr size_t kShmMaxRingBytes = size_t{1} << 30;
inline constexpr char kShmNamePrefix[] = "pushpull-net-";
inline constexpr ShmKind kShmSegmentKind{kShmNamePrefix, 32};
// ... and one whose creator (the pid in its header) no longer exists, or
// with no header at all, is removed once this old: a setup takes
// milliseconds, and this is longer than the default connect timeout
// bounding it (30 s).
inline constexpr std::chrono::seconds kShmOrphanAfter{120};

class ShmSegment {
 public:
  // Creates a fresh segment of `ring_bytes` (a multiple of 4 KiB within
  // [kShmMinRingBytes, kShmMaxRingBytes]) in `dir`, and its record, into
  // *out. On failure an error saying why (no /dev/shm, out of space, ...;
  // InvalidArgument for a ring size out of range), *out untouched.
  static Status create(size_t ring_bytes, const std::string& dir, std::unique_ptr<ShmSegment>* out);
  // Maps, read-only, the segment `peer`'s record names in `dir` once
  // verify() proved it (its refusals), and checks the header, into *out.
  static Status open(const HostRecord& peer, const std::string& dir,
                     std::unique_ptr<ShmSegment>* out);
  // True when `name` has the form create() gives (no path separators).
  static bool valid_name(const std::string& name);
  // Removes from `dir` the segments of this user, of valid_name() form,
  // last modified at least `older_than` ago, or at least `orphan_after` ago
  // when the creator pid in their header no longer exists or they have no
  // header (regular files only, symlinks not followed). MessageTransport::start() calls it with
  // kShmStaleAfter and kShmOrphanAfter when shared memory is on. Returns how
  // many it removed.
  static int sweep_stale(const std::string& dir, std::chrono::seconds older_than,
                         std::chrono::seconds orphan_after = kShmOrphanAfter);

  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& name() const { return file_->name(); }
  const HostRecord& record() const { return record_; }  // the creator's
  size_t ring_bytes() const { return ring_.size(); }
  // Removes the name (creator only; idempotent).
  void unlink() { file_->unlink(); }

  // Copies `n` <= ring_bytes() bytes to / from stream position `pos`.
  void write(uint64_t pos, const void* src, size_t n) { ring_.copy_in(pos, src, n); }
  void read(uint64_t pos, void* dst, size_t n) const { ring_.copy_out(pos, dst, n); }

 private:
  explicit ShmSegment(std::unique_ptr<ShmFile> file);
  std::unique_ptr<ShmFile> file_;
  ShmRing ring_;
  HostRecord record_;
};

}  // namespace pushpull::transport
