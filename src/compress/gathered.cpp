// SPDX-License-Identifier: Apache-2.0
#include "compress/gathered.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "compress/compressor.h"

namespace pushpull::compress {

void sum_in_rank_order(const Codec& codec, std::span<const std::byte* const> parts, size_t n,
                       float* out) {
  if (parts.empty()) {
    std::fill(out, out + n, 0.0f);
    return;
  }
  // 32 Ki values (128 KiB of float32) stay in L2 while every rank's codes are
  // added to them; a multiple of 32, so blocks start on whole code words of
  // every codec (16 values a word for 2bit, 32 for 1bit).
  constexpr size_t kBlock = 32768;
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t k = std::min(kBlock, n - at);
    const size_t from = codec.compressed_bytes(at);
    codec.decompress(parts[0] + from, out + at, k);
    for (size_t r = 1; r < parts.size(); ++r)
      codec.decompress_add(parts[r] + from, out + at, k);
  }
}

namespace {

// What a wire header says, for an error message: "2bit(threshold=0.5)", or
// empty when it is not a header this build writes.
std::string header_says(const std::byte* h) {
  const auto type = static_cast<uint8_t>(h[0]);
  if (static_cast<uint8_t>(h[1]) != kWireVersion || h[2] != std::byte{0} || h[3] != std::byte{0} ||
      type == 0 || type > static_cast<uint8_t>(Type::kFp16))
    return "";
  Settings s;
  s.type = static_cast<Type>(type);
  std::memcpy(&s.threshold, h + 4, 4);
  return s.to_string();
}

}  // namespace

Status sum_gathered(const Settings& mine, std::span<const std::byte> gathered, int ranks, size_t n,
                    float* out) {
  const std::unique_ptr<Codec> codec = make_codec(mine);
  if (!codec || ranks < 0)
    return Status(ErrorCode::kInvalidArgument, "sum_gathered: no codec or a negative rank count");
  std::byte header[kHeaderBytes];
  write_header(mine, header);
  const size_t part = kHeaderBytes + codec->compressed_bytes(n);
  // Headers first, rank by rank: a worker with other settings may have sent
  // codes of another length, so its header says more than the total does.
  std::vector<const std::byte*> parts;
  for (int r = 0; r < ranks; ++r) {
    const size_t at = static_cast<size_t>(r) * part;
    if (gathered.size() < at + kHeaderBytes) break;  // the length check below names it
    const std::byte* h = gathered.data() + at;
    if (std::memcmp(h, header, kHeaderBytes) != 0) {
      const std::string theirs = header_says(h);
      if (theirs.empty())
        return Status(ErrorCode::kProtocolError,
                      fmt::format("rank {}'s compressed gradient has a malformed header", r));
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("workers set different gradient compression: rank {} sent {}, "
                                "this worker uses {}; call set_gradient_compression alike on "
                                "every worker",
                                r, theirs, mine.to_string()));
    }
    parts.push_back(h + kHeaderBytes);
  }
  if (gathered.size() != part * static_cast<size_t>(ranks))
    return Status(ErrorCode::kProtocolError,
                  fmt::format("gathered {} codes of {} values: {} bytes, expected {} x {}",
                              type_name(mine.type), n, gathered.size(), ranks, part));
  sum_in_rank_order(*codec, parts, n, out);
  return Status::ok();
}

}  // namespace pushpull::compress
