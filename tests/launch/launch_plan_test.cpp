// SPDX-License-Identifier: Apache-2.0
// Units of the launcher: the plan (ranks, local ranks, each process's
// variables, the rendezvous ports) and a descriptor the supervisor passes to
// one child only.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "launch/plan.h"
#include "launch/supervisor.h"
#include "two_host_config.h"

namespace pushpull::launch {
namespace {

using ::testing::ElementsAre;

TEST(Plan, RanksLocalRanksAndEnvironment) {
  auto cfg = two_host_config();
  auto plan = make_plan(cfg, {"10.0.0.1", 4567});
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].label(), "server 0");
  EXPECT_EQ(plan[0].host, "a");
  EXPECT_EQ(plan[0].ssh_port, 2200);
  EXPECT_THAT(plan[0].argv, ElementsAre("/bin/sh", "-c", "exec pushpull server"));
  // Workers 0, 1, 2 on a, b, a.
  EXPECT_EQ(plan[1].host, "a");
  EXPECT_EQ(plan[2].host, "b");
  EXPECT_EQ(plan[3].host, "a");
  EXPECT_EQ(plan[3].label(), "worker 2");
  EXPECT_EQ(plan[3].local_rank, 1);
  EXPECT_EQ(plan[3].local_size, 2);
  EXPECT_EQ(plan[2].local_rank, 0);
  EXPECT_EQ(plan[2].local_size, 1);

  const auto& w = plan[3].env;
  std::map<std::string, std::string> expect = {
      {"DMLC_ROLE", "worker"},
      {"PUSHPULL_ROLE", "worker"},
      {"DMLC_PS_ROOT_URI", "10.0.0.1"},
      {"PUSHPULL_ROOT_URI", "10.0.0.1"},
      {"DMLC_PS_ROOT_PORT", "4567"},
      {"PUSHPULL_ROOT_PORT", "4567"},
      {"DMLC_NUM_WORKER", "3"},
      {"PUSHPULL_NUM_WORKER", "3"},
      {"DMLC_NUM_SERVER", "1"},
      {"PUSHPULL_NUM_SERVER", "1"},
      {"DMLC_NODE_HOST", "a"},
      {"PUSHPULL_NODE_HOST", "a"},
      {"DMLC_INTERFACE", "eth1"},
      {"PUSHPULL_INTERFACE", "eth1"},
      {"RANK", "2"},
      {"PUSHPULL_RANK", "2"},
      {"WORLD_SIZE", "3"},
      {"PUSHPULL_WORLD_SIZE", "3"},
      {"LOCAL_RANK", "1"},
      {"PUSHPULL_LOCAL_RANK", "1"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"PUSHPULL_LOCAL_SIZE", "2"},
      {"HOROVOD_RANK", "2"},
      {"HOROVOD_SIZE", "3"},
      {"HOROVOD_LOCAL_RANK", "1"},
      {"HOROVOD_LOCAL_SIZE", "2"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"PUSHPULL_MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "4567"},
      {"PUSHPULL_MASTER_PORT", "4567"},
      {"PUSHPULL_TIMEOUT", "12"},
      {"PUSHPULL_JOB_ID", "job7"},
      {"A", "1"},
      {"W", "2"},
      // Host a holds server 0, worker 0, then this one (Prometheus port P + 2).
      {"PUSHPULL_HOST_PROCESS_INDEX", "2"},
  };
  EXPECT_EQ(w, expect);
  EXPECT_EQ(plan[0].env.at("PUSHPULL_HOST_PROCESS_INDEX"), "0");
  EXPECT_EQ(plan[1].env.at("PUSHPULL_HOST_PROCESS_INDEX"), "1");
  EXPECT_EQ(plan[2].env.at("PUSHPULL_HOST_PROCESS_INDEX"), "0");  // the first on host b

  const auto& s = plan[0].env;
  EXPECT_EQ(s.at("DMLC_ROLE"), "server");
  EXPECT_EQ(s.at("PUSHPULL_RANK"), "0");
  EXPECT_EQ(s.at("S"), "3");
  EXPECT_EQ(s.count("W"), 0u);
  EXPECT_EQ(s.count("RANK"), 0u) << "servers are not part of the workers' world";
  EXPECT_EQ(s.count("HOROVOD_RANK"), 0u);
}

// -s 0 with the local launcher: worker 0 inherits the held rendezvous port
// (PUSHPULL_MASTER_PORT); a torch.distributed store, which cannot adopt that
// socket, gets MASTER_PORT of its own. Without one (ssh, mpirun, srun), both
// are the rendezvous port, as before.
TEST(Plan, WithoutServersAHeldRendezvousPortAndATorchPortOfItsOwn) {
  LaunchConfig cfg;
  cfg.num_workers = 2;
  cfg.num_servers = 0;
  cfg.command = {"./train"};
  Rendezvous rv{"127.0.0.1", 4567};
  rv.master_addr = "127.0.0.1";
  rv.master_port = 4568;
  for (const auto& p : make_plan(cfg, rv)) {
    EXPECT_EQ(p.env.at("PUSHPULL_MASTER_PORT"), "4567") << p.label();
    EXPECT_EQ(p.env.at("MASTER_PORT"), "4568") << p.label();
    EXPECT_EQ(p.env.at("MASTER_ADDR"), "127.0.0.1") << p.label();
    EXPECT_EQ(p.env.count("PUSHPULL_LISTEN_FD"), 0u) << "passed by run_launch to worker 0 only";
  }
  for (const auto& p : make_plan(cfg, {"127.0.0.1", 4567})) {
    EXPECT_EQ(p.env.at("PUSHPULL_MASTER_PORT"), "4567") << p.label();
    EXPECT_EQ(p.env.at("MASTER_PORT"), "4567") << p.label();
  }
}

// ChildSpec::pass_fd: that child alone inherits the descriptor (at the same
// number), its sibling does not, and the supervisor closes the launcher's
// copy once the child started (it holds the port alone).
TEST(Supervisor, APassedDescriptorReachesThatChildOnly) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  const int passed = fds[0];
  ::close(fds[1]);
  const std::string probe = "/proc/$$/fd/" + std::to_string(passed);
  auto child = [&](const std::string& label, const std::string& test) {
    ChildSpec c;
    c.label = label;
    c.argv = {"/bin/sh", "-c", test + " || { echo 'fd " + std::to_string(passed) + "'; exit 3; }"};
    for (char** e = environ; *e; ++e)
      c.env.emplace_back(*e);
    return c;
  };
  std::vector<ChildSpec> specs;
  specs.push_back(child("sibling before", "[ ! -e " + probe + " ]"));
  specs.push_back(child("heir", "[ -e " + probe + " ]"));
  specs.back().pass_fd = passed;
  specs.push_back(child("sibling after", "[ ! -e " + probe + " ]"));
  SignalGuard signals;
  SupervisorSettings settings;
  auto outcome = supervise(signals, std::move(specs), settings);
  EXPECT_EQ(outcome.exit_code, 0) << outcome.reason;
  errno = 0;
  EXPECT_EQ(fcntl(passed, F_GETFD), -1) << "the launcher's copy is still open";
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
}  // namespace pushpull::launch
