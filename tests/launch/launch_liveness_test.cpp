// SPDX-License-Identifier: Apache-2.0
// `pushpull launch` when processes fail: the final line names the root
// cause (not a node that failed because of it), the exit code is the
// victim's, the job ends soon after a process exits early, and no process
// outlives the launcher, even when the launcher is killed with SIGKILL.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "cluster/scheduler.h"
#include "harness.h"

namespace pushpull::launch::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

const std::string kNode = bin("launch_node_probe");

const std::string kProbe = bin("launch_probe");

// The launcher's last "job failed: " line, and what follows it.
std::string final_report(const std::string& err) {
  auto at = err.rfind("job failed: ");
  return at == std::string::npos ? "" : err.substr(at);
}

struct Timed {
  Result r;
  double seconds = 0;
};

Timed timed_launch(const std::vector<std::string>& args, std::chrono::seconds deadline = 90s) {
  auto start = std::chrono::steady_clock::now();
  Timed t;
  t.r = run_launcher(args, deadline);
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return t;
}

// Real cluster nodes; worker 1 is SIGKILLed after joining; the others fail
// because of it (the scheduler tells them) and exit 1 first or later.
TEST(LaunchLiveness, ASigkilledWorkerIsTheRootCause) {
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto r =
        run_launcher({"-n", "3", "-s", "2", "--timeout", "20", "--grace", "2", "--server-command",
                      kNode, "--", kNode, "--fail-rank", "1", "--fail-how", "kill9"},
                     60s);
    EXPECT_EQ(r.code, 137) << r.err;
    auto report = final_report(r.err);
    EXPECT_THAT(report, ::testing::ContainsRegex("^job failed: worker 1 \\(pid [0-9]+, host "
                                                 "127\\.0\\.0\\.1\\) was killed by signal 9 "
                                                 "\\(SIGKILL\\)\n"))
        << r.err;
    EXPECT_THAT(report, ::testing::Not(HasSubstr("server 0 (pid"))) << r.err;
  }
}

// A stopped worker (SIGSTOP) is caught by the heartbeats: named, exit code 1.
TEST(LaunchLiveness, AStoppedWorkerIsNamedByTheHeartbeats) {
  auto r = run_launcher({"-n", "2", "-s", "1", "--timeout", "3", "--grace", "1", "--server-command",
                         kNode, "--", kNode, "--fail-rank", "1", "--fail-how", "stop"},
                        60s);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(
      final_report(r.err),
      ::testing::ContainsRegex("^job failed: worker 1 \\(pid [0-9]+, host 127\\.0\\.0\\.1\\) "
                               "failed \\(reported by "))
      << r.err;
}

// Worker 1 exits 3 before it joins: the job fails at once naming it, instead
// of the others waiting for the registration deadline.
TEST(LaunchLiveness, AWorkerThatExitsBeforeJoiningIsNamedAtOnce) {
  auto t = timed_launch({"-n", "3", "-s", "2", "--timeout", "60", "--grace", "2",
                         "--server-command", kNode, "--", "sh", "-c",
                         "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec " + kNode});
  EXPECT_EQ(t.r.code, 3) << t.r.err;
  EXPECT_THAT(
      final_report(t.r.err),
      ::testing::ContainsRegex("^job failed: worker 1 \\(pid [0-9]+, host 127\\.0\\.0\\.1\\) "
                               "exited with code 3"))
      << t.r.err;
  // Promptly (2 s on an idle machine); loose here, the machine is shared.
  EXPECT_LT(t.seconds, 20) << t.r.err;
  RecordProperty("seconds", std::to_string(t.seconds));
}

// Workers that never join (a program that opens no store) and exit 0: the
// job succeeds and the servers and the scheduler stop soon after.
TEST(LaunchLiveness, WorkersThatExitZeroWithoutJoiningEndTheJob) {
  auto t = timed_launch({"-n", "8", "-s", "2", "--timeout", "60", "--server-command", kNode, "--",
                         "sh", "-c", "echo rank $RANK"});
  EXPECT_EQ(t.r.code, 0) << t.r.err;
  for (int i = 0; i < 8; ++i)
    EXPECT_THAT(t.r.out, HasSubstr("[worker " + std::to_string(i) + "] rank " + std::to_string(i)));
  EXPECT_LT(t.seconds, 20) << "the servers waited for the deadline\n" << t.r.err;
  RecordProperty("seconds", std::to_string(t.seconds));
}

// Worker 1 exits 0 without joining while worker 0 waits for it in the
// registration: the job fails naming worker 1.
TEST(LaunchLiveness, AWorkerThatLeavesOthersWaitingFailsTheJob) {
  auto t = timed_launch({"-n", "2", "-s", "1", "--timeout", "60", "--grace", "2",
                         "--server-command", kNode, "--", "sh", "-c",
                         "if [ \"$RANK\" = 1 ]; then exit 0; fi; exec " + kNode});
  EXPECT_EQ(t.r.code, 1) << t.r.err;
  EXPECT_THAT(
      final_report(t.r.err),
      ::testing::ContainsRegex("^job failed: worker 1 \\(pid [0-9]+, host 127\\.0\\.0\\.1\\) "
                               "failed \\(reported by [a-z0-9 ]+, exited with code 0\\)"))
      << t.r.err;
  EXPECT_LT(t.seconds, 30) << t.r.err;
}

// Collective-only job (no scheduler): a rank's failure ends the job.
TEST(LaunchLiveness, ACollectiveRankFailureStopsTheOthers) {
  auto r = run_launcher({"-n", "3", "-s", "0", "--grace", "2", "--", kProbe, "--fail-rank", "2",
                         "--fail-after", "0.5", "--exit", "5", "--sleep", "60"},
                        40s);
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_THAT(final_report(r.err), ::testing::ContainsRegex("^job failed: worker 2 \\(pid [0-9]+"));
  for (auto& [label, p] : parse_probes(r.out)) {
    if (p.pid > 0) {
      EXPECT_TRUE(wait_gone(p.pid)) << label;
    }
  }
}

// The pids a job of `sh -c 'sleep 300 & echo GRANDCHILD $!; echo CHILD $$; wait'`
// processes printed, once `count` are there (or 20 s passed).
std::vector<int> wait_for_pids(const std::string& out, size_t count) {
  std::vector<int> pids;
  auto until = std::chrono::steady_clock::now() + 20s;
  std::regex pid_line("\\] (GRANDCHILD|CHILD) ([0-9]+)");
  while (std::chrono::steady_clock::now() < until) {
    pids.clear();
    std::string text = read_file(out);
    for (std::sregex_iterator it(text.begin(), text.end(), pid_line), end; it != end; ++it)
      pids.push_back(std::stoi((*it)[2]));
    if (pids.size() >= count) break;
    std::this_thread::sleep_for(20ms);
  }
  return pids;
}

const std::string kTree = "sleep 300 & echo GRANDCHILD $!; echo CHILD $$; wait";

// Ctrl-C to the launcher: forwarded to every process group, so what the
// processes started goes too.
TEST(LaunchLiveness, SigintToTheLauncherStopsEveryGroup) {
  std::vector<int> pids;
  auto r = run_launcher({"-n", "2", "-s", "0", "--grace", "2", "--", "sh", "-c", kTree}, 40s,
                        [&](pid_t launcher, const std::string& out) {
                          pids = wait_for_pids(out, 4);
                          kill(launcher, SIGINT);
                        });
  EXPECT_EQ(r.code, 128 + SIGINT) << r.err;
  EXPECT_THAT(final_report(r.err), HasSubstr("job failed: the launcher received SIGINT"));
  ASSERT_EQ(pids.size(), 4u) << r.out;
  for (int pid : pids)
    EXPECT_TRUE(wait_gone(pid)) << "pid " << pid << " outlived the launcher";
}

// The launcher killed with SIGKILL: its children die (PR_SET_PDEATHSIG) and
// so does what they started (the guardian kills their process groups).
TEST(LaunchLiveness, SigkillOfTheLauncherLeavesNoProcessBehind) {
  std::vector<int> pids;
  auto r = run_launcher(
      {"-n", "2", "-s", "1", "--timeout", "60", "--server-command", kTree, "--", "sh", "-c", kTree},
      40s, [&](pid_t launcher, const std::string& out) {
        pids = wait_for_pids(out, 6);
        kill(launcher, SIGKILL);
      });
  EXPECT_EQ(r.code, 128 + SIGKILL);
  ASSERT_EQ(pids.size(), 6u) << r.out;
  for (int pid : pids)
    EXPECT_TRUE(wait_gone(pid, 5000ms)) << "pid " << pid << " outlived the launcher";
}

}  // namespace
}  // namespace pushpull::launch::testing
