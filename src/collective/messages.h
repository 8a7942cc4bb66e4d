// SPDX-License-Identifier: Apache-2.0
// The engine's control messages: what a rank announces to rank 0 (the
// coordinator) and the responses rank 0 broadcasts, with their encoding.
// Encoded with transport/wire.h (little-endian). Decoding checks every length and
// value and never trusts a peer's counts for allocation beyond the buffer.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pushpull/array.h"
#include "pushpull/collective.h"
#include "pushpull/error.h"

namespace pushpull::collective {

enum class OpType : uint8_t {
  kAllreduce = 0,
  kBroadcast = 1,
  kAllgather = 2,
  kReduceScatter = 3,
  kBarrier = 4
};
std::string_view op_type_name(OpType t);

// What identifies an op across ranks; every rank must submit the same one.
struct Spec {
  std::string name;
  OpType type = OpType::kAllreduce;
  DType dtype = DType::kFloat32;
  Reduction reduction = Reduction::kSum;
  int32_t root = 0;
  Shape shape;
  // A process set (Horovod's): the ranks taking part, sorted, without
  // duplicates; empty means every rank. The others take part in the algorithm
  // as a joined rank does (identity, zero rows), without submitting.
  std::vector<int32_t> members;
  // Allreduce: the result times this factor (Horovod's postscale_factor; on
  // top of kAverage's 1/n), applied by the algorithm. Negotiated like the
  // rest: every rank applies the same factor (the arena scales a block on
  // the rank that reduces it). Finite.
  double postscale = 1.0;

  // Whether `rank` takes part (a member, or every rank when members is empty).
  bool includes(int rank) const;

  // numel * dtype size; throws InvalidArgument on overflow (decoded specs
  // never overflow: the decoder rejects them).
  size_t bytes() const;
  // Whether two ranks' specs describe the same op (allgather: first dims may differ).
  bool compatible(const Spec& o) const;
  friend bool operator==(const Spec& a, const Spec& b);
  // "allreduce float32(2, 3) sum".
  std::string describe() const;
};

inline constexpr uint32_t kNoCacheId = 0xffffffffu;

// rank -> rank 0.
struct Announce {
  std::vector<Spec> specs;       // first submissions (or changed ones)
  std::vector<uint32_t> cached;  // submissions whose spec rank 0 cached under this id
  bool join = false;             // after the above
};

// child -> parent in the negotiation tree (negotiation_tree.h): what the
// child's subtree announced since its last message. Every rank named lies in
// the sender's subtree (the receiver checks).
struct UpSpec {
  int32_t rank = 0;  // who submitted it (uncached: passes up unchanged)
  Spec spec;
};
struct UpCached {
  uint32_t id = kNoCacheId;
  // whole: every member of the sender's subtree submitted `id` but `ranks`,
  // which had joined. Otherwise exactly `ranks` submitted it (a stalled or
  // conflicting tensor, passed up rank by rank), the oldest `held_ms` ago.
  bool whole = true;
  uint32_t held_ms = 0;
  std::vector<int32_t> ranks;
};
struct Upward {
  std::vector<UpSpec> specs;
  std::vector<UpCached> cached;
  std::vector<int32_t> joins;  // ranks that joined, after the above
  bool empty() const { return specs.empty() && cached.empty() && joins.empty(); }
};

struct ResponseTensor {
  std::string name;
  uint32_t cache_id = kNoCacheId;
  bool has_spec = false;  // false: spec is cache[cache_id] on every rank
  Spec spec;
};

// rank 0 -> every rank, executed in order by all.
struct Response {
  enum class Kind : uint8_t { kExecute = 0, kError = 1, kJoinDone = 2 };
  Kind kind = Kind::kExecute;
  std::vector<ResponseTensor> tensors;  // several: a fused allreduce
  std::vector<int32_t> joined;          // ranks contributing the identity
  std::vector<int64_t> rows;            // allgather: every rank's first dimension
  ErrorCode code = ErrorCode::kOk;      // kError
  std::string message;                  // kError
};

// Decoders are pure functions of the bytes and the group size (for rank and
// root checks): ProtocolError on truncated, trailing or out-of-range input,
// leaving *out untouched. The string_view forms throw that status instead.
std::string encode(const Announce& a);
Status decode_announce(std::span<const std::byte> in, int size, Announce* out);
Announce decode_announce(std::string_view bytes, int size);
std::string encode(const Upward& u);
Status decode_upward(std::span<const std::byte> in, int size, Upward* out);
Upward decode_upward(std::string_view bytes, int size);
std::string encode(const std::vector<Response>& rs);
Status decode_responses(std::span<const std::byte> in, int size, std::vector<Response>* out);
std::vector<Response> decode_responses(std::string_view bytes, int size);

}  // namespace pushpull::collective
