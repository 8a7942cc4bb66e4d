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
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <thread>

#include "support/launched_job.h"
#include "support/process.h"

namespace pushpull {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
using test::bin;
using test::failover_trials;
using test::last_round;
using test::read_rank_pids;
using test::TempDir;

struct Job {
  // `restarts` < 0: no --max-restarts.
  // `server_pids`: a file the servers append "rank pid" to ("" = none).
  // `server_prefix`: shell commands run before each server (no single quotes).
  Job(const std::string& dir, const std::string& mode, int rounds, int restarts, int sleep_ms,
      const std::string& server_pids = "", std::map<std::string, std::string> env = {},
      const std::string& server_prefix = "")
      : pids(dir + "/workers"), servers(server_pids) {
    env.insert({{"PUSHPULL_BIGARRAY_BOUND", "1000"},
                {"PUSHPULL_PS_CHUNK_BYTES", "4096"},
                {"PUSHPULL_HEARTBEAT_INTERVAL_MS", "200"},
                {"PUSHPULL_HEARTBEAT_TIMEOUT_MS", "2000"}});
    std::vector<std::string> argv = {bin("pushpull"), "launch", "-n", "3", "-s", "3"};
    if (!server_pids.empty()) {
      argv.push_back("--server-command");
      argv.push_back("sh -c '" + server_prefix + "echo $PUSHPULL_RANK $$ >> " + server_pids +
                     "; exec " + bin("pushpull") + " server'");
    }
    if (restarts >= 0) {
      argv.push_back("--max-restarts");
      argv.push_back(std::to_string(restarts));
    }
    for (std::string a :
         {std::string("--"), std::string("sh"), std::string("-c"),
          // PP_TEST_HANG_RESTARTED=1: a restarted worker hangs before it registers.
          "m=" + pids +
              ".$PUSHPULL_RANK; if [ -n \"$PP_TEST_HANG_RESTARTED\" ] && [ -e $m ]; then "
              "sleep 60; fi; if [ -e $m ]; then export PP_TEST_REPLACEMENT=1; fi; touch $m; echo "
              "$PUSHPULL_RANK $$ >> " +
              pids + "; exec " + bin("ps_failover_worker") + " \"$@\"",
          std::string("worker"), mode, std::to_string(rounds), std::to_string(sleep_ms)})
      argv.push_back(a);
    proc = std::make_unique<test::ChildProcess>(argv, env);
  }
  // Waits until worker 0 finished round `round`; at the deadline stops the
  // launcher (so its whole output, with the report, is there) and fails.
  bool wait_round(int round, std::chrono::seconds limit = 60s) {
    auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (last_round(proc->output()) >= round) return true;
      std::this_thread::sleep_for(5ms);
    }
    proc->signal(SIGTERM);
    proc->wait(20s);
    return false;
  }
  int signal_worker(int rank, int sig) {
    auto workers = read_rank_pids(pids);
    EXPECT_EQ(workers.count(rank), 1u) << proc->output();
    if (workers.count(rank) == 0) return -1;
    ::kill(workers[rank], sig);
    return workers[rank];
  }
  // The server of `rank` (needs `server_pids`); its pid, or -1.
  int signal_server(int rank, int sig) {
    auto all = read_rank_pids(servers);
    if (all.count(rank) == 0) return -1;
    ::kill(all[rank], sig);
    return all[rank];
  }
  std::string pids, servers;
  std::unique_ptr<test::ChildProcess> proc;
};

void expect_success(Job& job) {
  auto code = job.proc->wait(120s);
  ASSERT_TRUE(code.has_value()) << "launcher still running:\n" << job.proc->output();
  std::string out = job.proc->output();
  EXPECT_EQ(*code, 0) << out;
  if (std::getenv("PUSHPULL_TEST_VERBOSE")) std::fprintf(stderr, "%s\n", out.c_str());
  for (int w = 0; w < 3; ++w)
    EXPECT_THAT(out, HasSubstr(fmt::format("[worker {}] OK worker {}", w, w))) << out;
  EXPECT_THAT(out, Not(HasSubstr("WRONG"))) << out;
  EXPECT_THAT(out, HasSubstr("restarting it with the same rank")) << out;
  EXPECT_THAT(out, HasSubstr("rejoined the job")) << out;
}

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
