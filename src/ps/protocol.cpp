// SPDX-License-Identifier: Apache-2.0
#include "ps/protocol.h"

#include <cstdio>

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "transport/wire.h"

namespace pushpull::ps {

uint64_t unwrap_seq(uint32_t low, uint64_t near) {
  uint64_t base = near - near % kWrap;
  uint64_t best = base + low;
  for (uint64_t c : {best + kWrap, best >= kWrap ? best - kWrap : best}) {
    uint64_t d_best = best > near ? best - near : near - best;
    uint64_t d_c = c > near ? c - near : near - c;
    if (d_c < d_best) best = c;
  }
  return best;
}

std::vector<std::byte> encode_init(std::string_view name, std::span<const std::byte> value,
                                   int32_t home) {
  transport::Writer w;
  w.reserve(6 + std::min(name.size(), kMaxKeyName) + value.size());
  w.str<uint16_t>(name.substr(0, kMaxKeyName)).u<int32_t>(home).bytes(value);
  return w.take();
}

Status decode_init(std::span<const std::byte> in, std::string* name,
                   std::span<const std::byte>* value, int32_t* home) {
  transport::Reader r(in);
  std::string n = r.str<uint16_t>(kMaxKeyName);
  int32_t h = r.u<int32_t>();
  std::span<const std::byte> v = r.rest();
  if (!r.ok())
    return Status(
        ErrorCode::kProtocolError,
        fmt::format("init payload of {} bytes does not start with a key name", in.size()));
  *name = std::move(n);
  *value = v;
  if (home) *home = h;
  return Status::ok();
}

std::vector<std::byte> encode_replica_meta(const ReplicaState& s) {
  transport::Writer w;
  w.str<uint16_t>(std::string_view(s.name).substr(0, kMaxKeyName)).u<int32_t>(s.home);
  w.u<uint32_t>(static_cast<uint32_t>(s.applied_seq.size()));
  for (uint64_t a : s.applied_seq)
    w.u<uint64_t>(a);
  w.str<uint64_t>(s.optimizer_states);
  if (!s.behind.empty()) {  // backup workers only: the b = 0 form is unchanged
    w.u<uint32_t>(static_cast<uint32_t>(s.behind.size()));
    for (uint64_t b : s.behind)
      w.u<uint64_t>(b);
  }
  return w.take();
}

Status decode_replica_meta(std::span<const std::byte> in, int max_workers, ReplicaState* s) {
  transport::Reader r(in);
  ReplicaState out;
  out.name = r.str<uint16_t>(kMaxKeyName);
  out.home = r.u<int32_t>();
  uint32_t n = r.u<uint32_t>();
  if (!r.ok() || n > static_cast<uint32_t>(std::max(0, max_workers)))
    return Status(
        ErrorCode::kProtocolError,
        fmt::format("replica of a part names {} workers; the job has {}", n, max_workers));
  for (uint32_t i = 0; i < n && r.ok(); ++i)
    out.applied_seq.push_back(r.u<uint64_t>());
  out.optimizer_states = r.str<uint64_t>(in.size());
  if (r.ok() && r.remaining() > 0) {  // backup workers: rounds behind per worker
    uint32_t b = r.u<uint32_t>();
    if (!r.ok() || b != n || b == 0)  // (none behind: no tail)
      return Status(ErrorCode::kProtocolError, "malformed replica metadata (rounds behind)");
    for (uint32_t i = 0; i < b && r.ok(); ++i)
      out.behind.push_back(r.u<uint64_t>());
  }
  if (!r.done()) return Status(ErrorCode::kProtocolError, "malformed replica metadata");
  *s = std::move(out);
  return Status::ok();
}

std::vector<std::byte> encode_lent_replica(const transport::LendRef& ref, const ReplicaState& s) {
  std::vector<std::byte> out = transport::encode_lend_ref(ref);
  std::vector<std::byte> meta = encode_replica_meta(s);
  out.insert(out.end(), meta.begin(), meta.end());
  return out;
}

Status decode_lent_replica(std::span<const std::byte> in, int max_workers, transport::LendRef* ref,
                           ReplicaState* s) {
  if (in.size() < transport::kLendRefBytes)
    return Status(ErrorCode::kProtocolError,
                  fmt::format("lent replica of {} bytes: shorter than its reference", in.size()));
  transport::LendRef r;
  if (Status st = transport::decode_lend_ref(in.first(transport::kLendRefBytes), &r); !st)
    return st;
  if (Status st = decode_replica_meta(in.subspan(transport::kLendRefBytes), max_workers, s); !st)
    return st;
  *ref = r;
  return Status::ok();
}

std::vector<std::byte> encode_ranges(const std::vector<Range>& ranges) {
  transport::Writer w;
  w.reserve(ranges.size() * kRangeBytes);
  for (const Range& r : ranges)
    w.u<int64_t>(r.begin).u<int64_t>(r.count);
  return w.take();
}

Status decode_ranges(std::span<const std::byte> in, std::vector<Range>* ranges) {
  if (in.size() % kRangeBytes != 0)
    return Status(ErrorCode::kProtocolError,
                  fmt::format("pull payload of {} bytes is not a list of ranges", in.size()));
  transport::Reader r(in);
  std::vector<Range> out;
  out.reserve(in.size() / kRangeBytes);
  while (r.ok() && !r.at_end()) {
    Range x{r.u<int64_t>(), r.u<int64_t>()};
    if (x.begin < 0 || x.count < 0 || x.count > std::numeric_limits<int64_t>::max() - x.begin)
      return Status(ErrorCode::kProtocolError,
                    fmt::format("pull range (begin {}, count {}) is negative or overflows", x.begin,
                                x.count));
    out.push_back(x);
  }
  if (!r.done()) return Status(ErrorCode::kProtocolError, "malformed pull ranges");
  *ranges = std::move(out);
  return Status::ok();
}

std::string encode_mode(const Mode& mode) {
  if (!mode.sync) return "async";
  if (mode.backup_workers == 0) return "sync";
  return fmt::format("sync backup={} max_late={}", mode.backup_workers, mode.backup_max_late);
}

Status decode_mode(std::string_view text, Mode* mode) {
  Mode m;
  if (text == "async") {
    m.sync = false;
  } else if (text != "sync") {
    int backup = -1, late = -1, used = 0;
    const std::string t(text);
    if (std::sscanf(t.c_str(), "sync backup=%d max_late=%d%n", &backup, &late, &used) != 2 ||
        used != static_cast<int>(t.size()) || backup < 0 || late < 1)
      return {ErrorCode::kInvalidArgument,
              fmt::format("mode must be sync, async or 'sync backup=B max_late=L', got '{}'",
                          t.substr(0, 64))};
    m.backup_workers = backup;
    m.backup_max_late = late;
  }
  *mode = m;
  return Status::ok();
}

std::vector<std::byte> encode_rejoin(uint64_t applied_seq, uint64_t accepted_seq) {
  transport::Writer w;
  w.u<uint64_t>(applied_seq);
  w.u<uint64_t>(accepted_seq);
  return w.take();
}

Status decode_rejoin(std::span<const std::byte> in, uint64_t* applied_seq, uint64_t* accepted_seq) {
  if (in.size() < kRejoinHeadBytes)
    return {ErrorCode::kProtocolError,
            fmt::format("rejoin reply of {} bytes, shorter than its {}-byte head", in.size(),
                        kRejoinHeadBytes)};
  transport::Reader r(in.first(kRejoinHeadBytes));
  *applied_seq = r.u<uint64_t>();
  *accepted_seq = r.u<uint64_t>();
  if (!r.done() || *applied_seq > *accepted_seq)
    return {ErrorCode::kProtocolError, "malformed rejoin reply"};
  return {};
}

}  // namespace pushpull::ps
