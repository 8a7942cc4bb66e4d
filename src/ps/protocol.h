// SPDX-License-Identifier: Apache-2.0
// Parameter-server messages (types 64..127 of transport/message.h).
//
//   kInit     worker -> server  key = key id, offset/length = slice begin/count
//                               (elements), dtype; payload = u16 name length,
//                               name, then the slice's bytes
//   kPush     worker -> server  key, offset, length, dtype; flags bit 0 =
//                               compressed (payload = compress/compressor.h
//                               wire form: header + codec bytes), else the
//                               slice's bytes; flags bit 5 = pull back
//                               (a pushpull): once the push is applied the
//                               kReply carries the slice's value, exactly
//                               as for a kPull sent right behind the push,
//                               instead of an empty acknowledgement
//   kPull     worker -> server  key; payload empty (the whole slice) or
//                               (i64 begin, i64 count) element ranges,
//                               relative to the slice; flags bit 1 =
//                               rejoin (a restarted worker, docs/ps.md
//                               "Worker restart"): payload empty; the reply
//                               is encode_rejoin's 16 bytes then the value
//   kReply    server -> worker  request_id, key; payload = pulled bytes, or
//                               empty for an acknowledgement; a float32
//                               pull's reply shorter than the value is its
//                               compressed wire form (compress/compressor.h,
//                               docs/kvstore.md "Compressed pulls")
//   kError    server -> worker  request_id, key; flags = ErrorCode; payload =
//                               the message
//   kCommand  worker -> server  key = Command; payload as below; answered by
//                               kReply (with data for kSaveStates) or kError
//   kReplicaMeta  primary -> backup  request_id, key, offset/length = the
//                               part's begin/count, dtype; payload =
//                               encode_replica_meta (name, home, per-worker
//                               applied sequence numbers, optimizer states)
//   kReplicaValue primary -> backup  same request_id; payload = the value
//                               (answered by kReply with that request_id
//                               once installed). With kFlagLent the payload
//                               is a transport::LendRef to the value in the
//                               primary's memory instead (same host); a
//                               backup that cannot read it answers kReply
//                               with kFlagSendBytes, and the primary sends
//                               meta and value again, by value. A backup
//                               that holds the lent range in place answers
//                               with kFlagPinned: the primary then keeps
//                               the range unchanged until the backup's
//                               kReplicaRelease (or its death)
//                               With kFlagLent | kFlagWithMeta there is no
//                               kReplicaMeta: the payload is the LendRef
//                               (transport::kLendRefBytes) then the metadata
//   kReplicaRelease backup -> primary  the kReplicaValue's request_id and
//                               key; payload = its LendRef: the backup
//                               dropped the range it held
//
// Requests from workers carry the sender's placement epoch in flags bits
// 8..31 (mod 2^24); a server holds a request whose epoch it has not reached
// yet until the scheduler's kPlacement arrives. A kPush carries its sequence
// number (the worker's push count for that part, from 1, mod 2^24) in dtype
// bits 8..31; 0 = none. A kInit payload carries the part's home server.
//
// Ordering: one connection per (worker, server) pair, and the transport keeps
// the order of equal-priority messages, so a worker's push and later pull of a
// key reach the server in that order.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ps/server_store.h"
#include "transport/message.h"
#include "transport/shm/lend.h"

namespace pushpull::ps {

namespace msg {
inline constexpr uint16_t kInit = 64;
inline constexpr uint16_t kPush = 65;
inline constexpr uint16_t kPull = 66;
inline constexpr uint16_t kReply = 67;
inline constexpr uint16_t kError = 68;
inline constexpr uint16_t kCommand = 69;
inline constexpr uint16_t kReplicaMeta = 70;
inline constexpr uint16_t kReplicaValue = 71;
// Server rejoin (docs/ps.md "Server rejoin"), between servers:
inline constexpr uint16_t kRejoinRequest = 72;  // rejoined -> live server: send me my ranges
inline constexpr uint16_t kRejoinSetup = 73;    // live -> rejoined: "sync|async\n<optimizer spec>"
inline constexpr uint16_t kRejoinDone = 74;     // live -> rejoined: every range sent and installed
inline constexpr uint16_t kReplicaRelease = 75;
inline constexpr uint16_t kFirst = 64;
inline constexpr uint16_t kLast = 75;
inline constexpr uint32_t kFlagCompressed = 1;
inline constexpr uint32_t kFlagRejoin = 2;
inline constexpr uint32_t kFlagLent = 4;       // kReplicaValue: payload is a transport::LendRef
inline constexpr uint32_t kFlagSendBytes = 8;  // backup's kReply: cannot read lent memory
inline constexpr uint32_t kFlagPinned = 16;    // backup's kReply: holds the lent range in place
inline constexpr uint32_t kFlagPullBack = 32;  // kPush: answer with the value (a pushpull)
inline constexpr uint32_t kFlagWithMeta = 64;  // lent kReplicaValue: the metadata follows the ref
}  // namespace msg

// The kSetMode payload (and the mode line of kRejoinSetup): "sync" or
// "async"; with backup workers (sync only, docs/ps.md "Backup workers")
// "sync backup=B max_late=L". Worker 0's setting is the job's.
struct Mode {
  bool sync = true;
  int backup_workers = 0;
  int backup_max_late = 8;
  bool operator==(const Mode&) const = default;
};
std::string encode_mode(const Mode& mode);
// Refuses anything else (InvalidArgument), including B or L below 0 or 1.
Status decode_mode(std::string_view text, Mode* mode);

// A rejoin reply's head: for the asking worker's rank, the sequence number of
// its last applied push and of its last accepted one (u64 each, little-endian).
inline constexpr size_t kRejoinHeadBytes = 16;
std::vector<std::byte> encode_rejoin(uint64_t applied_seq, uint64_t accepted_seq);
// Bounds-checked: `in` must hold at least the head.
Status decode_rejoin(std::span<const std::byte> in, uint64_t* applied_seq, uint64_t* accepted_seq);

// Header bits of worker requests (see above).
inline constexpr uint64_t kWrap = uint64_t{1} << 24;
inline uint32_t epoch_flags(uint64_t epoch) {
  return static_cast<uint32_t>(epoch % kWrap) << 8;
}
inline uint64_t epoch_of_flags(uint32_t flags) {
  return flags >> 8;
}
inline uint32_t dtype_field(uint32_t dtype, uint64_t seq) {
  return dtype | static_cast<uint32_t>(seq % kWrap) << 8;
}
inline uint32_t seq_of_dtype(uint32_t field) {
  return field >> 8;
}
// The full sequence number whose low 24 bits are `low`, nearest to `near`.
uint64_t unwrap_seq(uint32_t low, uint64_t near);

enum class Command : uint64_t {
  kSetMode = 1,       // payload "sync" or "async"
  kSetOptimizer = 2,  // payload OptimizerSpec::to_string()
  kSaveStates = 3,    // reply payload: the server's optimizer states
  kLoadStates = 4,    // payload: states saved by kSaveStates of the same server
  // A restarted worker 0's set_optimizer: as kSetOptimizer on a server that
  // has none (its predecessor died before sending it), else nothing (the
  // running optimizer and its states stay).
  kSetOptimizerIfAbsent = 5,
};

// Longest key name carried by kInit (longer names are cut by the encoder).
inline constexpr size_t kMaxKeyName = 4096;
// One kPull range: i64 begin, i64 count.
inline constexpr size_t kRangeBytes = 16;

// Payload codecs (transport/wire.h, little-endian). Decoders are pure functions of
// the bytes: ProtocolError on malformed input, outputs untouched then.

// kInit payload: u16 name length, name, i32 home server (-1: unknown), value.
std::vector<std::byte> encode_init(std::string_view name, std::span<const std::byte> value,
                                   int32_t home = -1);
// Splits a kInit payload; ProtocolError when malformed.
Status decode_init(std::span<const std::byte> in, std::string* name,
                   std::span<const std::byte>* value, int32_t* home = nullptr);

// kReplicaMeta payload: u16 name length, name, i32 home, u32 workers, i64
// applied sequence number per worker, u64 length + optimizer states.
// Decoding refuses more than `max_workers` workers.
std::vector<std::byte> encode_replica_meta(const ReplicaState& s);
Status decode_replica_meta(std::span<const std::byte> in, int max_workers, ReplicaState* s);

// kReplicaValue payload with kFlagLent | kFlagWithMeta: the lent value's
// reference (transport::kLendRefBytes), then its kReplicaMeta payload. Decoding
// checks both (transport::decode_lend_ref, decode_replica_meta).
std::vector<std::byte> encode_lent_replica(const transport::LendRef& ref, const ReplicaState& s);
Status decode_lent_replica(std::span<const std::byte> in, int max_workers, transport::LendRef* ref,
                           ReplicaState* s);

// kPull payload. Decoding rejects negative ranges and begin + count
// overflowing int64; whether a range lies inside the value is the store's check.
std::vector<std::byte> encode_ranges(const std::vector<Range>& ranges);
Status decode_ranges(std::span<const std::byte> in, std::vector<Range>* ranges);

}  // namespace pushpull::ps
