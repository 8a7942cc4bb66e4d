// SPDX-License-Identifier: Apache-2.0
// Parameter-server fail-over under the launcher (docs/ps.md, "Fault
// tolerance"): 3 workers x 3 servers, one backup per key range (the default);
// a server is SIGKILLed (or SIGSTOPped) at a random round and the job must
// finish with every pulled value exactly in closed form (ps_failover_worker
// checks each round). Without a replica left the job fails naming the
// range's servers.
//
// PUSHPULL_FAILOVER_TRIALS (default 2) random kill points per SIGKILL test
// (half as many SIGSTOPs); the `failover-long` target runs 20.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
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
  // `large` > 0 adds a key of that many elements, in default-sized chunks
  // (the others use 4 KiB ones), with `env` on top of the defaults below.
  Job(const std::string& dir, const std::string& mode, int rounds, int replicas = -1,
      int sleep_ms = 20, int64_t large = 0, std::map<std::string, std::string> extra = {})
      : pids(dir + "/servers") {
    std::string server =
        "sh -c 'echo $PUSHPULL_RANK $$ >> " + pids + "; exec " + bin("pushpull") + " server'";
    std::map<std::string, std::string> env = {{"PUSHPULL_BIGARRAY_BOUND", "1000"},
                                              {"PUSHPULL_PS_CHUNK_BYTES", "4096"},
                                              {"PUSHPULL_HEARTBEAT_INTERVAL_MS", "200"},
                                              {"PUSHPULL_HEARTBEAT_TIMEOUT_MS", "2000"}};
    if (replicas >= 0) env["PUSHPULL_PS_REPLICAS"] = std::to_string(replicas);
    if (large > 0) env.erase("PUSHPULL_PS_CHUNK_BYTES");
    for (auto& [k, v] : extra)
      env[k] = v;
    std::vector<std::string> args = {bin("pushpull"),    "launch", "-n", "3", "-s", "3",
                                     "--server-command", server,   "--"};
    args.insert(args.end(), {bin("ps_failover_worker"), mode, std::to_string(rounds),
                             std::to_string(sleep_ms)});
    if (large > 0) args.push_back(std::to_string(large));
    // (no --timeout: it would set the heartbeat timeout too)
    proc = std::make_unique<test::ChildProcess>(args, env);
  }
  bool wait_round(int round, std::chrono::seconds limit = 60s) {
    return test::wait_round(*proc, round, limit);  // support/launched_job.h
  }
  void signal_server(int rank, int sig) {
    auto servers = read_rank_pids(pids);
    ASSERT_EQ(servers.count(rank), 1u) << proc->output();
    ::kill(servers[rank], sig);
  }
  std::string pids;
  std::unique_ptr<test::ChildProcess> proc;
};

void expect_success(Job& job, int rounds) {
  auto code = job.proc->wait(120s);
  ASSERT_TRUE(code.has_value()) << "launcher still running:\n" << job.proc->output();
  std::string out = job.proc->output();
  EXPECT_EQ(*code, 0) << out;
  if (std::getenv("PUSHPULL_TEST_VERBOSE")) std::fprintf(stderr, "%s\n", out.c_str());
  for (int w = 0; w < 3; ++w)
    EXPECT_THAT(out, HasSubstr(fmt::format("[worker {}] OK worker {}", w, w))) << out;
  EXPECT_THAT(out, Not(HasSubstr("WRONG"))) << out;
  EXPECT_THAT(out, HasSubstr("fail-over")) << out;
  (void)rounds;
}

void kill_at_random_rounds(const std::string& mode, int sig) {
  std::random_device rd;
  std::mt19937 rng(rd());
  for (int t = 0; t < failover_trials(); ++t) {
    // Odd trials pause 20 ms between rounds (the kill lands between rounds
    // mostly); even ones do not (it lands inside a round: pending pushes
    // and pulls are re-sent, replications interrupted).
    const int sleep_ms = t % 2 ? 20 : 0, rounds = t % 2 ? 40 : 200;
    int at = std::uniform_int_distribution<int>(1, rounds - 10)(rng);
    int victim = std::uniform_int_distribution<int>(0, 2)(rng);
    SCOPED_TRACE(
        fmt::format("trial {}: server {} gets signal {} after round {}", t, victim, sig, at));
    TempDir dir("pp-failover");
    Job job(dir.path, mode, rounds, -1, sleep_ms);
    ASSERT_TRUE(job.wait_round(at)) << job.proc->output();
    job.signal_server(victim, sig);
    expect_success(job, rounds);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(PsFailover, SyncServerKilledAtRandomRoundsPullsClosedForm) {
  kill_at_random_rounds("sync", SIGKILL);
}

TEST(PsFailover, SyncServerStoppedPullsClosedForm) {
  // Found by the heartbeats (2 s here); half as many trials as the kills.
  std::random_device rd;
  std::mt19937 rng(rd());
  for (int t = 0; t < std::max(1, failover_trials() / 2); ++t) {
    int at = std::uniform_int_distribution<int>(1, 20)(rng);
    int victim = std::uniform_int_distribution<int>(0, 2)(rng);
    SCOPED_TRACE(fmt::format("trial {}: server {} stopped after round {}", t, victim, at));
    TempDir dir("pp-failover");
    Job job(dir.path, "sync", 30);
    ASSERT_TRUE(job.wait_round(at)) << job.proc->output();
    job.signal_server(victim, SIGSTOP);
    expect_success(job, 30);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(PsFailover, AsyncServerKilledKeepsTheExactTotal) {
  kill_at_random_rounds("async", SIGKILL);
}

// The last value of counter `name` in a metrics file (PUSHPULL_METRICS); -1
// when the file or the counter is missing.
int64_t last_counter(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  std::string line;
  int64_t value = -1;
  const std::string field = "\"" + name + "\":";
  while (std::getline(in, line))
    if (auto at = line.find(field); at != std::string::npos)
      value = std::stoll(line.substr(at + field.size()));
  return value;
}

TEST(PsFailover, PinnedReplicasOutliveTheirKilledPrimary) {
  // A 24 MiB key: 8 MiB slices, in chunks of 256 KiB, which same-host
  // backups hold in place in their primary's memory (docs/ps.md,
  // "Replication on one host"). SIGKILLed, the primary's memory stays
  // readable for them, and every pull still equals the closed form.
  TempDir dir("pp-failover-lent");
  const std::string metrics = dir.path + "/metrics";
  Job job(dir.path, "sync", 30, -1, 0, 6 << 20, {{"PUSHPULL_METRICS", metrics}});
  ASSERT_TRUE(job.wait_round(10)) << job.proc->output();
  job.signal_server(1, SIGKILL);
  expect_success(job, 30);
  // The survivors read lent replicas (the killed one wrote no final line).
  const int64_t lent = last_counter(metrics + ".server0.jsonl", "net_lent_bytes") +
                       last_counter(metrics + ".server2.jsonl", "net_lent_bytes");
  EXPECT_GT(lent, int64_t{10} * (16 << 20)) << job.proc->output();
}

TEST(PsFailover, OverTlsAServerKilledInsideARoundPullsClosedForm) {
  // PUSHPULL_TLS=1 (docs/security.md "Encryption"): the re-sent pushes and
  // pulls, the replication to the backups and the new placement all run
  // over TLS; shared memory off so every payload crosses TLS too.
  TempDir dir("pp-failover-tls");
  Job job(dir.path, "sync", 120, -1, 0, 0, {{"PUSHPULL_TLS", "1"}, {"PUSHPULL_PS_SHM", "0"}});
  ASSERT_TRUE(job.wait_round(30)) << job.proc->output();
  job.signal_server(2, SIGKILL);
  expect_success(job, 120);
}

TEST(PsFailover, TwoBackupsSurviveTwoFailuresInARow) {
  // PUSHPULL_PS_REPLICAS=2: two servers killed 0-30 ms apart, inside rounds
  // (the second often while the first's re-sent round is being re-published):
  // every pull in closed form. The exact interleaving that lost a round
  // before re-publishing is driven in Replication.* and tests/sim/.
  std::random_device rd;
  std::mt19937 rng(rd());
  for (int t = 0; t < failover_trials(); ++t) {
    const int a = std::uniform_int_distribution<int>(0, 2)(rng);
    const int b = (a + std::uniform_int_distribution<int>(1, 2)(rng)) % 3;
    const int gap_ms = std::uniform_int_distribution<int>(0, 30)(rng);
    const int at = std::uniform_int_distribution<int>(3, 60)(rng);
    SCOPED_TRACE(fmt::format("trial {}: server {} killed after round {}, server {} {} ms later", t,
                             a, at, b, gap_ms));
    TempDir dir("pp-failover");
    Job job(dir.path, "sync", 150, 2, 0);
    ASSERT_TRUE(job.wait_round(at)) << job.proc->output();
    job.signal_server(a, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
    job.signal_server(b, SIGKILL);
    expect_success(job, 150);
    EXPECT_THAT(job.proc->output(), Not(HasSubstr("no replica left")));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(PsFailover, NoReplicaLeftFailsNamingTheRangesServers) {
  TempDir dir("pp-failover");
  Job job(dir.path, "sync", 400);
  ASSERT_TRUE(job.wait_round(3)) << job.proc->output();
  job.signal_server(0, SIGKILL);
  ASSERT_TRUE(job.wait_round(last_round(job.proc->output()) + 3)) << job.proc->output();
  job.signal_server(1, SIGKILL);
  auto code = job.proc->wait(60s);
  ASSERT_TRUE(code.has_value()) << job.proc->output();
  EXPECT_NE(*code, 0) << job.proc->output();
  EXPECT_THAT(job.proc->output(), HasSubstr("no replica left")) << job.proc->output();
  EXPECT_THAT(job.proc->output(), HasSubstr("servers 0, 1")) << job.proc->output();
}

TEST(PsFailover, WithoutReplicasAServerDeathFailsTheJob) {
  TempDir dir("pp-failover");
  Job job(dir.path, "sync", 400, 0);
  ASSERT_TRUE(job.wait_round(3)) << job.proc->output();
  job.signal_server(2, SIGKILL);
  auto code = job.proc->wait(60s);
  ASSERT_TRUE(code.has_value()) << job.proc->output();
  EXPECT_EQ(*code, 137) << job.proc->output();
  EXPECT_THAT(job.proc->output(), Not(HasSubstr("fail-over"))) << job.proc->output();
}

}  // namespace
}  // namespace pushpull
