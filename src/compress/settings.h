// SPDX-License-Identifier: Apache-2.0
// Gradient compression settings: the one parser every store type (and the
// Python API, which passes its dict through as strings) uses, so the same bad
// setting gets the same error everywhere.
//
//   {"type": "2bit", "threshold": "0.5"}   → Settings{Type::k2Bit, 0.5}
//
// Types (docs/kvstore.md "Gradient compression"):
//   none  nothing changes (the default)
//   2bit  MXNet's 2-bit quantisation: {-t, 0, +t}, threshold t > 0 (0.5)
//   1bit  MXNet 1.x's 1-bit quantisation: +1 where the value with its
//         residual is above t, else -1; threshold any finite number (0.5)
//   fp16  values travel as IEEE float16 (summed in float32); no threshold
// Keys: "type" (default "none") and "threshold" (only for 1bit and 2bit).
// Anything else is an InvalidArgument naming the key and the valid ones.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace pushpull::compress {

// Values are the wire codes of the compressed push header (compressor.h).
enum class Type : uint8_t { kNone = 0, k2Bit = 1, k1Bit = 2, kFp16 = 3 };

// "none", "2bit", "1bit", "fp16".
std::string_view type_name(Type t);
// The type named `name`, or nullopt.
std::optional<Type> parse_type(std::string_view name);

inline constexpr float kDefaultThreshold = 0.5f;  // MXNet's default

struct Settings {
  Type type = Type::kNone;
  float threshold = kDefaultThreshold;  // 1bit and 2bit only

  bool enabled() const { return type != Type::kNone; }
  // Whether the type keeps values at full precision or quantises them to a
  // few levels (1bit, 2bit): a ring can sum only the former on the way.
  bool quantises() const { return type == Type::k1Bit || type == Type::k2Bit; }
  // "none", "2bit(threshold=0.5)", ...
  std::string to_string() const;
  bool operator==(const Settings&) const = default;
};

// Parses MXNet-style compression parameters. InvalidArgument (with the same
// text for the same mistake, wherever it is called from) for an unknown type,
// an unknown key, a threshold that is not a number, a 2bit threshold <= 0, a
// non-finite threshold, or a threshold given to a type that takes none.
Settings parse_settings(const std::map<std::string, std::string>& params);

}  // namespace pushpull::compress
