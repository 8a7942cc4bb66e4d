// SPDX-License-Identifier: Apache-2.0
// The elastic rendezvous protocol between the launcher (the driver, which
// outlives every worker: elastic::RendezvousServer) and each worker process
// (elastic::Client), over one authenticated net connection per worker that
// lasts the worker's whole life. docs/elastic.md explains the rounds.
//
//   worker -> driver  kJoinType      {worker id, mesh host, mesh port}: put me
//                                    in the next round
//   driver -> worker  kAssignType    {round, rank, hosts stamp, book}: the
//                                    round's members, in rank order
//   driver -> worker  kDeclineType   flags = error code, payload = why: no
//                                    round for you (the job ends, or you are
//                                    not a live member of this job)
//   driver -> worker  kMemberGoneType {round, why}: a member of `round` died;
//                                    fail that round's operations now
//   driver -> worker  kHostsType     {stamp}: the host set changed (a worker
//                                    was added): re-form at the next commit
//
// Every decoder is bounds-checked; a malformed message is a ProtocolError
// Status (the connection is closed, never the job).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collective/store.h"
#include "pushpull/error.h"

namespace pushpull::collective::elastic {

// Net's collective range (128..191); 128..135 are the mesh's and bootstrap's.
inline constexpr uint16_t kJoinType = 140;
inline constexpr uint16_t kAssignType = 141;
inline constexpr uint16_t kDeclineType = 142;
inline constexpr uint16_t kMemberGoneType = 143;
inline constexpr uint16_t kHostsType = 144;

struct JoinRequest {
  std::string worker_id;
  std::string host;
  int port = 0;
};

struct Assignment {
  uint64_t round = 0;
  int rank = 0;
  uint64_t hosts_stamp = 0;  // the newest host change this round already includes
  AddressList book;          // by rank
  int size() const { return static_cast<int>(book.size()); }
};

struct MemberGone {
  uint64_t round = 0;
  std::string why;
};

std::vector<std::byte> encode(const JoinRequest& j);
Status decode(const std::byte* data, size_t n, JoinRequest* out);
std::vector<std::byte> encode(const Assignment& a);
Status decode(const std::byte* data, size_t n, Assignment* out);
std::vector<std::byte> encode(const MemberGone& g);
Status decode(const std::byte* data, size_t n, MemberGone* out);
std::vector<std::byte> encode_stamp(uint64_t stamp);
Status decode_stamp(const std::byte* data, size_t n, uint64_t* stamp);

// The mesh's job id of round `round`: a member of another round cannot
// complete the mesh's hello (net checks the job id), so no stale member can
// join a round it is not in.
std::string round_job_id(const std::string& job_id, uint64_t round);

}  // namespace pushpull::collective::elastic
