// SPDX-License-Identifier: Apache-2.0
// Launcher command-line conventions that CLI11 cannot express, applied to the
// words after `pushpull launch` before they are parsed (docs/launch.md):
//   - `-np N` (mpirun, horovodrun) is `-n N`;
//   - an option taking several values (`--env`, `--env-worker`, `--env-server`,
//     `--ssh-option`) takes exactly one per occurrence: `--env A=1 ./train`
//     never swallows the program;
// and nothing from the program on (the first word that is neither an option
// nor an option's value, or everything after `--`) is ever changed.
//
// Thread safety: a pure function.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pushpull::launch {

// How many values the launcher option `name` ("-n", "--env") takes: 0 (a
// flag), 1, or 2 for "one or more"; nullopt for an unknown option.
using OptionArity = std::function<std::optional<int>(std::string_view name)>;

// Rewrites `words` (the arguments after `launch`) in place.
void normalize_launch_words(std::vector<std::string>& words, const OptionArity& arity);

}  // namespace pushpull::launch
