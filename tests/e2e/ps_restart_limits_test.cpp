// SPDX-License-Identifier: Apache-2.0
// Worker and server restart under the launcher (docs/ps.md "Worker
// restart"), its limits: a restarted server lost while catching up is failed
// over again; a replacement registering while a server is stopped does not
// wait for it; nothing is restarted once the job failed; a late worker
// claiming a live rank is refused; a replacement that does not register in
// time, restarts used up, or no --max-restarts fail the job naming the
// worker.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>
#include <thread>

#include "ps_restart_job.h"

namespace pushpull {
namespace {

using namespace restart_testing;

// A restarted server stopped (or then killed) while catching up: it is
// failed over again and restarted once more, and nothing else fails. Before,
// the nodes it had dialed kept a verdict on it that no placement cleared
// and failed the job ("the link between the two is broken"), and a stopped
// one could leave a part replicating forever. Its first restart stops itself
// right after asking the live servers for its ranges (a test hook).
// With --max-restarts 1 it is not restarted again: the job goes on with the
// other two servers (every range still has a live one).
class PsRestartCatchUp : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(PsRestartCatchUp, AServerLostWhileCatchingUpIsFailedOverAgain) {
  const auto [kill_it, restarts] = GetParam();
  TempDir dir("pp-restart");
  const std::string servers = dir.path + "/servers";
  // The second process of a rank (its first restart) gets the hook.
  const std::string hook = "n=$(grep -c \"^$PUSHPULL_RANK \" " + servers +
                           " 2>/dev/null); if [ \"$n\" = 1 ]; then export "
                           "PUSHPULL_TEST_STOP_WHILE_CATCHING_UP=1; fi; ";
  Job job(dir.path, "sync", 300, restarts, 20, servers, {}, hook);
  ASSERT_TRUE(job.wait_round(5)) << job.proc->output();
  ASSERT_GT(job.signal_server(1, SIGKILL), 0);
  auto until = std::chrono::steady_clock::now() + 30s;
  while (job.proc->output().find("server 1 registered again") == std::string::npos &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  ASSERT_THAT(job.proc->output(), HasSubstr("server 1 registered again"));
  std::this_thread::sleep_for(300ms);  // it stopped itself, catching up
  if (kill_it) job.signal_server(1, SIGKILL);
  auto code = job.proc->wait(120s);
  ASSERT_TRUE(code.has_value()) << job.proc->output();
  const std::string out = job.proc->output();
  EXPECT_EQ(*code, 0) << out;
  for (int w = 0; w < 3; ++w)
    EXPECT_THAT(out, HasSubstr(fmt::format("[worker {}] OK worker {}", w, w))) << out;
  EXPECT_THAT(out, Not(HasSubstr("WRONG"))) << out;
  EXPECT_THAT(out, Not(HasSubstr("link between the two is broken"))) << out;
  EXPECT_THAT(out, Not(HasSubstr("no replica left"))) << out;
  if (restarts > 1) {
    EXPECT_THAT(out, HasSubstr("server 1 rejoined")) << out;  // the third process
  }
}

INSTANTIATE_TEST_SUITE_P(StoppedOrKilled, PsRestartCatchUp,
                         ::testing::Values(std::make_tuple(false, 1), std::make_tuple(true, 1),
                                           std::make_tuple(false, 2)),
                         [](const auto& info) {
                           return fmt::format("{}_restarts{}",
                                              std::get<0>(info.param) ? "killed" : "stopped",
                                              std::get<1>(info.param));
                         });

TEST(PsRestart, AReplacementRegisteringWhileAServerIsStoppedDoesNotWaitForIt) {
  // Found by the survive mode: worker 2 is killed while server 1 is stopped
  // (not yet failed over); the replacement's book names server 1 live, and
  // it dialed that address until it was declared lost itself and spent a
  // restart (with two restarts, one for each fault, the job failed). It now
  // gives up on a server the placement fails over meanwhile.
  TempDir dir("pp-restart");
  const std::string servers = dir.path + "/servers";
  Job job(dir.path, "sync", 300, 2, 20, servers);
  ASSERT_TRUE(job.wait_round(5)) << job.proc->output();
  ASSERT_GT(job.signal_server(1, SIGSTOP), 0);
  job.signal_worker(2, SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  expect_success(job);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 25s) << job.proc->output();
  EXPECT_THAT(job.proc->output(), Not(HasSubstr("ERROR Timeout"))) << job.proc->output();
  // One restart each: the server's is left for it, and it rejoins.
  EXPECT_THAT(job.proc->output(), Not(HasSubstr("no restarts left"))) << job.proc->output();
  EXPECT_THAT(job.proc->output(), HasSubstr("server 1 rejoined")) << job.proc->output();
}

TEST(PsRestart, NothingIsRestartedOnceTheJobFailed) {
  // Two neighbouring servers killed at once: no replica left, the job fails.
  // The workers then exit 3 because of it: consequences, not faults to
  // repair (before, the launcher restarted them, and a server, after "job
  // failed": found by the survive mode).
  TempDir dir("pp-restart");
  const std::string servers = dir.path + "/servers";
  Job job(dir.path, "sync", 400, 3, 20, servers);
  ASSERT_TRUE(job.wait_round(5)) << job.proc->output();
  ASSERT_GT(job.signal_server(0, SIGKILL), 0);
  ASSERT_GT(job.signal_server(1, SIGKILL), 0);
  auto code = job.proc->wait(60s);
  ASSERT_TRUE(code.has_value()) << job.proc->output();
  const std::string out = job.proc->output();
  EXPECT_NE(*code, 0) << out;
  EXPECT_THAT(out, HasSubstr("no replica left")) << out;
  EXPECT_FALSE(std::regex_search(
      out, std::regex(R"(worker \d \(pid \d+\) ended with exit code 3; restarting)")))
      << out;
}

TEST(PsRestart, ALateWorkerClaimingALiveRankIsRefused) {
  // Only an away rank can be taken back; a node with the job's secret that
  // claims a live rank is refused and the job goes on.
  TempDir dir("pp-restart");
  const std::string secret = "00112233445566778899aabbccddeeff", job_id = "pp-restart-test";
  Job job(dir.path, "sync", 60, 1, 20, "",
          {{"PUSHPULL_JOB_SECRET", secret}, {"PUSHPULL_JOB_ID", job_id}});
  ASSERT_TRUE(job.wait_round(3)) << job.proc->output();
  std::smatch port;
  const std::string out = job.proc->output();
  ASSERT_TRUE(
      std::regex_search(out, port, std::regex(R"(scheduler listening on 127\.0\.0\.1:(\d+))")))
      << out;
  test::ChildProcess rogue({bin("ps_failover_worker"), "sync", "5", "0"},
                           {{"DMLC_ROLE", "worker"},
                            {"DMLC_PS_ROOT_URI", "127.0.0.1"},
                            {"DMLC_PS_ROOT_PORT", port[1].str()},
                            {"DMLC_NUM_SERVER", "3"},
                            {"DMLC_NUM_WORKER", "3"},
                            {"PUSHPULL_RANK", "1"},
                            {"PUSHPULL_JOB_SECRET", secret},
                            {"PUSHPULL_JOB_ID", job_id}});
  auto code = rogue.wait(30s);
  ASSERT_TRUE(code.has_value()) << rogue.output();
  EXPECT_NE(*code, 0) << rogue.output();
  EXPECT_THAT(rogue.output(), HasSubstr("already has its 3 workers")) << rogue.output();
  auto job_code = job.proc->wait(120s);
  ASSERT_TRUE(job_code.has_value()) << job.proc->output();
  EXPECT_EQ(*job_code, 0) << job.proc->output();
  for (int w = 0; w < 3; ++w)
    EXPECT_THAT(job.proc->output(), HasSubstr(fmt::format("[worker {}] OK worker {}", w, w)));
}

TEST(PsRestart, AReplacementThatDoesNotRegisterInTimeFailsTheJob) {
  TempDir dir("pp-restart");
  Job job(dir.path, "sync", 400, 1, 20, "",
          {{"PP_TEST_HANG_RESTARTED", "1"}, {"PUSHPULL_STARTUP_TIMEOUT_MS", "3000"}});
  ASSERT_TRUE(job.wait_round(3)) << job.proc->output();
  job.signal_worker(0, SIGKILL);
  auto code = job.proc->wait(60s);
  ASSERT_TRUE(code.has_value()) << job.proc->output();
  EXPECT_NE(*code, 0) << job.proc->output();
  EXPECT_THAT(job.proc->output(), HasSubstr("its replacement did not register within 3000 ms"))
      << job.proc->output();
  EXPECT_THAT(job.proc->output(), HasSubstr("job failed: worker 0")) << job.proc->output();
}

TEST(PsRestart, RestartsUsedUpFailTheJobNamingTheWorker) {
  TempDir dir("pp-restart");
  Job job(dir.path, "sync", 400, 1, 20);
  ASSERT_TRUE(job.wait_round(3)) << job.proc->output();
  int first = job.signal_worker(2, SIGKILL);
  // Wait for the replacement (a new pid for rank 2) and a few rounds with it.
  auto until = std::chrono::steady_clock::now() + 60s;
  while (read_rank_pids(job.pids)[2] == first && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(job.wait_round(last_round(job.proc->output()) + 3)) << job.proc->output();
  job.signal_worker(2, SIGKILL);
  auto code = job.proc->wait(60s);
  ASSERT_TRUE(code.has_value()) << job.proc->output();
  EXPECT_EQ(*code, 137) << job.proc->output();
  EXPECT_THAT(job.proc->output(), HasSubstr("no restarts left")) << job.proc->output();
  EXPECT_THAT(job.proc->output(), HasSubstr("job failed: worker 2")) << job.proc->output();
}

TEST(PsRestart, WithoutMaxRestartsAWorkerDeathFailsTheJob) {
  TempDir dir("pp-restart");
  Job job(dir.path, "sync", 400, -1, 20);
  ASSERT_TRUE(job.wait_round(3)) << job.proc->output();
  job.signal_worker(1, SIGKILL);
  auto code = job.proc->wait(60s);
  ASSERT_TRUE(code.has_value()) << job.proc->output();
  EXPECT_EQ(*code, 137) << job.proc->output();
  EXPECT_THAT(job.proc->output(), HasSubstr("job failed: worker 1")) << job.proc->output();
  EXPECT_THAT(job.proc->output(), Not(HasSubstr("restarting"))) << job.proc->output();
}

}  // namespace
}  // namespace pushpull
