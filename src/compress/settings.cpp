// SPDX-License-Identifier: Apache-2.0
#include "compress/settings.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::compress {

namespace {
constexpr const char* kValidTypes = "none, 2bit, 1bit, fp16";
constexpr const char* kExample = "e.g. {type: \"2bit\", threshold: \"0.5\"}";

float parse_threshold(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(begin, &end);
  // The whole text must be the number (leading spaces are strtod's, allowed).
  if (text.empty() || end == begin || *end != '\0' || errno == ERANGE || !std::isfinite(v) ||
      std::fabs(v) > 3.0e38)
    throw InvalidArgument(fmt::format(
        "gradient compression threshold '{}' is not a finite number ({})", text, kExample));
  return static_cast<float>(v);
}
}  // namespace

std::string_view type_name(Type t) {
  switch (t) {
    case Type::kNone:
      return "none";
    case Type::k2Bit:
      return "2bit";
    case Type::k1Bit:
      return "1bit";
    case Type::kFp16:
      return "fp16";
  }
  return "unknown";
}

std::optional<Type> parse_type(std::string_view name) {
  for (Type t : {Type::kNone, Type::k2Bit, Type::k1Bit, Type::kFp16})
    if (type_name(t) == name) return t;
  return std::nullopt;
}

std::string Settings::to_string() const {
  if (quantises()) return fmt::format("{}(threshold={})", type_name(type), threshold);
  return std::string(type_name(type));
}

Settings parse_settings(const std::map<std::string, std::string>& params) {
  Settings s;
  for (const auto& [k, v] : params)
    if (k != "type" && k != "threshold")
      throw InvalidArgument(
          fmt::format("gradient compression parameter '{}' is unknown; valid: type, threshold", k));
  if (auto it = params.find("type"); it != params.end()) {
    auto t = parse_type(it->second);
    if (!t)
      throw InvalidArgument(fmt::format("gradient compression type '{}' is unknown; valid: {}",
                                        it->second, kValidTypes));
    s.type = *t;
  }
  if (auto it = params.find("threshold"); it != params.end()) {
    if (!s.quantises())
      throw InvalidArgument(
          fmt::format("gradient compression type '{}' takes no threshold (only 1bit and 2bit do)",
                      type_name(s.type)));
    s.threshold = parse_threshold(it->second);
  }
  if (s.type == Type::k2Bit && !(s.threshold > 0))
    throw InvalidArgument(fmt::format("2bit compression threshold must be positive, got {} ({})",
                                      s.threshold, kExample));
  return s;
}

}  // namespace pushpull::compress
