// SPDX-License-Identifier: Apache-2.0
// Backup workers under the launcher (docs/ps.md "Backup workers"): 3
// workers x 2 servers (one backup per range, the default), dist_sync with
// PUSHPULL_PS_BACKUP_WORKERS=1 and worker 2 slowed to 3x its step. The job
// must finish with every worker having pulled the same value after each
// round, each round's step being what a valid set of pushes gives (the sum
// of the counted pushes scaled to 3), and the servers counting the late
// pushes they dropped (metrics: ps_late_pushes_dropped). The servers run
// without the variable (worker 0's setting reaches them with the mode
// command). A server SIGKILLed while the straggler is behind changes none
// of that (3 servers). b >= N is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "support/launched_job.h"
#include "support/process.h"

namespace pushpull {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using test::bin;
using test::TempDir;

// `pids`: a file the servers append "rank pid" to (for a fail-over).
std::unique_ptr<test::ChildProcess> launch(const std::string& workers, int rounds, int step_ms,
                                           std::map<std::string, std::string> env,
                                           const std::string& servers = "2",
                                           const std::string& pids = "") {
  env.insert({{"PUSHPULL_BIGARRAY_BOUND", "1000"},
              {"PUSHPULL_PS_CHUNK_BYTES", "4096"},
              {"PUSHPULL_HEARTBEAT_INTERVAL_MS", "200"},
              {"PUSHPULL_HEARTBEAT_TIMEOUT_MS", "5000"}});
  // The servers do not see the variable: worker 0's store sends it to them.
  std::string server = "env -u PUSHPULL_PS_BACKUP_WORKERS " + bin("pushpull") + " server";
  if (!pids.empty()) server = "sh -c 'echo $PUSHPULL_RANK $$ >> " + pids + "; exec " + server + "'";
  return std::make_unique<test::ChildProcess>(
      std::vector<std::string>{bin("pushpull"), "launch", "-n", workers, "-s", servers,
                               "--server-command", server, "--", bin("ps_backup_worker"),
                               std::to_string(rounds), std::to_string(step_ms)},
      env);
}

// The counter's value in the last line of a metrics file (-1 when absent).
int64_t last_counter(const std::string& file, const std::string& name) {
  std::ifstream in(file);
  int64_t value = -1;
  const std::regex re("\"" + name + "\":([0-9]+)");
  for (std::string line; std::getline(in, line);)
    if (std::smatch m; std::regex_search(line, m, re)) value = std::stoll(m[1]);
  return value;
}

// Every worker pulled the same value after each of `rounds` rounds, and each
// round stepped by what a valid set of pushes gives.
void expect_same_values(const std::string& out, int rounds) {
  // round -> worker -> increment over the initial values
  std::map<int, std::map<int, double>> seen;
  const std::regex re("VALUE ([0-9]+) ([0-9]+) ([-0-9.e+]+)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it)
    seen[std::stoi((*it)[2])][std::stoi((*it)[1])] = std::stod((*it)[3]);
  ASSERT_EQ(seen.size(), static_cast<size_t>(rounds)) << out;
  // 0.5 * (sum of the counted pushes r + 1) * 3 / (pushes counted).
  const std::set<double> steps = {0.5 * 3 * 1.5, 0.5 * 4 * 1.5, 0.5 * 5 * 1.5, 0.5 * 6};
  double before = 0;
  for (auto& [k, by_worker] : seen) {
    ASSERT_EQ(by_worker.size(), 3u) << "round " << k << "\n" << out;
    for (auto& [w, v] : by_worker)
      EXPECT_EQ(v, by_worker.at(0)) << "worker " << w << " pulled another value in round " << k;
    EXPECT_EQ(steps.count(by_worker.at(0) - before), 1u)
        << "round " << k << " stepped by " << by_worker.at(0) - before;
    before = by_worker.at(0);
  }
}

TEST(PsBackup, AStragglerIsDroppedAndEveryWorkerPullsTheSameValueEachRound) {
  TempDir dir("pp-backup");
  const int rounds = 12;
  auto job = launch("3", rounds, 30,
                    {{"PUSHPULL_PS_BACKUP_WORKERS", "1"},
                     {"PP_TEST_SLOW", "2:60"},
                     {"PUSHPULL_METRICS", dir.path + "/m"}});
  auto code = job->wait(120s);
  ASSERT_TRUE(code.has_value()) << "launcher still running:\n" << job->output();
  const std::string out = job->output();
  ASSERT_EQ(*code, 0) << out;
  expect_same_values(out, rounds);
  int64_t dropped = 0;
  for (int s = 0; s < 2; ++s) {
    int64_t c = last_counter(dir.path + "/m.server" + std::to_string(s) + ".jsonl",
                             "ps_late_pushes_dropped");
    ASSERT_GE(c, 0) << "no metrics from server " << s;
    dropped += c;
  }
  EXPECT_GT(dropped, 0) << "the straggler was never late";
  for (int w = 0; w < 3; ++w)
    EXPECT_THAT(out, HasSubstr("OK worker " + std::to_string(w)));
}

// A primary SIGKILLed while the straggler is rounds behind: its backup,
// promoted, answers the straggler with the values of its rounds (it kept
// them from the replicas), so nobody sees another value.
TEST(PsBackup, AFailOverWhileAWorkerIsBehindKeepsEveryWorkerOnTheSameValues) {
  TempDir dir("pp-backup");
  const int rounds = 30;
  const std::string pids = dir.path + "/servers";
  auto job = launch("3", rounds, 30,
                    {{"PUSHPULL_PS_BACKUP_WORKERS", "1"}, {"PP_TEST_SLOW", "2:60"}}, "3", pids);
  auto until = std::chrono::steady_clock::now() + 60s;
  while (job->output().find("VALUE 0 12 ") == std::string::npos &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  auto servers = test::read_rank_pids(pids);
  ASSERT_EQ(servers.count(1), 1u) << job->output();
  ::kill(servers[1], SIGKILL);
  auto code = job->wait(120s);
  ASSERT_TRUE(code.has_value()) << "launcher still running:\n" << job->output();
  const std::string out = job->output();
  ASSERT_EQ(*code, 0) << out;
  EXPECT_THAT(out, HasSubstr("fail-over: server 1"));
  expect_same_values(out, rounds);
}

TEST(PsBackup, AsManyBackupWorkersAsWorkersIsRefused) {
  auto job = launch("2", 2, 0, {{"PUSHPULL_PS_BACKUP_WORKERS", "2"}});
  auto code = job->wait(60s);
  ASSERT_TRUE(code.has_value()) << job->output();
  EXPECT_NE(*code, 0);
  EXPECT_THAT(job->output(), HasSubstr("PUSHPULL_PS_BACKUP_WORKERS=2 needs more workers"));
}

}  // namespace
}  // namespace pushpull
