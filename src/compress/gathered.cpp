// SPDX-License-Identifier: Apache-2.0
#include "compress/gathered.h"

#include <algorithm>
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

Status sum_gathered(const Settings& mine, std::span<const std::byte> gathered, int ranks, size_t n,
                    float* out) {
  const std::unique_ptr<Codec> codec = make_codec(mine);
  if (!codec || ranks < 0)
    return Status(ErrorCode::kInvalidArgument, "sum_gathered: no codec or a negative rank count");
  const size_t part = kHeaderBytes + codec->compressed_bytes(n);
  if (gathered.size() != part * static_cast<size_t>(ranks))
    return Status(ErrorCode::kProtocolError,
                  fmt::format("gathered {} codes of {} values: {} bytes, expected {} x {}",
                              type_name(mine.type), n, gathered.size(), ranks, part));
  std::vector<const std::byte*> parts;
  for (int r = 0; r < ranks; ++r) {
    const auto one = gathered.subspan(static_cast<size_t>(r) * part, part);
    const std::optional<Settings> theirs = wire_settings(one, n);
    if (!theirs)
      return Status(ErrorCode::kProtocolError,
                    fmt::format("rank {}'s compressed gradient has a malformed header", r));
    if (!(*theirs == mine))
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("workers set different gradient compression: rank {} sent {}, "
                                "this worker uses {}; call set_gradient_compression alike on "
                                "every worker",
                                r, theirs->to_string(), mine.to_string()));
    parts.push_back(one.data() + kHeaderBytes);
  }
  sum_in_rank_order(*codec, parts, n, out);
  return Status::ok();
}

}  // namespace pushpull::compress
