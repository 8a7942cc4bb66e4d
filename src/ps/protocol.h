// SPDX-License-Identifier: Apache-2.0
// Parameter-server messages (types 64..127 of net/message.h).
//
//   kInit     worker -> server  key = key id, offset/length = slice begin/count
//                               (elements), dtype; payload = u16 name length,
//                               name, then the slice's bytes
//   kPush     worker -> server  key, offset, length, dtype; flags bit 0 =
//                               compressed (payload = compress/compressor.h
//                               wire form: header + codec bytes), else the
//                               slice's bytes
//   kPull     worker -> server  key; payload empty (the whole slice) or
//                               (i64 begin, i64 count) element ranges,
//                               relative to the slice
//   kReply    server -> worker  request_id, key; payload = pulled bytes, or
//                               empty for an acknowledgement
//   kError    server -> worker  request_id, key; flags = ErrorCode; payload =
//                               the message
//   kCommand  worker -> server  key = Command; payload as below; answered by
//                               kReply (with data for kSaveStates) or kError
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

#include "net/message.h"
#include "ps/server_store.h"

namespace pushpull::ps {

namespace msg {
inline constexpr uint16_t kInit = 64;
inline constexpr uint16_t kPush = 65;
inline constexpr uint16_t kPull = 66;
inline constexpr uint16_t kReply = 67;
inline constexpr uint16_t kError = 68;
inline constexpr uint16_t kCommand = 69;
inline constexpr uint16_t kFirst = 64;
inline constexpr uint16_t kLast = 69;
inline constexpr uint32_t kFlagCompressed = 1;
}  // namespace msg

enum class Command : uint64_t {
  kSetMode = 1,       // payload "sync" or "async"
  kSetOptimizer = 2,  // payload OptimizerSpec::to_string()
  kSaveStates = 3,    // reply payload: the server's optimizer states
  kLoadStates = 4,    // payload: states saved by kSaveStates of the same server
};

// Longest key name carried by kInit (longer names are cut by the encoder).
inline constexpr size_t kMaxKeyName = 4096;
// One kPull range: i64 begin, i64 count.
inline constexpr size_t kRangeBytes = 16;

// Payload codecs (net/wire.h, little-endian). Decoders are pure functions of
// the bytes: ProtocolError on malformed input, outputs untouched then.

// kInit payload.
std::vector<std::byte> encode_init(std::string_view name, std::span<const std::byte> value);
// Splits a kInit payload; ProtocolError when malformed.
Status decode_init(std::span<const std::byte> in, std::string* name,
                   std::span<const std::byte>* value);

// kPull payload. Decoding rejects negative ranges and begin + count
// overflowing int64; whether a range lies inside the value is the store's check.
std::vector<std::byte> encode_ranges(const std::vector<Range>& ranges);
Status decode_ranges(std::span<const std::byte> in, std::vector<Range>* ranges);

}  // namespace pushpull::ps
