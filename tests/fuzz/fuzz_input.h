// SPDX-License-Identifier: Apache-2.0
// Shared helpers of the fuzz targets (tests/fuzz/fuzz_*.cpp).
//
// Input layout of every target: byte 0 picks one of the target's decoders,
// the rest is that decoder's input. A target aborts (__builtin_trap, or an
// exception other than pushpull::Error escaping) only on a real bug: a
// decoder that reads out of bounds (ASan), overflows (UBSan), throws the wrong
// thing, or accepts what its own encoder would not produce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace pushpull::fuzz {

struct Input {
  uint8_t selector = 0;
  std::span<const std::byte> data;
};

inline Input split(const uint8_t* data, size_t size) {
  if (size == 0) return {};
  return {data[0], {reinterpret_cast<const std::byte*>(data + 1), size - 1}};
}

// Traps when `cond` is false (a finding, not a malformed input).
inline void require(bool cond) {
  if (!cond) __builtin_trap();
}

}  // namespace pushpull::fuzz
