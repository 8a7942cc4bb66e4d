// SPDX-License-Identifier: Apache-2.0
// `pushpull scheduler`: runs the scheduler role of a job, configured by the
// DMLC_* / PUSHPULL_* environment (see include/pushpull/options.h). Exits 0
// when every node left in order, 1 with the reason when the job failed.
#include "cluster/scheduler.h"
#include "commands.h"
#include "pushpull/log.h"

namespace pushpull::cli {

void register_scheduler(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "scheduler", "Run the scheduler of a job (DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, ...)");
  cmd->callback([] {
    Options o = Options::from_env();
    set_log_level(o.log_level);
    o.cluster.role = Role::kScheduler;
    cluster::Scheduler s(o);
    s.bind();
    Status st = s.run();
    if (!st) {
      PP_ERROR("scheduler: {}", st.to_string());
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace pushpull::cli
