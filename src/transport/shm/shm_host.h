// SPDX-License-Identifier: Apache-2.0
// Which ranks of a job can move data through shared memory: host identity
// with a proof (used by use_shared_memory, shm_data_transport.h).
//
// A rank's identity (HostRecord) is the kernel's boot id, the host name, the
// network and PID namespaces' inodes, the device and inode of the
// segment directory, and the effective uid, plus a probe file it created in
// that directory (a transport::ShmFile, transport/shm/shm_file.h: mode 0600, random name,
// random content). Ranks with equal
// keys are candidates for one group; the proof is that each candidate can
// open every other candidate's probe (ShmFile::open's checks: this user's
// private regular file, 16 bytes) with the advertised content, and that it
// could reserve the bytes its segment will need (a second file, held until
// remove()). Two network-namespace "hosts" of one
// kernel are separate hosts (their keys differ): the links between them are
// the point of such a setup.
//
// The records and the proofs travel over the job's authenticated TCP mesh;
// every rank computes the same groups from the same matrix (shm_group).
//
// Thread safety: functions are pure or touch only their own probe file.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/host_identity.h"
#include "transport/shm/shm_file.h"

namespace pushpull::transport {

using Bytes16 = std::array<uint8_t, 16>;

struct HostRecord {
  std::string key;    // boot id, host name, namespaces, directory, uid
  Bytes16 probe{};    // the probe file's name (hex) under the directory
  Bytes16 content{};  // what the probe file holds
  Bytes16 token{};    // names the group's segments when this rank leads it
};

// Fixed-size wire form (kHostRecordBytes); decode() throws ProtocolError on
// a record that is not well formed (no NUL-terminated key, bad version).
inline constexpr size_t kHostRecordBytes = 256;
std::vector<uint8_t> encode(const HostRecord& r);
HostRecord decode_host_record(const uint8_t* data, size_t bytes);

// This process's key for segments under `dir` (the PS's offers carry the
// same key, transport/host_identity.h).
using transport::host_key;

// This rank's probe: created (random name and content) by the constructor,
// removed by the destructor. Throws IoError when it cannot be created.
class HostProbe {
 public:
  explicit HostProbe(const std::string& dir);
  ~HostProbe();
  HostProbe(const HostProbe&) = delete;
  HostProbe& operator=(const HostProbe&) = delete;

  const HostRecord& record() const { return record_; }
  // Reserves `bytes` in the directory (as the segment will) until remove();
  // false when it has no room.
  bool reserve(size_t bytes);
  // Frees the probe and the reservation (before the segments are made).
  void remove();
  // Whether `peer`'s probe is visible here: same user, private, its content.
  bool sees(const HostRecord& peer) const;

 private:
  std::string dir_;
  HostRecord record_;
  std::unique_ptr<transport::ShmFile> probe_, reserved_;
};

// Removes probes and segments (use_shared_memory's names) that processes
// killed during a setup left in `dir`, once an hour old (transport/shm/shm_file.h).
// Returns how many.
int sweep_stale_files(const std::string& dir);

// The group of `rank` (the job's ranks, ascending) given every rank's record
// and proof row (proof[i][j]: rank i saw rank j's probe and, for j == i,
// reserved its bytes): the ranks with rank's key, when every one of them
// proved every other; empty when rank has no group (alone on its host, or a
// proof failed). Every rank computes the same answer from the same inputs.
std::vector<int> shm_group(const std::vector<HostRecord>& records,
                           const std::vector<std::vector<uint8_t>>& proof, int rank);

// The ranks with rank's key (before any proof), ascending.
std::vector<int> same_key(const std::vector<HostRecord>& records, int rank);

}  // namespace pushpull::transport
