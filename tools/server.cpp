// SPDX-License-Identifier: Apache-2.0
// `pushpull server`: runs one parameter server of a job, configured by the
// DMLC_* / PUSHPULL_* environment (see include/pushpull/options.h). Serves
// until every node has left (exit 0) or the job failed (exit 1 with the
// reason).
#include "ps/server.h"
#include "commands.h"
#include "pushpull/log.h"

namespace pushpull::cli {

void register_server(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "server", "Run a parameter server of a job (DMLC_PS_ROOT_URI, DMLC_NUM_WORKER, ...)");
  cmd->callback([] {
    Options o = Options::from_env();
    set_log_level(o.log_level);
    o.cluster.role = Role::kServer;
    try {
      ps::run_server(o);
    } catch (const Error& e) {
      PP_ERROR("server: {}: {}", error_code_name(e.code()), e.what());
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace pushpull::cli
