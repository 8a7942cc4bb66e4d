// SPDX-License-Identifier: Apache-2.0
// launch_node_probe: a real cluster node for the launcher's end-to-end tests.
// Joins the job described by its environment (as every pushpull program
// does, through Options::from_env), prints
// "NODE <role> <rank> of <servers>+<workers>", runs a barrier of the
// workers and leaves in order. A failure prints "node failed: <ErrorCode>:
// <message>" (e.g. a PeerFailure naming the node that failed) and exits 1.
//   --fail-rank R      worker R fails right after joining, as --fail-how says:
//   --fail-how exit3   exits 3 (the default)
//              kill9   kills itself with SIGKILL
//              stop    stops itself with SIGSTOP (the heartbeats must notice)
// With a timeline (PUSHPULL_TIMELINE) its join and barrier are spans "JOIN"
// and "BARRIER" on lane "probe" (the launcher's merge test).
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/timeline.h"
#include "cluster/node.h"
#include "pushpull/error.h"

int main(int argc, char** argv) {
  int fail_rank = -1;
  std::string how = "exit3";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--fail-rank") fail_rank = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--fail-how") how = argv[i + 1];
  }
  try {
    auto options = pushpull::Options::from_env();
    pushpull::cluster::Node node(options);
    auto t0 = pushpull::timeline::Clock::now();
    node.start();
    const std::string& me = pushpull::timeline::process_node();
    pushpull::timeline::span(me, "probe", "JOIN", t0, pushpull::timeline::Clock::now());
    std::printf("NODE %s %d of %d+%d\n", std::string(pushpull::role_name(node.role())).c_str(),
                node.rank(), node.num_servers(), node.num_workers());
    std::fflush(stdout);
    if (node.role() == pushpull::Role::kWorker && node.rank() == fail_rank) {
      if (how == "kill9") raise(SIGKILL);
      if (how == "stop") raise(SIGSTOP);
      if (how == "exit3") std::_Exit(3);
    }
    // Workers only: a real `pushpull server` joins no barrier of ours.
    t0 = pushpull::timeline::Clock::now();
    if (node.role() == pushpull::Role::kWorker) node.barrier(pushpull::cluster::Group::kWorkers);
    pushpull::timeline::span(me, "probe", "BARRIER", t0, pushpull::timeline::Clock::now());
    node.shutdown();
  } catch (const pushpull::Error& e) {
    std::fprintf(stderr, "node failed: %s: %s\n",
                 std::string(pushpull::error_code_name(e.code())).c_str(), e.what());
    return 1;
  }
  return 0;
}
