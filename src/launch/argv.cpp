// SPDX-License-Identifier: Apache-2.0
#include "launch/argv.h"

namespace pushpull::launch {

void normalize_launch_words(std::vector<std::string>& words, const OptionArity& arity) {
  for (size_t i = 0; i < words.size(); ++i) {
    std::string& w = words[i];
    if (w == "--" || w.size() < 2 || w[0] != '-') return;  // the program starts here
    if (w == "-np") w = "--num-workers";
    std::string_view name = w;
    bool attached = false;  // "--env=A=1" or "-n2": the value is in this word
    if (w.starts_with("--")) {
      if (auto eq = w.find('='); eq != std::string::npos) {
        name = std::string_view(w).substr(0, eq);
        attached = true;
      }
    } else if (w.size() > 2) {
      name = std::string_view(w).substr(0, 2);
      attached = true;
    }
    const std::optional<int> n = arity(name);
    if (!n || *n == 0 || attached) continue;  // unknown (CLI11 reports it), a flag, or done
    if (i + 1 >= words.size()) return;        // a missing value: CLI11 reports it
    if (*n == 1) {
      ++i;  // skip the value
    } else if (w.starts_with("--")) {
      // One value per occurrence: "--env A=1" becomes "--env=A=1".
      w += "=" + words[i + 1];
      words.erase(words.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    } else {
      ++i;
    }
  }
}

}  // namespace pushpull::launch
