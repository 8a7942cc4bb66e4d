// SPDX-License-Identifier: Apache-2.0
// `pushpull info`: version, build and what this binary can do.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <thread>

#include "commands.h"
#include "pushpull/build_info.h"
#include "pushpull/dtype.h"
#include "pushpull/kvstore.h"

namespace pushpull::cli {

void register_info(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("info", "Print version, build type, compiler and enabled features");
  cmd->callback([] {
    fmt::print("pushpull {}\n", PUSHPULL_VERSION);
    fmt::print("build type:  {}\n", PUSHPULL_BUILD_TYPE);
    fmt::print("compiler:    {}\n", PUSHPULL_COMPILER);
    fmt::print("features:    {}\n", PUSHPULL_BUILD_FEATURES);
    fmt::print("cpu:         {} hardware threads, f16c {}\n", std::thread::hardware_concurrency(),
               cpu_has_f16c() ? "yes" : "no");
    fmt::print("kvstores:    {}\n", fmt::join(kvstore_types(), " "));
    fmt::print("transports:  tcp\n");
  });
}

}  // namespace pushpull::cli
