// SPDX-License-Identifier: Apache-2.0
// Worker restart under the launcher (docs/ps.md "Worker restart"): 3 workers
// x 3 servers with `pushpull launch --max-restarts`; a worker is SIGKILLed
// (or SIGSTOPped) at a random round, the launcher restarts it with the same
// rank, the replacement adopts the servers' values and push counts and
// resumes, and every pulled value (ps_failover_worker checks each round) is
// exactly in closed form; dist_async keeps the exact total. Without
// --max-restarts, or with the restarts used up, a dead worker fails the job
// naming it, and so does a replacement that does not register within
// startup_timeout. A node with the job's secret claiming a live rank is refused.
//
// PUSHPULL_FAILOVER_TRIALS (default 2) random kill points per kill test.
// The limits (catching up, registration, used-up restarts, refusals):
// ps_restart_limits_test.cpp.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <random>

#include "ps_restart_job.h"

namespace pushpull {
namespace {

using namespace restart_testing;

void kill_at_random_rounds(const std::string& mode, int sig) {
  std::random_device rd;
  std::mt19937 rng(rd());
  for (int t = 0; t < failover_trials(); ++t) {
    // Odd trials pause 20 ms between rounds (the kill lands between rounds
    // mostly); even ones do not (it lands inside a round: some parts have
    // the dead worker's push, some not).
    // Kill points in the first third: the job must not end before the kill.
    // (300 rounds at most: the float16 key stays below 1024, where
    // dist_async's steps of 0.5 are exact.)
    const int sleep_ms = t % 2 ? 20 : 0, rounds = t % 2 ? 40 : 300;
    int at = std::uniform_int_distribution<int>(1, rounds / 3)(rng);
    int victim = std::uniform_int_distribution<int>(0, 2)(rng);
    SCOPED_TRACE(fmt::format("trial {} ({}): worker {} gets signal {} after round {}", t, mode,
                             victim, sig, at));
    TempDir dir("pp-restart");
    Job job(dir.path, mode, rounds, 1, sleep_ms);
    ASSERT_TRUE(job.wait_round(at)) << job.proc->output();
    job.signal_worker(victim, sig);
    expect_success(job);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(PsRestart, SyncWorkerKilledAtRandomRoundsPullsClosedForm) {
  kill_at_random_rounds("sync", SIGKILL);
}

TEST(PsRestart, AsyncWorkerKilledKeepsTheExactTotal) {
  kill_at_random_rounds("async", SIGKILL);
}

TEST(PsRestart, SyncWorkerStoppedIsKilledAndRestarted) {
  // Found by the heartbeats (2 s here); the launcher kills and restarts it.
  TempDir dir("pp-restart");
  Job job(dir.path, "sync", 30, 1, 20);
  ASSERT_TRUE(job.wait_round(5)) << job.proc->output();
  job.signal_worker(1, SIGSTOP);
  expect_success(job);
  EXPECT_THAT(job.proc->output(), HasSubstr("no heartbeat")) << job.proc->output();
}

TEST(PsRestart, AWorkerRestartedAfterAServerFailOverJoinsTheNewPlacement) {
  // The replacement learns the placement (epoch 1, or 2 once the server
  // rejoined) before its rank and connects only to the live servers.
  TempDir dir("pp-restart");
  // Two restarts: the server is restarted (and rejoins) too.
  Job job(dir.path, "sync", 60, 2, 20, dir.path + "/servers");
  ASSERT_TRUE(job.wait_round(5)) << job.proc->output();
  ASSERT_GT(job.signal_server(1, SIGKILL), 0) << job.proc->output();
  ASSERT_TRUE(job.wait_round(last_round(job.proc->output()) + 3)) << job.proc->output();
  job.signal_worker(2, SIGKILL);
  expect_success(job);
  EXPECT_THAT(job.proc->output(), HasSubstr("fail-over")) << job.proc->output();
  EXPECT_THAT(job.proc->output(), HasSubstr("joining at placement epoch")) << job.proc->output();
}

TEST(PsRestart, AServerAndAWorkerKilledTogetherBothComeBack) {
  // Whichever replacement registers first has a book with the other's dead
  // address: the server keeps dialing until the new worker has dialed it,
  // the worker dials the failed-over server once. (Before, a server that
  // registered first dialed the dead worker for connect_timeout, then
  // failed: seen in CI.) Several trials: the order varies.
  for (int t = 0; t < 3; ++t) {
    SCOPED_TRACE(fmt::format("trial {}", t));
    TempDir dir("pp-restart");
    Job job(dir.path, "sync", 60, 2, 20, dir.path + "/servers");
    ASSERT_TRUE(job.wait_round(5)) << job.proc->output();
    ASSERT_GT(job.signal_server(1, SIGKILL), 0) << job.proc->output();
    job.signal_worker(2, SIGKILL);
    const auto start = std::chrono::steady_clock::now();
    expect_success(job);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 25s) << job.proc->output();
    EXPECT_THAT(job.proc->output(), HasSubstr("server 1 rejoined")) << job.proc->output();
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(PsRestart, AKilledServerRejoinsAndTheNextFailOverIsSurvived) {
  // 3 servers, one backup per range: server A dies (fail-over), is restarted,
  // fetches its ranges from the live servers and becomes a backup again;
  // then another server B, some of whose ranges A now backs up, dies: the
  // job still ends in closed form.
  std::random_device rd;
  std::mt19937 rng(rd());
  // B = A + 1: A is back-up of (and takes over) its own home ranges; B = A + 2:
  // A takes over B's.
  const int a = std::uniform_int_distribution<int>(0, 2)(rng),
            b = (a + std::uniform_int_distribution<int>(1, 2)(rng)) % 3;
  SCOPED_TRACE(fmt::format("server {} killed, rejoins, then server {}", a, b));
  TempDir dir("pp-restart");
  const std::string servers = dir.path + "/servers";
  Job job(dir.path, "sync", 120, 1, 20, servers);
  ASSERT_TRUE(job.wait_round(5)) << job.proc->output();
  ::kill(read_rank_pids(servers)[a], SIGKILL);
  auto until = std::chrono::steady_clock::now() + 30s;
  while (job.proc->output().find(fmt::format("server {} rejoined:", a)) == std::string::npos &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  ASSERT_NE(job.proc->output().find(fmt::format("server {} rejoined:", a)), std::string::npos)
      << job.proc->output();
  ASSERT_TRUE(job.wait_round(last_round(job.proc->output()) + 5)) << job.proc->output();
  ::kill(read_rank_pids(servers)[b], SIGKILL);
  auto code = job.proc->wait(120s);
  ASSERT_TRUE(code.has_value()) << job.proc->output();
  const std::string out = job.proc->output();
  if (std::getenv("PUSHPULL_TEST_VERBOSE")) std::fprintf(stderr, "%s\n", out.c_str());
  EXPECT_EQ(*code, 0) << out;
  for (int w = 0; w < 3; ++w)
    EXPECT_THAT(out, HasSubstr(fmt::format("[worker {}] OK worker {}", w, w))) << out;
  EXPECT_THAT(out, Not(HasSubstr("WRONG"))) << out;
  EXPECT_THAT(out, Not(HasSubstr("no replica left"))) << out;
}

TEST(PsRestart, AReplacementOutlivesEveryDeadlineAfterTheLoss) {
  // The surviving worker's record of the dead worker's connection must not
  // fail the job startup_timeout + heartbeat_timeout after the loss (the
  // replacement dials only the servers): the job runs well past that.
  TempDir dir("pp-restart");
  Job job(dir.path, "sync", 400, 1, 20, "", {{"PUSHPULL_STARTUP_TIMEOUT_MS", "3000"}});
  ASSERT_TRUE(job.wait_round(5)) << job.proc->output();
  job.signal_worker(1, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  expect_success(job);
  // 3 s + 2 s + the grace: the test means nothing if the job ended sooner.
  EXPECT_GT(std::chrono::steady_clock::now() - killed, 6s) << job.proc->output();
  EXPECT_THAT(job.proc->output(), Not(HasSubstr("link between the two is broken")));
}

// A worker dies at an epoch-end (or epoch-start) barrier, before or after
// entering it, while the others wait in it; its replacement resumes after
// the last completed round and the barrier neither deadlocks nor completes
// without it (cluster/barrier_book.h).
struct BarrierFault {
  const char* where;  // PP_TEST_DIE's place
  const char* at;     // PP_TEST_BARRIER_AT
};

class PsRestartBarrier : public ::testing::TestWithParam<BarrierFault> {};

TEST_P(PsRestartBarrier, AWorkerKilledAtABarrierIsReplacedAndTheJobEndsExact) {
  const BarrierFault f = GetParam();
  TempDir dir("pp-restart");
  // Barriers every 5 rounds; worker 1 dies at round 10's.
  Job job(dir.path, "sync", 30, 1, 20, "",
          {{"PP_TEST_BARRIER_EVERY", "5"},
           {"PP_TEST_BARRIER_AT", f.at},
           {"PP_TEST_DIE", fmt::format("1:{}:{}", std::string(f.at) == "start" ? 11 : 10, f.where)},
           {"PUSHPULL_BARRIER_TIMEOUT_MS", "60000"}});
  expect_success(job);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, PsRestartBarrier,
    ::testing::Values(BarrierFault{"before_barrier", "end"}, BarrierFault{"in_barrier", "end"},
                      BarrierFault{"before_barrier", "start"}, BarrierFault{"in_barrier", "start"}),
    [](const auto& info) { return std::string(info.param.where) + "_" + info.param.at; });

TEST(PsRestart, WorkerZeroKilledBeforeSetOptimizerIsReplacedAndTheServersGetIt) {
  // The others wait in set_optimizer's barrier; the replacement of worker 0
  // sends the optimizer to servers that lack it (a rejoining worker skipped
  // set_optimizer before: the servers had none and every push failed).
  TempDir dir("pp-restart");
  Job job(dir.path, "sync", 20, 1, 20, "",
          {{"PP_TEST_DIE", "0:0:before_set_optimizer"}, {"PUSHPULL_BARRIER_TIMEOUT_MS", "60000"}});
  expect_success(job);
}

}  // namespace
}  // namespace pushpull
