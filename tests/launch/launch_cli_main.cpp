// SPDX-License-Identifier: Apache-2.0
// The `pushpull` CLI with only its `launch` subcommand, for the launch tests:
// the same tools/launch.cpp code, built without the layers other work is
// still changing.
#include "commands.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

int main(int argc, char** argv) {
  CLI::App app{"pushpull (launch only, for tests)"};
  app.require_subcommand(1);
  pushpull::cli::register_launch(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return (code != 0 && dynamic_cast<const CLI::RuntimeError*>(&e) == nullptr) ? 2 : code;
  } catch (const pushpull::Error& e) {
    PP_ERROR("{}: {}", pushpull::error_code_name(e.code()), e.what());
    return 1;
  }
  return 0;
}
