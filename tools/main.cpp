// SPDX-License-Identifier: Apache-2.0
// `pushpull`: the command-line front end (info, and the roles and tools that
// later subcommands add).
#include <cstdio>

#include "commands.h"
#include "pushpull/build_info.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

int main(int argc, char** argv) {
  CLI::App app{"pushpull: data-parallel distributed training (parameter server and collectives)"};
  app.set_version_flag("--version", std::string("pushpull ") + PUSHPULL_VERSION);
  app.require_subcommand(1);
  pushpull::cli::register_info(app);
  pushpull::cli::register_launch(app);
  pushpull::cli::register_scheduler(app);
  pushpull::cli::register_server(app);
  auto* bench = app.add_subcommand("bench", "Benchmarks: pushpull next to its peers");
  bench->require_subcommand(1);
  pushpull::cli::register_bench_transport(*bench);
  pushpull::cli::register_bench_ps(*bench);
  pushpull::cli::register_bench_allreduce(*bench);
  pushpull::cli::register_bench_step(*bench);
  pushpull::cli::register_bench_scaling(*bench);
  pushpull::cli::register_bench_backup(*bench);
  pushpull::cli::register_bench_startup(*bench);
  pushpull::cli::register_bench_codec(*bench);
  (void)bench;
  try {
    auto args = pushpull::cli::parse_order_args(app, argc, argv);
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // Usage errors exit 2 like other Unix tools; --help/--version exit 0.
    int code = app.exit(e);
    return (code != 0 && dynamic_cast<const CLI::RuntimeError*>(&e) == nullptr) ? 2 : code;
  } catch (const pushpull::Error& e) {
    PP_ERROR("{}: {}", pushpull::error_code_name(e.code()), e.what());
    return 1;
  }
  return 0;
}
