// SPDX-License-Identifier: Apache-2.0
// The launcher's argument conventions (src/launch/argv.h) applied to the
// command line before CLI11 parses it, with each option's arity taken from the
// `launch` subcommand's own option table (so new options need no change here).
#include <string>
#include <vector>

#include "commands.h"
#include "launch/argv.h"

namespace pushpull::cli {

std::vector<std::string> parse_order_args(CLI::App& app, int argc, char** argv) {
  if (app.get_name().empty() && argc > 0) app.name(argv[0]);  // as App::parse(argc, argv)
  std::vector<std::string> words(argv + 1, argv + argc);
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i].empty() || words[i][0] == '-') continue;
    if (words[i] != "launch") break;
    auto found =
        app.get_subcommands([](const CLI::App* sub) { return sub->get_name() == "launch"; });
    if (found.empty()) break;
    const CLI::App* launch = found.front();
    std::vector<std::string> rest(words.begin() + static_cast<std::ptrdiff_t>(i) + 1, words.end());
    launch::normalize_launch_words(rest, [launch](std::string_view name) -> std::optional<int> {
      const CLI::Option* opt = launch->get_option_no_throw(std::string(name));
      if (opt == nullptr) return std::nullopt;
      const int n = opt->get_items_expected_max();
      return n <= 0 ? 0 : (n == 1 ? 1 : 2);
    });
    words.resize(i + 1);
    words.insert(words.end(), rest.begin(), rest.end());
    break;
  }
  // CLI11's App::parse(std::vector<std::string>&) takes the words last first.
  return {words.rbegin(), words.rend()};
}

}  // namespace pushpull::cli
