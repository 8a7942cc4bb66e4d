// Key: the name of one value in a KVStore and of one optimizer state: an
// integer or a string (MXNet accepts both; one store never mixes them).
//
// Thread safety: a plain value.
#pragma once

#include <compare>
#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <variant>

namespace pushpull {

class Key {
 public:
  Key() : v_(int64_t{0}) {}
  template <std::integral I>
  Key(I k) : v_(static_cast<int64_t>(k)) {}        // NOLINT: implicit on purpose (push(3, ...))
  Key(std::string k) : v_(std::move(k)) {}         // NOLINT
  Key(std::string_view k) : v_(std::string(k)) {}  // NOLINT
  Key(const char* k) : v_(std::string(k)) {}       // NOLINT

  bool is_int() const { return v_.index() == 0; }
  bool is_string() const { return v_.index() == 1; }
  // Precondition: is_int() / is_string().
  int64_t as_int() const { return std::get<0>(v_); }
  const std::string& as_string() const { return std::get<1>(v_); }
  // "3" or "'weight'", for messages.
  std::string to_string() const {
    return is_int() ? std::to_string(as_int()) : "'" + as_string() + "'";
  }
  // "int" or "string".
  std::string_view kind_name() const { return is_int() ? "int" : "string"; }
  // Stable within a process; used to shard keys over threads.
  size_t hash() const {
    return is_int() ? std::hash<int64_t>()(as_int()) : std::hash<std::string>()(as_string());
  }

  friend bool operator==(const Key&, const Key&) = default;
  // Integers sort before strings (irrelevant within one store).
  friend std::strong_ordering operator<=>(const Key& a, const Key& b) {
    if (a.v_.index() != b.v_.index()) return a.v_.index() <=> b.v_.index();
    if (a.is_int()) return a.as_int() <=> b.as_int();
    return a.as_string().compare(b.as_string()) <=> 0;
  }

 private:
  std::variant<int64_t, std::string> v_;
};

}  // namespace pushpull

template <>
struct std::hash<pushpull::Key> {
  size_t operator()(const pushpull::Key& k) const { return k.hash(); }
};
