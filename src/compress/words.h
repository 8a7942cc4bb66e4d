// SPDX-License-Identifier: Apache-2.0
// Little-endian 32-bit words at any byte address (the packed codecs' unit).
//
// Thread safety: pure functions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace pushpull::compress {

static_assert(std::endian::native == std::endian::little,
              "the codecs write little-endian words with memcpy");

inline void store_word(std::byte* at, uint32_t w) {
  std::memcpy(at, &w, 4);
}
inline uint32_t load_word(const std::byte* at) {
  uint32_t w;
  std::memcpy(&w, at, 4);
  return w;
}

}  // namespace pushpull::compress
