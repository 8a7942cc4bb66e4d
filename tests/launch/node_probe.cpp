// launch_node_probe: a real cluster node for the launcher's end-to-end tests.
// Joins the job described by its environment (as every pushpull program
// does, through Options::from_env), prints
// "NODE <role> <rank> of <servers>+<workers>", runs a barrier of the
// workers and leaves in order.
// --fail-rank R: worker R exits 3 right after joining instead.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cluster/node.h"
#include "pushpull/error.h"

int main(int argc, char** argv) {
  int fail_rank = -1;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--fail-rank") fail_rank = std::atoi(argv[i + 1]);
  try {
    auto options = pushpull::Options::from_env();
    pushpull::cluster::Node node(options);
    node.start();
    std::printf("NODE %s %d of %d+%d\n", std::string(pushpull::role_name(node.role())).c_str(),
                node.rank(), node.num_servers(), node.num_workers());
    std::fflush(stdout);
    if (node.role() == pushpull::Role::kWorker && node.rank() == fail_rank) std::_Exit(3);
    // Workers only: a real `pushpull server` joins no barrier of ours.
    if (node.role() == pushpull::Role::kWorker) node.barrier(pushpull::cluster::Group::kWorkers);
    node.shutdown();
  } catch (const pushpull::Error& e) {
    std::fprintf(stderr, "node failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
