// SPDX-License-Identifier: Apache-2.0
// Lending large buffers to a peer on the same host by reference, so the peer
// copies them out in one memcpy instead of the shared-memory ring's two, or
// holds them in place with no copy at all (docs/ps.md, "Replication on one
// host"; the parameter server's replicas are held in place).
//
// A LendBlock is anonymous shared memory (a transport::ShmFile made by
// create_memfd, transport/shm/shm_file.h) named "pushpull-lend-" + 32 random hex
// digits (its id, the token) and mapped read-write by its owner.
// The owner tells a peer a LendRef {pid, fd, token, block size, offset,
// bytes}; LendReader opens /proc/<pid>/fd/<fd>, checks that the file it got
// is a memfd named with that token (read back through its own descriptor, so
// a descriptor closed and reused in between is noticed) and sealed against
// shrinking (so the owner cannot make the reader's mapping fault), then
// hands it to ShmFile::adopt (this user's regular file of that size), which
// maps it read-only and copies the range out, or pins it: keeps a
// reference to the mapping, which keeps the memory even after its owner
// exits. Nothing is named in a filesystem, so nothing is left behind when a
// process dies: the memory goes with its last mapping.
//
// Security: opening another process's descriptor through /proc needs the
// kernel's ptrace read check (same user, not made undumpable), so only a
// process of this user on this host can read a block, and only one that was
// told its descriptor and unguessable token over the job's authenticated
// connection. A reader that cannot open or verify a block (another host,
// another user, a hardened kernel) says so and the owner sends the bytes
// instead; nothing is trusted that the checks above did not prove.
//
// Ownership: a LendBlock owns its descriptor and mapping. The owner must keep
// a lent range unchanged until the reader said it is done with it.
//
// Finding a block from a bare pointer: a BufferPool that lends
// (transport/buffer_pool.h) knows the blocks it carved its buffers from
// (BufferPool::find_lent); a LendBlock answers for its own range
// (LendBlock::ref). There is no process-wide registry: whoever holds the
// memory's pool is asked.
// Thread safety: LendBlock is immutable after create(); ref() and
// LendReader may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pushpull/error.h"
#include "transport/shm/shm_file.h"

namespace pushpull::transport {

using LendToken = std::array<std::byte, 16>;

inline constexpr char kLendNamePrefix[] = "pushpull-lend-";

// What a reader needs to copy a lent range (encode_lend_ref /
// decode_lend_ref: the wire form).
struct LendRef {
  uint32_t pid = 0;
  int32_t fd = -1;
  LendToken token{};
  uint64_t block_bytes = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  bool operator==(const LendRef&) const = default;
};

// Its wire form is always this long.
inline constexpr size_t kLendRefBytes = 48;
std::vector<std::byte> encode_lend_ref(const LendRef& r);
// Bounds-checked: the range lies inside the block, the descriptor is not
// negative, nothing trails.
Status decode_lend_ref(std::span<const std::byte> in, LendRef* out);

class LendBlock {
 public:
  // A block of `bytes` (> 0) in *out, or an IoError saying why none could
  // be made (no memfd_create, out of memory); *out is untouched then.
  static Status create(size_t bytes, std::unique_ptr<LendBlock>* out);
  LendBlock(const LendBlock&) = delete;
  LendBlock& operator=(const LendBlock&) = delete;

  std::byte* data() const { return file_->data(); }
  size_t size() const { return file_->size(); }
  // The LendRef of [data, data + bytes) when that range lies inside this
  // block; nullopt otherwise.
  std::optional<LendRef> ref(const void* data, size_t bytes) const;

 private:
  LendBlock() = default;
  std::unique_ptr<ShmFile> file_;
};

// Copies lent ranges of peers out. Keeps the mappings it made (at most
// `max_mapped` bytes of them, least recently used dropped first), since an
// owner lends the same blocks round after round.
class LendReader {
 public:
  explicit LendReader(size_t max_mapped = size_t{4} << 30);
  ~LendReader();
  LendReader(const LendReader&) = delete;
  LendReader& operator=(const LendReader&) = delete;

  // Copies r.bytes bytes of the lent range to `dst`. An error says why the
  // block could not be read (the owner then sends the bytes).
  Status copy(const LendRef& r, void* dst);
  // Holds the lent range in place instead of copying it: *range points at
  // its first byte, read-only, and keeps the block mapped (and so alive,
  // even after its owner exits) until the last copy of it is dropped. The
  // owner must not change or reuse the range until told the reader let go.
  Status pin(const LendRef& r, std::shared_ptr<const std::byte>* range);
  // Drops every mapping of process `pid` (its owner died or was replaced).
  void forget(uint32_t pid);
  size_t mapped_bytes() const;

 private:
  struct Mapping {
    LendRef id;                             // pid, fd, token, block size
    std::shared_ptr<const std::byte> data;  // unmapped when the last copy using it ends
  };
  void drop(std::list<Mapping>::iterator it);
  // The mapping of r's block, made (and checked) when new.
  Status map(const LendRef& r, std::shared_ptr<const std::byte>* block);
  mutable std::mutex mu_;
  size_t max_mapped_;
  size_t mapped_ = 0;
  std::list<Mapping> lru_;  // front: most recently used
};

}  // namespace pushpull::transport
