// SPDX-License-Identifier: Apache-2.0
#include <cctype>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "pushpull/error.h"
#include "pushpull/optimizer.h"

namespace pushpull {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

bool is_identifier(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

}  // namespace

OptimizerSpec OptimizerSpec::parse(std::string_view text) {
  OptimizerSpec spec;
  auto colon = text.find(':');
  spec.name = std::string(trim(text.substr(0, colon)));
  if (!is_identifier(spec.name))
    throw InvalidArgument(
        fmt::format("optimizer spec '{}': the name '{}' is not a word (expected e.g. "
                    "\"sgd:learning_rate=0.1,momentum=0.9\")",
                    text, spec.name));
  if (colon == std::string_view::npos) return spec;
  std::string_view rest = text.substr(colon + 1);
  if (trim(rest).empty()) return spec;
  while (true) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    auto eq = item.find('=');
    std::string_view key = trim(item.substr(0, eq));
    if (eq == std::string_view::npos || !is_identifier(key))
      throw InvalidArgument(fmt::format(
          "optimizer spec '{}': '{}' is not name=value (expected e.g. learning_rate=0.1)", text,
          trim(item)));
    std::string_view value = trim(item.substr(eq + 1));
    double v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || value.empty())
      throw InvalidArgument(
          fmt::format("optimizer spec '{}': value '{}' of {} is not a number", text, value, key));
    if (!spec.hyperparameters.emplace(std::string(key), v).second)
      throw InvalidArgument(fmt::format("optimizer spec '{}': {} is given twice", text, key));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return spec;
}

std::string OptimizerSpec::to_string() const {
  std::string s = name;
  char sep = ':';
  for (const auto& [k, v] : hyperparameters) {
    // fmt prints the shortest text that reads back as the same double.
    s += fmt::format("{}{}={}", sep, k, v);
    sep = ',';
  }
  return s;
}

}  // namespace pushpull
