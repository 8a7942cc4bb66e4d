// SPDX-License-Identifier: Apache-2.0
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

namespace pushpull {

class Key {
 public:
  Key() = default;
  template <std::integral I>
  Key(I k) : int_(static_cast<int64_t>(k)) {}  // NOLINT: implicit on purpose (push(3, ...))
  Key(std::string k) : str_(std::move(k)), is_string_(true) {}  // NOLINT
  Key(std::string_view k) : str_(k), is_string_(true) {}        // NOLINT
  Key(const char* k) : str_(k), is_string_(true) {}             // NOLINT

  bool is_int() const { return !is_string_; }
  bool is_string() const { return is_string_; }
  // Precondition: is_int() / is_string().
  int64_t as_int() const { return int_; }
  const std::string& as_string() const { return str_; }
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
    if (a.is_string_ != b.is_string_) return a.is_string_ <=> b.is_string_;
    if (a.is_int()) return a.as_int() <=> b.as_int();
    return a.as_string().compare(b.as_string()) <=> 0;
  }

 private:
  // Plain members rather than a std::variant: GCC 12 reports false
  // -Wmaybe-uninitialized warnings when a variant holding a string is copied.
  int64_t int_ = 0;  // the key when !is_string_ (0 otherwise)
  std::string str_;  // the key when is_string_ (empty otherwise)
  bool is_string_ = false;
};

}  // namespace pushpull

template <>
struct std::hash<pushpull::Key> {
  size_t operator()(const pushpull::Key& k) const { return k.hash(); }
};
