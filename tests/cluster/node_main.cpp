// SPDX-License-Identifier: Apache-2.0
// cluster_node: a test-only program that plays one role of a job from the
// DMLC_* / PUSHPULL_* environment, for the multi-process and fault tests.
//   scheduler: runs a Scheduler; prints "PORT <n>"; exits 0 when every node
//              left, 1 with the reason otherwise.
//   server/worker: starts a Node, prints "READY <role> <rank>", then runs
//              barriers of all nodes (--rounds N, 0 = until the job fails)
//              --sleep-ms apart, then leaves in order and prints "DONE".
// Exit codes: 0 ok, 3 PeerFailure (printed as "FAILED PeerFailure: ..."),
// 1 any other error.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "cluster/node.h"
#include "cluster/scheduler.h"
#include "pushpull/error.h"
#include "pushpull/log.h"

using namespace pushpull;

int main(int argc, char** argv) {
  int rounds = 10;
  int sleep_ms = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep-ms") == 0) sleep_ms = std::atoi(argv[i + 1]);
  }
  try {
    Options o = Options::from_env();
    set_log_level(o.log_level);
    if (o.cluster.role == Role::kScheduler) {
      cluster::Scheduler s(o);
      std::printf("PORT %d\n", s.bind());
      std::fflush(stdout);
      Status st = s.run();
      if (!st) {
        std::printf("FAILED %s\n", st.to_string().c_str());
        return 1;
      }
      std::printf("DONE\n");
      return 0;
    }
    cluster::Node n(o);
    n.start();
    std::printf("READY %s %d\n", std::string(role_name(n.role())).c_str(), n.rank());
    std::fflush(stdout);
    for (int r = 0; rounds == 0 || r < rounds; ++r) {
      n.barrier(cluster::Group::kAll);
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
    n.shutdown();
    std::printf("DONE\n");
    return 0;
  } catch (const PeerFailure& e) {
    std::printf("FAILED PeerFailure: %s\n", e.what());
    return 3;
  } catch (const Error& e) {
    std::printf("FAILED %s: %s\n", std::string(error_code_name(e.code())).c_str(), e.what());
    return 1;
  }
}
