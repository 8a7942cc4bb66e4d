// SPDX-License-Identifier: Apache-2.0
// Lowercase hex of raw bytes: the one encoder of random names, tokens and
// secrets (shared-memory names, lent blocks' tokens, the job secret file,
// file-authentication ids).
//
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <string>

namespace pushpull {

// 2 * n lowercase hex digits of the n bytes at p.
inline std::string to_hex(const void* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* b = static_cast<const unsigned char*>(p);
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[b[i] >> 4];
    s[2 * i + 1] = kDigits[b[i] & 15];
  }
  return s;
}

}  // namespace pushpull
