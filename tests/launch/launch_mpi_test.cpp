// SPDX-License-Identifier: Apache-2.0
// `pushpull launch --launcher mpi`: a real OpenMPI mpirun on this host.
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness.h"

namespace pushpull::launch::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

class LaunchMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/usr/bin/mpirun", X_OK) != 0) GTEST_SKIP() << "OpenMPI's mpirun is not installed";
    // A session directory of our own: two mpiruns started at once by a
    // parallel ctest otherwise race on OpenMPI's shared one ("File exists").
    setenv("OMPI_MCA_orte_tmpdir_base", session_.path().c_str(), 1);
  }
  void TearDown() override { unsetenv("OMPI_MCA_orte_tmpdir_base"); }
  TempDir session_;
};

// The probes print "OPTIONS role=.. rank=.. size=.." from Options::from_env,
// which maps OMPI_COMM_WORLD_* to the ranks when the launcher sets none.
TEST_F(LaunchMpi, WorkersTakeTheirRanksFromOpenMpi) {
  std::string probe = bin("launch_probe");
  auto r = run_launcher({"--launcher", "mpi", "-n", "2", "-s", "1", "--timeout", "30",
                         "--server-command", probe + " --print-env", "--", probe, "--print-env"},
                        90s);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("[mpirun] OPTIONS role=worker rank=0 size=2 local_rank=0"));
  EXPECT_THAT(r.out, HasSubstr("[mpirun] OPTIONS role=worker rank=1 size=2 local_rank=1"));
  EXPECT_THAT(r.out, HasSubstr("[mpirun] OPTIONS role=server"));
  EXPECT_THAT(r.out, HasSubstr("[mpirun] ENV OMPI_COMM_WORLD_RANK=1"));
  EXPECT_THAT(r.out, HasSubstr("[mpirun] ENV DMLC_PS_ROOT_URI=127.0.0.1"));
  EXPECT_THAT(r.out, HasSubstr("[mpirun] ENV DMLC_NUM_WORKER=2"));
  // Per-process variables come from mpirun, not from the launcher.
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("ENV RANK=")));
}

TEST_F(LaunchMpi, ClusterNodesStartedByMpirunJoinTheLauncher) {
  std::string node = bin("launch_node_probe");
  auto r = run_launcher({"--launcher", "mpi", "-n", "2", "-s", "1", "--timeout", "30",
                         "--server-command", node, "--", node},
                        90s);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("NODE worker 0 of 1+2"));
  EXPECT_THAT(r.out, HasSubstr("NODE worker 1 of 1+2"));
  EXPECT_THAT(r.out, HasSubstr("NODE server 0 of 1+2"));
}

TEST_F(LaunchMpi, AFailedRankFailsTheJob) {
  std::string probe = bin("launch_probe");
  auto r = run_launcher({"--launcher", "mpi", "-n", "2", "-s", "0", "--grace", "2", "--", probe,
                         "--fail-rank", "1", "--exit", "3", "--sleep", "60"},
                        90s);
  // mpirun passes the failed rank's exit code on.
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("mpirun (pid"));
  for (auto& [label, p] : parse_probes(r.out)) {
    if (p.pid > 0) {
      EXPECT_TRUE(wait_gone(p.pid)) << "pid " << p.pid << " still runs";
    }
  }
}

}  // namespace
}  // namespace pushpull::launch::testing
