// SPDX-License-Identifier: Apache-2.0
// Collectives as processes: through `pushpull launch` (its test build,
// pushpull_launch_cli, the same tools/launch.cpp), torchrun-style environment
// variables without the launcher, Slurm's variables, and a real mpirun. The
// rank program is tests/collective/collective_probe.cpp; every process a test
// starts is killed and reaped by its owner object, even on failure.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include <unistd.h>

#include <iostream>
#include <map>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "launch/harness.h"
#include "support/ports.h"
#include "support/process.h"
#include "transport/socket.h"

namespace pushpull {
namespace {

using launch::testing::bin;
using launch::testing::lines_of;
using launch::testing::run_launcher;
using ::testing::HasSubstr;
using ::testing::Not;

// Lines printed by one launched process ("[worker 1] ...").
std::vector<std::string> lines_from(const std::string& out, const std::string& label) {
  std::vector<std::string> mine;
  const std::string prefix = "[" + label + "] ";
  for (const auto& l : lines_of(out))
    if (l.rfind(prefix, 0) == 0) mine.push_back(l.substr(prefix.size()));
  return mine;
}

int count_containing(const std::vector<std::string>& lines, const std::string& s) {
  int n = 0;
  for (const auto& l : lines)
    n += l.find(s) != std::string::npos;
  return n;
}

// `pushpull launch -n 2 -s 0 kvstore_basics --kvstore dist_sync_allreduce`
// prints 6s on both workers, as the parameter-server type does; with -s 1
// (a scheduler and a server, MXNet style: the server runs the same program)
// the store bootstraps from the scheduler's address book instead.
void expect_sixes(const std::vector<std::string>& servers) {
  std::vector<std::string> args{"-n", "2", "--timeout", "30"};
  args.insert(args.end(), servers.begin(), servers.end());
  args.insert(args.end(), {bin("kvstore_basics"), "--kvstore", "dist_sync_allreduce"});
  auto r = run_launcher(args, std::chrono::seconds(90));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const std::string w : {"worker 0", "worker 1"}) {
    auto lines = lines_from(r.out, w);
    int at = -1;
    for (size_t i = 0; i < lines.size(); ++i)
      if (lines[i].find("(expect all 6)") != std::string::npos) at = static_cast<int>(i);
    ASSERT_GE(at, 0) << w << " printed no push result:\n" << r.out;
    ASSERT_LT(static_cast<size_t>(at + 2), lines.size());
    for (int row = 1; row <= 2; ++row)
      EXPECT_EQ(lines[static_cast<size_t>(at + row)], "  [  6.0000   6.0000   6.0000 ]") << w;
    EXPECT_EQ(count_containing(lines, "dist_sync_allreduce: rank "), 1) << w;
    EXPECT_EQ(count_containing(lines, "all values as expected"), 1) << w << "\n" << r.out;
  }
}

TEST(CollectiveLaunch, KvstoreBasicsPrintsSixesWithoutServers) {
  expect_sixes({"-s", "0"});
}

TEST(CollectiveLaunch, KvstoreBasicsPrintsSixesInAJobWithAServer) {
  expect_sixes(
      {"-s", "1", "--server-command", bin("kvstore_basics") + " --kvstore dist_sync_allreduce"});
}

// Port squatting (issue 35): another local user binds the ports the job is
// about to listen on. Every port pushpull listens on is bound once and held
// until used: the scheduler's by the launcher itself, -s 0 rank 0's
// rendezvous by the launcher and inherited by worker 0 (PUSHPULL_LISTEN_FD),
// an elastic member's mesh before it joins. tests/security/port_squatter.py
// is the squatter; as root it runs as uid 65534 (setpriv), else as this user
// (a held port is refused to any user alike).
const std::string kSquatter = std::string(PUSHPULL_SOURCE_DIR) + "/tests/security/port_squatter.py";

std::string python3() {
  for (const char* p : {"/usr/bin/python3", "/usr/local/bin/python3"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

// The squatter's command line, as another user when we can.
std::string squatter_command(const std::string& args) {
  std::string as_other;
  if (geteuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0)
    as_other = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups ";
  // The script on stdin: readable by uid 65534 wherever the tree lives.
  return as_other + python3() + " - " + args + " < '" + kSquatter + "'";
}

// The deterministic race: worker 0's command runs the squatter first, in the
// very window between the launcher publishing the ports and the job's
// processes listening on them (where the launcher once only picked a free
// port and worker 0 bound it later: the squatter got it, and worker 0 failed
// "cannot bind"). Every port is held already: the squatter gets none, the
// job ends with exit 0.
void squat_in_the_window(const std::vector<std::string>& servers,
                         const std::vector<std::string>& program, const std::string& ports) {
  if (python3().empty()) GTEST_SKIP() << "no python3 for tests/security/port_squatter.py";
  if (geteuid() != 0)
    std::cerr << "note: not root: the squatter runs as this user, not another one\n";
  const std::string wrapper = "if [ \"$RANK\" = 0 ]; then " +
                              squatter_command("window " + ports + " --hold 20") +
                              "; fi; exec \"$@\"";
  std::vector<std::string> args{"-n", "2", "--timeout", "30"};
  args.insert(args.end(), servers.begin(), servers.end());
  args.insert(args.end(), {"/bin/sh", "-c", wrapper, "sh"});
  args.insert(args.end(), program.begin(), program.end());
  auto r = run_launcher(args, std::chrono::seconds(90));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto lines = lines_from(r.out, "worker 0");
  EXPECT_EQ(count_containing(lines, "squatted "), 0) << r.out;
  EXPECT_EQ(count_containing(lines, "squatter done: 0 squatted"), 1) << r.out;
  EXPECT_GE(count_containing(lines, "held by the job "), 1) << r.out;
}

TEST(CollectiveLaunch, PortSquatterInTheWindowGetsNoRendezvousPort) {
  // -s 0: rank 0's rendezvous (PUSHPULL_MASTER_PORT). MASTER_PORT is a
  // torch.distributed store's (nobody listens on it here), not squatted.
  squat_in_the_window({"-s", "0"}, {bin("collective_probe"), "--sizes", "1,777"},
                      "\"$PUSHPULL_MASTER_PORT\"");
}

TEST(CollectiveLaunch, PortSquatterInTheWindowGetsNoSchedulerPort) {
  // -s 1: the embedded scheduler's port (PUSHPULL_ROOT_PORT).
  squat_in_the_window(
      {"-s", "1", "--server-command", bin("kvstore_basics") + " --kvstore dist_sync_allreduce"},
      {bin("kvstore_basics"), "--kvstore", "dist_sync_allreduce"}, "\"$PUSHPULL_ROOT_PORT\"");
}

// The racing squatter: while the job starts and runs, another user binds and
// holds every port the kernel hands out for port 0 (where the launcher's own
// port-0 binds land), churning. The job's listeners are never handed a port
// someone else holds, and none it holds can be taken.
TEST(CollectiveLaunch, PortSquatterRacingTheLauncherDoesNotStopTheJob) {
  if (python3().empty()) GTEST_SKIP() << "no python3 for tests/security/port_squatter.py";
  test::ChildProcess squatter({"/bin/sh", "-c", squatter_command("race --seconds 12")});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // already squatting
  for (int job = 0; job < 3; ++job) {
    auto r = run_launcher({"-n", "3", "-s", "0", "--timeout", "30", bin("collective_probe"),
                           "--dtypes", "float32", "--sizes", "1,777"},
                          std::chrono::seconds(60));
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    for (int w = 0; w < 3; ++w)
      EXPECT_EQ(count_containing(lines_from(r.out, "worker " + std::to_string(w)), "PASS "), 1)
          << r.out;
  }
  auto code = squatter.wait(std::chrono::seconds(20));
  ASSERT_TRUE(code.has_value()) << squatter.output();
  EXPECT_EQ(*code, 0) << squatter.output();
  EXPECT_THAT(squatter.output(), HasSubstr("squatter done")) << squatter.output();
  EXPECT_THAT(squatter.output(), Not(HasSubstr("done: 0 squatted"))) << "it squatted nothing";
}

// A port the user chose (--port) that another program holds fails the job
// before anything starts, saying so.
TEST(CollectiveLaunch, AGivenPortInUseIsSaidToBeInUse) {
  transport::Fd squatter = transport::listen_on("127.0.0.1", 0);
  const std::string port = std::to_string(transport::local_port(squatter.get()));
  for (const std::vector<std::string>& servers :
       {std::vector<std::string>{"-s", "0"},
        std::vector<std::string>{"-s", "1", "--server-command", bin("pushpull") + " server"}}) {
    std::vector<std::string> args{"-n", "2", "--port", port, "--timeout", "10"};
    args.insert(args.end(), servers.begin(), servers.end());
    args.push_back(bin("collective_probe"));
    auto r = run_launcher(args, std::chrono::seconds(30));
    EXPECT_NE(r.code, 0) << r.out << r.err;
    EXPECT_THAT(r.out + r.err, HasSubstr("port " + port + " is in use (by another process)"))
        << servers[1];
    EXPECT_EQ(count_containing(lines_of(r.out), "[worker "), 0) << "nothing may start:\n" << r.out;
  }
}

// Every op x dtype x some sizes, for world sizes 2..4, as processes.
class ProbeWorlds : public ::testing::TestWithParam<int> {};

TEST_P(ProbeWorlds, EveryOpAgreesWithTheLocalReference) {
  const int n = GetParam();
  auto r = run_launcher(
      {"-n", std::to_string(n), "-s", "0", "--timeout", "30", bin("collective_probe"), "--dtypes",
       "float32,float16,bfloat16,float64,int32,int64,uint8", "--sizes", "0,1,7,1000,100003"},
      std::chrono::seconds(150));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int w = 0; w < n; ++w) {
    auto lines = lines_from(r.out, "worker " + std::to_string(w));
    EXPECT_EQ(count_containing(lines, fmt::format("PLACE rank={} size={} local_rank={} "
                                                  "local_size={} mode=rendezvous",
                                                  w, n, w, n)),
              1)
        << r.out;
    EXPECT_EQ(count_containing(lines, "PASS "), 1) << r.out;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ProbeWorlds, ::testing::Values(2, 3, 4));

// Starts `n` probes with per-rank variables from `env_of(rank)`.
std::vector<std::unique_ptr<test::ChildProcess>> start_probes(
    int n, const std::vector<std::string>& args,
    const std::function<std::map<std::string, std::string>(int)>& env_of) {
  std::vector<std::unique_ptr<test::ChildProcess>> ps;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv{bin("collective_probe")};
    argv.insert(argv.end(), args.begin(), args.end());
    ps.push_back(std::make_unique<test::ChildProcess>(argv, env_of(r)));
  }
  return ps;
}

std::map<std::string, std::string> torchrun_env(int rank, int n, int port) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(n)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"PUSHPULL_JOB_ID", "collective-launch-test-" + std::to_string(port)},
          {"PUSHPULL_TIMEOUT", "20"}};
}

TEST(CollectiveProcesses, TorchrunStyleEnvironmentWithoutTheLauncher) {
  const int n = 3, port = test::free_port();
  auto ps = start_probes(n, {"--dtypes", "float32,int64", "--sizes", "1,5000"},
                         [&](int r) { return torchrun_env(r, n, port); });
  for (int r = 0; r < n; ++r) {
    auto code = ps[static_cast<size_t>(r)]->wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " still running";
    EXPECT_EQ(*code, 0) << ps[static_cast<size_t>(r)]->output();
    EXPECT_THAT(ps[static_cast<size_t>(r)]->output(),
                HasSubstr(fmt::format("PLACE rank={} size={} local_rank={}", r, n, r)));
    EXPECT_THAT(ps[static_cast<size_t>(r)]->output(), HasSubstr("PASS "));
  }
}

TEST(CollectiveProcesses, SlurmVariables) {
  const int n = 2, port = test::free_port();
  auto ps = start_probes(n, {"--sizes", "3"}, [&](int r) {
    return std::map<std::string, std::string>{
        {"SLURM_PROCID", std::to_string(r)},
        {"SLURM_NTASKS", std::to_string(n)},
        {"SLURM_LOCALID", std::to_string(1 - r)},  // whatever srun says is kept
        {"PUSHPULL_MASTER_ADDR", "127.0.0.1"},
        {"PUSHPULL_MASTER_PORT", std::to_string(port)},
        {"PUSHPULL_JOB_ID", "collective-slurm-test-" + std::to_string(port)},
        {"PUSHPULL_TIMEOUT", "20"}};
  });
  for (int r = 0; r < n; ++r) {
    auto code = ps[static_cast<size_t>(r)]->wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 0) << ps[static_cast<size_t>(r)]->output();
    EXPECT_THAT(ps[static_cast<size_t>(r)]->output(),
                HasSubstr(fmt::format("PLACE rank={} size={} local_rank={}", r, n, 1 - r)));
  }
}

// A rank killed mid-training: every other rank's pending allreduce fails
// with PeerFailure, well within the deadline, and each exits by itself.
TEST(CollectiveProcesses, AKilledRankIsAPeerFailureEverywhere) {
  const int n = 4, victim = 2, port = test::free_port();
  auto start = std::chrono::steady_clock::now();
  auto ps = start_probes(n, {"--victim", std::to_string(victim), "--after", "30"},
                         [&](int r) { return torchrun_env(r, n, port); });
  for (int r = 0; r < n; ++r) {
    auto code = ps[static_cast<size_t>(r)]->wait(std::chrono::seconds(30));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " hangs:\n" << ps[r]->output();
    if (r == victim) {
      EXPECT_EQ(*code, 128 + SIGKILL);
      continue;
    }
    EXPECT_EQ(*code, 3) << ps[static_cast<size_t>(r)]->output();
    EXPECT_THAT(ps[static_cast<size_t>(r)]->output(), HasSubstr("ERROR PeerFailure"));
    // Every survivor blames the rank that was killed.
    EXPECT_THAT(ps[static_cast<size_t>(r)]->output(),
                HasSubstr("collective: rank 2 (host 127.0.0.1:"));
  }
  // PUSHPULL_TIMEOUT is 20 s; a closed connection is noticed far sooner.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

// A SIGSTOPped rank keeps its connections open and sends nothing: only the
// heartbeats among the ranks reveal it. Every other rank's pending allreduce
// fails with PeerFailure naming the stopped rank within the heartbeat
// timeout plus 2 s (plus slack for a loaded machine).
class StoppedRank : public ::testing::TestWithParam<int> {};

TEST_P(StoppedRank, IsDetectedByHeartbeatsAndNamedEverywhere) {
  const int n = 3, victim = GetParam(), port = test::free_port();
  auto ps = start_probes(n, {"--victim", std::to_string(victim), "--after", "20", "--stop", "1"},
                         [&](int r) {
                           auto env = torchrun_env(r, n, port);
                           env["PUSHPULL_HEARTBEAT_TIMEOUT_MS"] = "1500";
                           env["PUSHPULL_HEARTBEAT_INTERVAL_MS"] = "100";
                           return env;
                         });
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    auto code = ps[static_cast<size_t>(r)]->wait(std::chrono::seconds(30));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " hangs:\n" << ps[r]->output();
    EXPECT_EQ(*code, 3) << ps[static_cast<size_t>(r)]->output();
    const std::string out = ps[static_cast<size_t>(r)]->output();
    EXPECT_THAT(out, HasSubstr(fmt::format("collective: rank {} (host 127.0.0.1:", victim)));
    EXPECT_THAT(out, HasSubstr("no heartbeat for"));
    // "ERROR PeerFailure <ms since the last good op> ...": within 1.5 s + 2 s,
    // with 3 s of slack for a busy machine.
    auto at = out.find("ERROR PeerFailure ");
    ASSERT_NE(at, std::string::npos) << out;
    EXPECT_LT(std::stoll(out.substr(at + 18)), 1500 + 2000 + 3000) << out;
  }
  ps[static_cast<size_t>(victim)]->signal(SIGKILL);
  EXPECT_TRUE(ps[static_cast<size_t>(victim)]->wait(std::chrono::seconds(10)).has_value());
}

// Rank 0 coordinates; rank 1 is an ordinary member.
INSTANTIATE_TEST_SUITE_P(Victims, StoppedRank, ::testing::Values(0, 1));

// The same in a cluster job (`launch -s 1`): the scheduler's heartbeats
// catch the stopped worker and its verdict fails the mesh's operations.
TEST(CollectiveProcesses, AStoppedWorkerOfAClusterJobIsNamedByTheScheduler) {
  auto r = run_launcher(
      {"-n", "3", "-s", "1", "--timeout", "30", "--server-command", bin("pushpull") + " server",
       bin("collective_probe"), "--victim", "1", "--after", "20", "--stop", "1"},
      std::chrono::seconds(60), [](pid_t, const std::string&) {}, "",
      {"/usr/bin/env", "PUSHPULL_HEARTBEAT_TIMEOUT_MS=1500", "PUSHPULL_HEARTBEAT_INTERVAL_MS=100"});
  EXPECT_NE(r.code, 0) << r.out << r.err;
  for (const std::string w : {"worker 0", "worker 2"}) {
    auto lines = lines_from(r.out, w);
    int errors = 0;
    for (const auto& l : lines) {
      if (l.rfind("ERROR ", 0) != 0) continue;
      ++errors;
      EXPECT_THAT(l, HasSubstr("ERROR PeerFailure"));
      EXPECT_THAT(l, HasSubstr("worker 1 (host 127.0.0.1:"));
      EXPECT_THAT(l, HasSubstr("no heartbeat for"));
      EXPECT_LT(std::stoll(l.substr(18)), 1500 + 2000 + 3000) << l;
    }
    EXPECT_EQ(errors, 1) << w << ":\n" << r.out << r.err;
  }
}

TEST(CollectiveProcesses, Mpirun) {
  if (access("/usr/bin/mpirun", X_OK) != 0) GTEST_SKIP() << "OpenMPI's mpirun is not installed";
  const int port = test::free_port();
  // Our own OpenMPI session directory: parallel mpiruns race on the shared one.
  char session[] = "/tmp/pp-ompi-XXXXXX";
  ASSERT_NE(mkdtemp(session), nullptr);
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{session};
  test::ChildProcess mpirun(
      {"/usr/bin/mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x",
       "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=" + std::to_string(port), "-x",
       "PUSHPULL_JOB_ID=collective-mpi-test-" + std::to_string(port), "-x", "PUSHPULL_TIMEOUT=20",
       bin("collective_probe"), "--dtypes", "float32,float16", "--sizes", "1,777"},
      {{"OMPI_MCA_orte_tmpdir_base", session}});
  auto code = mpirun.wait(std::chrono::seconds(90));
  ASSERT_TRUE(code.has_value()) << "mpirun still running";
  EXPECT_EQ(*code, 0) << mpirun.output();
  EXPECT_THAT(mpirun.output(), HasSubstr("PLACE rank=0 size=2 local_rank=0 local_size=2"));
  EXPECT_THAT(mpirun.output(), HasSubstr("PLACE rank=1 size=2 local_rank=1 local_size=2"));
  auto out = mpirun.output();
  size_t passes = 0;
  for (size_t at = out.find("PASS "); at != std::string::npos; at = out.find("PASS ", at + 1))
    ++passes;
  EXPECT_EQ(passes, 2u) << out;
}

}  // namespace
}  // namespace pushpull
