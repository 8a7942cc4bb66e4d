// SPDX-License-Identifier: Apache-2.0
// A connection between a worker and a server closes while both live (the
// link broke; the scheduler still hears both): with replicas the worker waits
// for the scheduler's verdict (a fail-over) only up to heartbeat_timeout +
// its grace, then fails naming the server and the broken link. When the
// server really died, the fail-over is the verdict and nothing fails.
#include <gtest/gtest.h>

#include "cluster/node.h"
#include "support/cluster_harness.h"
#include "support/wait.h"

namespace pushpull::cluster {
namespace {

using namespace std::chrono_literals;
using test::InProcessCluster;

TEST(BrokenLink, AClosedConnectionToALiveServerFailsNamingTheLink) {
  InProcessCluster c(InProcessCluster::Config{});  // 2 servers: one backup each
  Node& w = c.worker(0);
  w.transport().close(w.conn(Role::kServer, 1), {ErrorCode::kIoError, "test: link cut"});
  // heartbeat_timeout (2 s) + grace, plus slack for a loaded host.
  ASSERT_TRUE(test::wait_until([&] { return !w.failure().is_ok(); }, 15s));
  const std::string why = w.failure().message();
  EXPECT_NE(why.find("server 1"), std::string::npos) << why;
  EXPECT_NE(why.find("the link between the two is broken"), std::string::npos) << why;
}

TEST(BrokenLink, AFailOverIsTheVerdictAndNothingFails) {
  InProcessCluster c(InProcessCluster::Config{});
  c.server(1).transport().stop();  // server 1 dies: its connections close
  ASSERT_TRUE(test::wait_until([&] { return c.worker(0).placement_epoch() == 1; }, 10s));
  std::this_thread::sleep_for(3500ms);  // past the verdict's deadline
  EXPECT_TRUE(c.worker(0).failure().is_ok()) << c.worker(0).failure().message();
  EXPECT_TRUE(c.server(0).failure().is_ok()) << c.server(0).failure().message();
}

TEST(BrokenLink, AFailOverThatArrivesBeforeTheCloseIsStillTheVerdict) {
  // Server 1 loses the scheduler: the scheduler fails it over, and the
  // placement (which drops and closes the workers' connections to it) can
  // reach a worker before server 1's own close does. That close must not
  // start a second wait for a verdict that already came.
  InProcessCluster c(InProcessCluster::Config{});
  Node& s1 = c.server(1);
  s1.transport().close(s1.conn(Role::kScheduler, 0), {ErrorCode::kIoError, "test: cut"});
  for (int w = 0; w < 3; ++w)
    ASSERT_TRUE(test::wait_until([&] { return c.worker(w).placement_epoch() == 1; }, 10s)) << w;
  std::this_thread::sleep_for(3500ms);  // past the verdict's deadline
  for (int w = 0; w < 3; ++w)
    EXPECT_TRUE(c.worker(w).failure().is_ok()) << w << ": " << c.worker(w).failure().message();
  EXPECT_TRUE(c.server(0).failure().is_ok()) << c.server(0).failure().message();
}

}  // namespace
}  // namespace pushpull::cluster
