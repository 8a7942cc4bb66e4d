// Little-endian payload encoding for control messages (hello, registration,
// address book). Reader never reads past its input: a short or malformed
// payload sets ok() to false instead of throwing, so event loops can turn it
// into a ProtocolError status.
// Thread safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pushpull::net {

class Writer {
 public:
  template <typename T>
  Writer& u(T v) {
    for (size_t i = 0; i < sizeof(T); ++i)
      out_.push_back(static_cast<std::byte>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& str(const std::string& s) {
    u<uint32_t>(static_cast<uint32_t>(s.size()));
    for (char c : s)
      out_.push_back(static_cast<std::byte>(c));
    return *this;
  }
  Writer& bytes(std::span<const std::byte> b) {
    out_.insert(out_.end(), b.begin(), b.end());
    return *this;
  }
  const std::vector<std::byte>& data() const { return out_; }
  std::vector<std::byte>&& take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  T u() {
    if (!need(sizeof(T))) return T{};
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(in_[pos_ + i])) << (8 * i);
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }
  // Strings longer than `max` are malformed.
  std::string str(size_t max = 4096) {
    auto n = u<uint32_t>();
    if (n > max || !need(n)) {
      ok_ = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  bool bytes(std::span<std::byte> out) {
    if (!need(out.size())) return false;
    std::copy(in_.begin() + pos_, in_.begin() + pos_ + out.size(), out.begin());
    pos_ += out.size();
    return true;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == in_.size(); }

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

}  // namespace pushpull::net
