// SPDX-License-Identifier: Apache-2.0
// Overflow-checked size arithmetic for counts, offsets and byte sizes that
// come from a peer or a user (element count * dtype size, begin + count,
// offset + length). Every function reports overflow instead of wrapping.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace pushpull {

// *out = a * b; false (and *out unspecified) on overflow of T.
template <typename T>
[[nodiscard]] inline bool checked_mul(T a, T b, T* out) {
  static_assert(std::is_integral_v<T>);
  return !__builtin_mul_overflow(a, b, out);
}
// *out = a + b; false on overflow of T.
template <typename T>
[[nodiscard]] inline bool checked_add(T a, T b, T* out) {
  static_assert(std::is_integral_v<T>);
  return !__builtin_add_overflow(a, b, out);
}

// Whether [begin, begin + count) lies inside [0, size), without overflow:
// negative begin or count, or a sum past `size`, is outside.
[[nodiscard]] inline bool range_inside(int64_t begin, int64_t count, int64_t size) {
  return begin >= 0 && count >= 0 && size >= 0 && begin <= size && count <= size - begin;
}
[[nodiscard]] inline bool range_inside(uint64_t begin, uint64_t count, uint64_t size) {
  return begin <= size && count <= size - begin;
}

// count elements of `elem_size` bytes as a byte count; false on a negative
// count or overflow of size_t.
[[nodiscard]] inline bool checked_bytes(int64_t count, size_t elem_size, size_t* out) {
  if (count < 0) return false;
  return checked_mul(static_cast<size_t>(count), elem_size, out);
}

}  // namespace pushpull
