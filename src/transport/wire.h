// SPDX-License-Identifier: Apache-2.0
// The one payload codec of pushpull: every message body and header is written
// with Writer / SpanWriter and read with Reader, little-endian, field by field
// (never by copying a struct), so the format is the same on every host.
//
// Reader never reads past its input and never throws: a short or malformed
// input sets ok() to false, every later read returns a zero value, and the
// decoder turns that into a ProtocolError status. Counts a peer sends are
// checked against what the input can hold before anything is allocated
// (count()), so a 4-byte count cannot make the receiver reserve gigabytes.
//
// Typical decoder:
//   Reader r(in);
//   out->id = r.u<uint32_t>();
//   out->name = r.str(256);
//   for (size_t i = 0, n = r.count<uint32_t>(kMaxItems, 8); i < n; ++i)
//     out->items.push_back(r.u<int64_t>());
//   if (!r.done()) return bad("item list");
//
// Thread safety: plain values; a Reader / Writer is used by one thread.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace pushpull::transport {

// Little-endian store / load of an integer at `p` (which must hold sizeof(T)
// bytes: callers check, Writer / Reader do).
template <typename T>
inline void store_le(std::byte* p, T v) {
  static_assert(std::is_integral_v<T>);
  auto u = static_cast<std::make_unsigned_t<T>>(v);
  for (size_t i = 0; i < sizeof(T); ++i)
    p[i] = static_cast<std::byte>((static_cast<uint64_t>(u) >> (8 * i)) & 0xff);
}
template <typename T>
inline T load_le(const std::byte* p) {
  static_assert(std::is_integral_v<T>);
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return static_cast<T>(static_cast<std::make_unsigned_t<T>>(v));
}

// The same on raw frame headers kept as unsigned char arrays (the
// collectives' shared-memory ring headers).
template <typename T>
inline void store_le(unsigned char* p, T v) {
  store_le<T>(reinterpret_cast<std::byte*>(p), v);
}
template <typename T>
inline T load_le(const unsigned char* p) {
  return load_le<T>(reinterpret_cast<const std::byte*>(p));
}

// Appends to a growing buffer.
class Writer {
 public:
  template <typename T>
  Writer& u(T v) {
    std::byte b[sizeof(T)];
    store_le<T>(b, v);
    out_.insert(out_.end(), b, b + sizeof(T));
    return *this;
  }
  // An IEEE float by its bits.
  Writer& f32(float v) { return u<uint32_t>(std::bit_cast<uint32_t>(v)); }
  Writer& f64(double v) { return u<uint64_t>(std::bit_cast<uint64_t>(v)); }
  // A string with a `Len`-typed byte length in front (u32 by default).
  // Strings longer than Len can count are cut (a reader's `max` rejects them
  // long before that).
  template <typename Len = uint32_t>
  Writer& str(std::string_view s) {
    size_t n = std::min<size_t>(s.size(), std::numeric_limits<Len>::max());
    u<Len>(static_cast<Len>(n));
    auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + n);
    return *this;
  }
  // Raw bytes, no length (the reader knows how many: fixed or from a field).
  Writer& bytes(std::span<const std::byte> b) {
    out_.insert(out_.end(), b.begin(), b.end());
    return *this;
  }
  void reserve(size_t n) { out_.reserve(n); }
  size_t size() const { return out_.size(); }
  const std::vector<std::byte>& data() const { return out_; }
  std::vector<std::byte>&& take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

// Writes into a caller's fixed buffer (a message header). Writing past its end
// writes nothing more and sets ok() to false.
class SpanWriter {
 public:
  explicit SpanWriter(std::span<std::byte> out) : out_(out) {}
  template <typename T>
  SpanWriter& u(T v) {
    if (!room(sizeof(T))) return *this;
    store_le<T>(out_.data() + pos_, v);
    pos_ += sizeof(T);
    return *this;
  }
  SpanWriter& bytes(std::span<const std::byte> b) {
    if (!room(b.size())) return *this;
    if (!b.empty()) std::memcpy(out_.data() + pos_, b.data(), b.size());
    pos_ += b.size();
    return *this;
  }
  bool ok() const { return ok_; }
  size_t pos() const { return pos_; }
  // ok() and the whole buffer written.
  bool full() const { return ok_ && pos_ == out_.size(); }

 private:
  bool room(size_t n) {
    if (!ok_ || out_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    return true;
  }
  std::span<std::byte> out_;
  size_t pos_ = 0;
  bool ok_ = true;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}

  // An integer (any width, signed or not); 0 once !ok().
  template <typename T>
  T u() {
    if (!need(sizeof(T))) return T{};
    T v = load_le<T>(in_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }
  float f32() { return std::bit_cast<float>(u<uint32_t>()); }
  double f64() { return std::bit_cast<double>(u<uint64_t>()); }

  // A string written by Writer::str<Len>; longer than `max` is malformed.
  template <typename Len = uint32_t>
  std::string str(size_t max = 4096) {
    auto n = static_cast<size_t>(u<Len>());
    if (n > max || !need(n)) {
      ok_ = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }

  // Copies exactly out.size() bytes (false, and !ok(), if fewer remain).
  bool bytes(std::span<std::byte> out) {
    if (!need(out.size())) return false;
    if (!out.empty()) std::memcpy(out.data(), in_.data() + pos_, out.size());
    pos_ += out.size();
    return true;
  }
  // The next `n` bytes without copying (empty, and !ok(), if fewer remain).
  std::span<const std::byte> view(size_t n) {
    if (!need(n)) return {};
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  // Everything not read yet, without copying; the reader is then at its end.
  std::span<const std::byte> rest() {
    if (!ok_) return {};
    auto s = in_.subspan(pos_);
    pos_ = in_.size();
    return s;
  }

  // A `Count`-typed element count followed by that many elements of at least
  // `min_item_bytes` each. Returns 0 and sets !ok() when the count exceeds
  // `max_items` or the remaining input cannot hold that many elements, so the
  // caller may reserve / resize by the result safely.
  template <typename Count = uint32_t>
  size_t count(size_t max_items, size_t min_item_bytes = 1) {
    static_assert(std::is_unsigned_v<Count>);
    auto n = static_cast<uint64_t>(u<Count>());
    if (!ok_) return 0;
    if (n > max_items || (min_item_bytes && n > remaining() / min_item_bytes)) {
      ok_ = false;
      return 0;
    }
    return static_cast<size_t>(n);
  }

  // Marks the input malformed (a decoder found a bad value).
  void fail() { ok_ = false; }
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == in_.size(); }
  // ok() and every byte consumed; trailing bytes make the input malformed.
  bool done() {
    if (!at_end()) ok_ = false;
    return ok_;
  }
  size_t pos() const { return pos_; }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  bool need(size_t n) {
    if (!ok_ || in_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    return true;
  }
  std::span<const std::byte> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace pushpull::transport
