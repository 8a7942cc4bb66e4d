// SPDX-License-Identifier: Apache-2.0
#include "ps/protocol.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "net/wire.h"

namespace pushpull::ps {

std::vector<std::byte> encode_init(std::string_view name, std::span<const std::byte> value) {
  net::Writer w;
  w.reserve(2 + std::min(name.size(), kMaxKeyName) + value.size());
  w.str<uint16_t>(name.substr(0, kMaxKeyName)).bytes(value);
  return w.take();
}

Status decode_init(std::span<const std::byte> in, std::string* name,
                   std::span<const std::byte>* value) {
  net::Reader r(in);
  std::string n = r.str<uint16_t>(kMaxKeyName);
  std::span<const std::byte> v = r.rest();
  if (!r.ok())
    return Status(
        ErrorCode::kProtocolError,
        fmt::format("init payload of {} bytes does not start with a key name", in.size()));
  *name = std::move(n);
  *value = v;
  return Status::ok();
}

std::vector<std::byte> encode_ranges(const std::vector<Range>& ranges) {
  net::Writer w;
  w.reserve(ranges.size() * kRangeBytes);
  for (const Range& r : ranges)
    w.u<int64_t>(r.begin).u<int64_t>(r.count);
  return w.take();
}

Status decode_ranges(std::span<const std::byte> in, std::vector<Range>* ranges) {
  if (in.size() % kRangeBytes != 0)
    return Status(ErrorCode::kProtocolError,
                  fmt::format("pull payload of {} bytes is not a list of ranges", in.size()));
  net::Reader r(in);
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

}  // namespace pushpull::ps
