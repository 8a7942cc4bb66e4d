// SPDX-License-Identifier: Apache-2.0
// The little-endian, checksummed file layout shared by the files pushpull
// writes (optimizer states, PS checkpoints): values appended in native
// (little-endian) order, a bounds-checked reader whose errors name the file,
// and FNV-1a over the body as the trailing checksum. The readers decode
// untrusted bytes: every read is checked against what is left.
//
// Thread safety: FileReader is a plain value; use one per thread.
// Ownership: FileReader views the bytes and names it is given; they must
// outlive it.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::base {

static_assert(std::endian::native == std::endian::little, "pushpull's files are little-endian");

// 64-bit FNV-1a: catches torn and flipped bytes (not an authenticator).
inline uint64_t fnv1a(const char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

template <typename T>
void put_le(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

class FileReader {
 public:
  // `kind` names the file in every error ("checkpoint", "optimizer states"),
  // `source` is its path or label, `torn_hint` ends a truncation error.
  FileReader(std::string_view bytes, std::string_view kind, std::string_view source,
             std::string_view torn_hint)
      : b_(bytes), kind_(kind), source_(source), torn_hint_(torn_hint) {}

  template <typename T>
  T get(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof v, what), sizeof v);
    return v;
  }
  const char* take(uint64_t n, const char* what) {
    if (n > b_.size() - pos_)
      throw IoError(
          fmt::format("{} '{}': truncated at byte {} while reading {} (need {} bytes, "
                      "{} left); {}",
                      kind_, source_, pos_, what, n, b_.size() - pos_, torn_hint_));
    const char* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }
  // An error naming the file.
  [[noreturn]] void fail(const std::string& what) const {
    throw IoError(fmt::format("{} '{}': {}", kind_, source_, what));
  }
  // An error naming the file and the byte where decoding stopped.
  [[noreturn]] void corrupt(const std::string& what) const {
    throw IoError(fmt::format("{} '{}': corrupt at byte {}: {}", kind_, source_, pos_, what));
  }
  size_t left() const { return b_.size() - pos_; }

 private:
  std::string_view b_;
  std::string_view kind_;
  std::string_view source_;
  std::string_view torn_hint_;
  size_t pos_ = 0;
};

}  // namespace pushpull::base
