// SPDX-License-Identifier: Apache-2.0
// Which ranks of a job can move data through shared memory (used by
// use_shared_memory, shm_data_transport.h), by the same-host proof of both
// engines (transport/host_identity.h).
//
// Each rank makes a probe: a 16-byte transport::ShmFile in the segment directory,
// whose record (transport::prove) it sends with a token for its segment's name.
// Ranks with equal keys are candidates for one group; the proof is that each
// candidate verifies every other's record (transport::verify, the PS's check of a
// ring's record too) and could reserve the bytes its segment will need (a
// second file, held until remove()). A probe of its own comes first because
// the segment's size depends on the group the probes decide.
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

// What every rank sends: its host record and the token that names its
// segment when it joins a group.
struct RankRecord {
  HostRecord host;
  Bytes16 token{};
};

// Fixed size; decode_rank_record throws ProtocolError on a malformed one.
inline constexpr size_t kRankRecordBytes = kHostRecordBytes + 16;
std::vector<uint8_t> encode(const RankRecord& r);
RankRecord decode_rank_record(const uint8_t* data, size_t bytes);

// This rank's probe: created (random name and content) by the constructor,
// removed by the destructor. Throws IoError when it cannot be created.
class HostProbe {
 public:
  explicit HostProbe(const std::string& dir);
  ~HostProbe();
  HostProbe(const HostProbe&) = delete;
  HostProbe& operator=(const HostProbe&) = delete;

  const RankRecord& record() const { return record_; }
  // Reserves `bytes` in the directory (as the segment will) until remove();
  // false when it has no room.
  bool reserve(size_t bytes);
  // Frees the probe and the reservation (before the segments are made).
  void remove();
  // Whether transport::verify proves `peer`'s record here.
  bool sees(const RankRecord& peer) const;

 private:
  std::string dir_;
  RankRecord record_;
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
std::vector<int> shm_group(const std::vector<RankRecord>& records,
                           const std::vector<std::vector<uint8_t>>& proof, int rank);

// The ranks with rank's key (before any proof), ascending.
std::vector<int> same_key(const std::vector<RankRecord>& records, int rank);

}  // namespace pushpull::transport
