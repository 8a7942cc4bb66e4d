// SPDX-License-Identifier: Apache-2.0
// Fuzz target: an allgather's output of 1bit/2bit codes as a worker of
// dist_sync_allreduce receives it from untrusted peers (compress/gathered.h
// sum_gathered). Every input must be refused with the output left as it was,
// or summed to exactly what decode_add of each rank's part, in rank order,
// gives from zeros.
//
// Input: the selector picks the worker's own settings (bit 0: 2bit or 1bit;
// bit 1: threshold 0.5 or 0.25) and, in bits 2-4, the rank count 1..8; then
// a u16 n (capped at 4096 values) and the gathered bytes.
#include <cstring>
#include <vector>

#include "compress/compressor.h"
#include "compress/gathered.h"
#include "fuzz_input.h"

using namespace pushpull;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  if (in.size() < 2) return 0;
  compress::Settings mine{sel & 1 ? compress::Type::k1Bit : compress::Type::k2Bit,
                          sel & 2 ? 0.25f : 0.5f};
  const int ranks = 1 + ((sel >> 2) & 7);
  uint16_t low;
  std::memcpy(&low, in.data(), 2);
  const size_t n = low % 4097;
  const std::span<const std::byte> gathered = in.subspan(2);
  std::vector<float> out(n, 0.5f);
  const Status st = compress::sum_gathered(mine, gathered, ranks, n, out.data());
  if (!st.is_ok()) {
    pushpull::fuzz::require(st.code() == ErrorCode::kProtocolError ||
                            st.code() == ErrorCode::kInvalidArgument);
    for (float v : out)
      pushpull::fuzz::require(v == 0.5f);
    return 0;
  }
  // Accepted: every part is a wire form of `mine`, and the sum is theirs in order.
  const size_t part = gathered.size() / static_cast<size_t>(ranks);
  std::vector<float> want(n, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const auto one = gathered.subspan(static_cast<size_t>(r) * part, part);
    pushpull::fuzz::require(compress::wire_settings(one, n) == mine);
    pushpull::fuzz::require(compress::decode_add(one, want.data(), n).is_ok());
  }
  pushpull::fuzz::require(std::memcmp(want.data(), out.data(), 4 * n) == 0);
  return 0;
}
