// SPDX-License-Identifier: Apache-2.0
// Same host, same user: the one discovery and proof both engines decide by
// whether two processes may move data through shared memory (the PS's
// offer and answer, transport/shm/shm_setup.h; the collectives' grouping,
// transport/shm/shm_host.h).
//
// The key: the kernel's boot id (host names repeat across containers), the
// host name, the network and PID namespaces, the device and inode of the
// segment directory (a private /dev/shm differs) and the effective uid. Two
// network-namespace "hosts" of one kernel are separate hosts on purpose:
// they stand for machines, and the links between them are what such a setup
// measures (tests and `bench ... --netns`). Equal keys are necessary, not
// sufficient.
//
// The proof: a HostRecord {key, a file's id, its content} names a file its
// sender made in the segment directory (a transport::ShmFile: O_EXCL, 0600,
// unguessable name) and the 16 random bytes prove() wrote into it. A
// verifier that finds that file in its own directory, as its own user's
// private regular file of the expected size, holding that content, knows
// the sender runs on its host as its user: nobody else can make such a
// file there. verify() is the one place every refusal is made (another
// key, a missing file, another user's or a shared one, a symlink or FIFO,
// another size, other content). Records travel only over authenticated
// connections; files are fresh per setup and unlinked once verified, so an
// old record names nothing.
//
// Thread safety: thread-safe. The key is read afresh at every call (a few
// small files): a process may enter another namespace after it started, and
// a forked child may make its own.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pushpull/error.h"
#include "transport/shm/shm_file.h"

namespace pushpull::transport {

// "boot id|host name|net N|pid P".
std::string host_identity();

// host_identity(), "|dir " the directory's inode, "|uid " the effective uid
// (cut to 255 bytes, as records carry it).
std::string host_key(const std::string& dir);

// "device:inode" of `path`, "?" when it cannot be stat()ed.
std::string inode_of(const std::string& path);

struct HostRecord {
  std::string key;  // host_key(dir) of the sender
  ShmId file{};     // the proof file's id: its name is the kind's prefix + hex
  ShmId content{};  // what the file holds at the form's offset
  bool operator==(const HostRecord&) const = default;
};

// Fixed size (the collectives gather records of equal width). decode() is
// bounds-checked: a wrong size, version, key length or a nonzero pad is a
// ProtocolError.
inline constexpr size_t kHostRecordBytes = 292;
std::vector<std::byte> encode(const HostRecord& r);
Status decode(std::span<const std::byte> in, HostRecord* out);

// Which files prove, and where their content lies.
struct ProofForm {
  ShmKind kind;
  uint64_t min_bytes = 0, max_bytes = 0;
  size_t content_at = 0;  // 16 bytes from here lie within min_bytes
};

// Writes fresh random content at form.content_at of `file` (this process's,
// made by ShmFile::create under `dir`) and returns the record naming it.
HostRecord prove(const std::string& dir, const ShmFile& file, const ProofForm& form);

// Whether `peer`'s record is proven in `dir` (see above); on success *out
// holds the file, mapped as `map` asks. Refusals: kNotFound (no such file),
// kIoError (another user's, open to others, not a regular file, or another
// host's key), kProtocolError (another size or other content).
Status verify(const std::string& dir, const HostRecord& peer, const ProofForm& form, ShmMapping map,
              std::unique_ptr<ShmFile>* out);

}  // namespace pushpull::transport
