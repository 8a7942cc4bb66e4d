// SPDX-License-Identifier: Apache-2.0
// Fuzz target: a compressed pull reply as a worker receives it from an
// untrusted server (compress/compressor.h decode_in_place: the wire form
// landed where its n float32 values go and is decoded there). Every input
// must be refused with the bytes left as they were, or decoded to exactly
// what decode_add from a separate copy gives (the in-place order reads
// nothing it already overwrote).
//
// Input: byte 0 and the next u16 give n (selector * 65536 + u16, capped at
// 2^16 values), the rest is the reply.
#include <cstring>
#include <vector>

#include "compress/compressor.h"
#include "fuzz_input.h"

using namespace pushpull;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [sel, in] = pushpull::fuzz::split(data, size);
  if (in.size() < 2) return 0;
  uint16_t low;
  std::memcpy(&low, in.data(), 2);
  const size_t n = (static_cast<size_t>(sel % 2) << 16 | low) % (size_t{1} << 16);
  const std::span<const std::byte> reply = in.subspan(2);
  if (reply.size() > n * sizeof(float)) return 0;  // the posted receive refuses it first
  std::vector<float> buf(n, 0.5f);
  std::memcpy(buf.data(), reply.data(), reply.size());
  const std::vector<float> before = buf;
  const Status st =
      compress::decode_in_place(reinterpret_cast<std::byte*>(buf.data()), reply.size(), n);
  std::vector<float> want(n, 0.0f);
  const Status separate = compress::decode_add(reply, want.data(), n);
  pushpull::fuzz::require(st.is_ok() == separate.is_ok());
  if (!st.is_ok()) {
    pushpull::fuzz::require(std::memcmp(before.data(), buf.data(), 4 * n) == 0);
    return 0;
  }
  pushpull::fuzz::require(std::memcmp(want.data(), buf.data(), 4 * n) == 0);
  pushpull::fuzz::require(compress::wire_settings(reply, n).has_value());
  return 0;
}
