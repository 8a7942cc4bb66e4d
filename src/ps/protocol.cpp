#include "ps/protocol.h"

#include <cstring>

#include <fmt/format.h>

namespace pushpull::ps {

std::vector<std::byte> encode_init(std::string_view name, std::span<const std::byte> value) {
  size_t n = std::min<size_t>(name.size(), 0xffff);
  std::vector<std::byte> out(2 + n + value.size());
  out[0] = static_cast<std::byte>(n & 0xff);
  out[1] = static_cast<std::byte>(n >> 8);
  std::memcpy(out.data() + 2, name.data(), n);
  if (!value.empty()) std::memcpy(out.data() + 2 + n, value.data(), value.size());
  return out;
}

Status decode_init(std::span<const std::byte> in, std::string* name,
                   std::span<const std::byte>* value) {
  if (in.size() < 2) return Status(ErrorCode::kProtocolError, "init payload shorter than 2 bytes");
  size_t n = static_cast<size_t>(in[0]) | (static_cast<size_t>(in[1]) << 8);
  if (in.size() < 2 + n)
    return Status(ErrorCode::kProtocolError,
                  fmt::format("init payload of {} bytes cannot hold a {}-byte name", in.size(), n));
  name->assign(reinterpret_cast<const char*>(in.data() + 2), n);
  *value = in.subspan(2 + n);
  return Status::ok();
}

namespace {
void put_i64(std::byte* p, int64_t v) {
  auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<std::byte>(u >> (8 * i));
}
int64_t get_i64(const std::byte* p) {
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i)
    u |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<int64_t>(u);
}
}  // namespace

std::vector<std::byte> encode_ranges(const std::vector<Range>& ranges) {
  std::vector<std::byte> out(ranges.size() * 16);
  for (size_t i = 0; i < ranges.size(); ++i) {
    put_i64(out.data() + 16 * i, ranges[i].begin);
    put_i64(out.data() + 16 * i + 8, ranges[i].count);
  }
  return out;
}

Status decode_ranges(std::span<const std::byte> in, std::vector<Range>* ranges) {
  if (in.size() % 16 != 0)
    return Status(ErrorCode::kProtocolError,
                  fmt::format("pull payload of {} bytes is not a list of ranges", in.size()));
  ranges->resize(in.size() / 16);
  for (size_t i = 0; i < ranges->size(); ++i)
    (*ranges)[i] = Range{get_i64(in.data() + 16 * i), get_i64(in.data() + 16 * i + 8)};
  return Status::ok();
}

}  // namespace pushpull::ps
