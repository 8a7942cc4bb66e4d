// SPDX-License-Identifier: Apache-2.0
// Subcommands of the `pushpull` CLI. Each register_* adds one subcommand to
// the app; its callback runs the command and reports a non-zero exit status
// by throwing CLI::RuntimeError(code).
#pragma once

#include <CLI/CLI.hpp>

namespace pushpull::cli {

void register_info(CLI::App& app);
void register_launch(CLI::App& app);  // launch.cpp
// argv[1..] in CLI11's parse order (last first), with the launcher's
// conventions (-np, one value per --env) applied after `launch` (launch_argv.cpp).
std::vector<std::string> parse_order_args(CLI::App& app, int argc, char** argv);
void register_scheduler(CLI::App& app);  // scheduler.cpp
void register_server(CLI::App& app);     // server.cpp

// `pushpull bench <what>`: each benchmark registers under the `bench` parent.
// Shared flags: --format table|csv, --impl all|pushpull (see bench_common.h).
void register_bench_transport(CLI::App& bench);  // bench_transport.cpp
void register_bench_ps(CLI::App& bench);         // bench_ps.cpp
void register_bench_allreduce(CLI::App& bench);  // bench_allreduce.cpp
void register_bench_step(CLI::App& bench);       // bench_step.cpp
void register_bench_scaling(CLI::App& bench);    // bench_scaling.cpp
void register_bench_backup(CLI::App& bench);     // bench_backup.cpp
void register_bench_startup(CLI::App& bench);    // bench_startup.cpp
void register_bench_codec(CLI::App& bench);      // bench_codec.cpp

}  // namespace pushpull::cli
