// SPDX-License-Identifier: Apache-2.0
// `pushpull launch` on one host: real processes, real signals.
#include <sys/stat.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness.h"

namespace pushpull::launch::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

const std::string kProbe = bin("launch_probe");

// "[worker 2] NODE worker 2 of 2+3": the label the launcher gave and the rank
// the scheduler assigned agree.
std::string fmt_rank(const std::string& role, int rank) {
  std::string r = std::to_string(rank);
  return "[" + role + " " + r + "] NODE " + role + " " + r + " of 2+3";
}

TEST(LaunchLocal, EveryProcessGetsItsRankAndVariables) {
  auto r =
      run_launcher({"-n", "3", "-s", "2", "--timeout", "20", "--env", "PROBE_EXTRA=x",
                    "--env-server", "PROBE_SERVER_ONLY=s", "--env-worker", "PROBE_WORKER_ONLY=w",
                    "--server-command", kProbe + " --print-env", "--", kProbe, "--print-env"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto probes = parse_probes(r.out);
  ASSERT_EQ(probes.size(), 5u) << r.out;
  const std::string port = probes["worker 0"].env["DMLC_PS_ROOT_PORT"];
  const std::string job = probes["worker 0"].env["PUSHPULL_JOB_ID"];
  ASSERT_GT(std::stoi(port), 0);
  EXPECT_THAT(job, ::testing::StartsWith("pp-"));
  // A fresh per-job secret (128 bits, hex), the same for every process; the
  // probes print it, so it is checked and then left out of the comparisons.
  const std::string secret = probes["worker 0"].env["PUSHPULL_JOB_SECRET"];
  EXPECT_THAT(secret, ::testing::MatchesRegex("[0-9a-f]{32}"));
  for (auto& [label, p] : probes) {
    EXPECT_EQ(p.env["PUSHPULL_JOB_SECRET"], secret) << label;
    p.env.erase("PUSHPULL_JOB_SECRET");
    // Inherited from the test's own environment (tests/CMakeLists.txt keeps
    // the per-user secret file in the build tree), not set by the launcher.
    p.env.erase("PUSHPULL_SECRET_FILE");
    // Likewise scripts/run-tests.sh's directory for the tests' flight-recorder dumps.
    p.env.erase("PUSHPULL_FLIGHT_RECORDER_DIR");
  }
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("worker " + std::to_string(i));
    auto& e = probes["worker " + std::to_string(i)].env;
    std::string rank = std::to_string(i);
    // MASTER_PORT: one port for every worker, never the scheduler's (-s > 0).
    const std::string master_port = e.count("MASTER_PORT") ? e.at("MASTER_PORT") : "";
    EXPECT_NE(master_port, port);
    EXPECT_EQ(master_port, probes["worker 0"].env["MASTER_PORT"]);
    std::map<std::string, std::string> expect = {
        {"DMLC_ROLE", "worker"},
        {"PUSHPULL_ROLE", "worker"},
        {"DMLC_PS_ROOT_URI", "127.0.0.1"},
        {"PUSHPULL_ROOT_URI", "127.0.0.1"},
        {"DMLC_PS_ROOT_PORT", port},
        {"PUSHPULL_ROOT_PORT", port},
        {"DMLC_NUM_WORKER", "3"},
        {"PUSHPULL_NUM_WORKER", "3"},
        {"DMLC_NUM_SERVER", "2"},
        {"PUSHPULL_NUM_SERVER", "2"},
        {"DMLC_NODE_HOST", "127.0.0.1"},
        {"PUSHPULL_NODE_HOST", "127.0.0.1"},
        {"RANK", rank},
        {"PUSHPULL_RANK", rank},
        {"WORLD_SIZE", "3"},
        {"PUSHPULL_WORLD_SIZE", "3"},
        {"LOCAL_RANK", rank},
        {"PUSHPULL_LOCAL_RANK", rank},
        {"LOCAL_WORLD_SIZE", "3"},
        {"PUSHPULL_LOCAL_SIZE", "3"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"PUSHPULL_MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", master_port},
        {"PUSHPULL_MASTER_PORT", master_port},
        {"PUSHPULL_TIMEOUT", "20"},
        {"PUSHPULL_JOB_ID", job},
        {"PROBE_EXTRA", "x"},
        {"PROBE_WORKER_ONLY", "w"},
        // Its index among the host's processes (2 servers first): Prometheus port P + this.
        {"PUSHPULL_HOST_PROCESS_INDEX", std::to_string(2 + i)},
    };
    EXPECT_EQ(e, expect);
    // And a pushpull program reads them back through Options::from_env.
    EXPECT_EQ(probes["worker " + rank].options,
              "role=worker rank=" + rank + " size=3 local_rank=" + rank);
  }
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE("server " + std::to_string(i));
    auto& e = probes["server " + std::to_string(i)].env;
    std::string rank = std::to_string(i);
    std::map<std::string, std::string> expect = {
        {"DMLC_ROLE", "server"},           {"PUSHPULL_ROLE", "server"},
        {"DMLC_PS_ROOT_URI", "127.0.0.1"}, {"PUSHPULL_ROOT_URI", "127.0.0.1"},
        {"DMLC_PS_ROOT_PORT", port},       {"PUSHPULL_ROOT_PORT", port},
        {"DMLC_NUM_WORKER", "3"},          {"PUSHPULL_NUM_WORKER", "3"},
        {"DMLC_NUM_SERVER", "2"},          {"PUSHPULL_NUM_SERVER", "2"},
        {"DMLC_NODE_HOST", "127.0.0.1"},   {"PUSHPULL_NODE_HOST", "127.0.0.1"},
        {"PUSHPULL_RANK", rank},           {"PUSHPULL_TIMEOUT", "20"},
        {"PUSHPULL_JOB_ID", job},          {"PROBE_EXTRA", "x"},
        {"PROBE_SERVER_ONLY", "s"},        {"PUSHPULL_HOST_PROCESS_INDEX", rank},
    };
    EXPECT_EQ(e, expect);
  }
}

TEST(LaunchLocal, CollectiveOnlyJobHasARendezvousAndNoServers) {
  auto r = run_launcher({"-n", "2", "-s", "0", "--", kProbe, "--print-env"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto probes = parse_probes(r.out);
  ASSERT_EQ(probes.size(), 2u) << r.out;
  for (auto& [label, p] : probes) {
    EXPECT_EQ(p.env["DMLC_NUM_SERVER"], "0");
    EXPECT_EQ(p.env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_GT(std::stoi(p.env["MASTER_PORT"]), 0);
    EXPECT_EQ(p.env["MASTER_PORT"], probes["worker 0"].env["MASTER_PORT"]);
  }
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("scheduler")));
}

// Every PID the probes reported is gone once the launcher returned.
void expect_all_gone(const std::map<std::string, ProbeReport>& probes, size_t at_least) {
  size_t seen = 0;
  for (auto& [label, p] : probes) {
    if (p.pid <= 0) continue;
    ++seen;
    EXPECT_TRUE(wait_gone(p.pid)) << label << " (pid " << p.pid << ") is still running";
  }
  EXPECT_GE(seen, at_least);
}

TEST(LaunchLocal, AWorkerExitCodeStopsTheJob) {
  auto r = run_launcher(
      {"-n", "3", "-s", "2", "--timeout", "60", "--grace", "2", "--server-command",
       kProbe + " --sleep 60", "--", kProbe, "--fail-rank", "1", "--exit", "3", "--sleep", "60"},
      40s);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("worker 1"));
  EXPECT_THAT(r.err, HasSubstr("exit code 3"));
  auto probes = parse_probes(r.out);
  EXPECT_GT(probes["worker 1"].pid, 0);
  expect_all_gone(probes, 3);
}

TEST(LaunchLocal, AWorkerKilledBySignalGives137) {
  auto r = run_launcher(
      {"-n", "2", "-s", "1", "--timeout", "60", "--grace", "2", "--server-command",
       kProbe + " --sleep 60", "--", kProbe, "--fail-rank", "0", "--kill", "9", "--sleep", "60"},
      40s);
  EXPECT_EQ(r.code, 137) << r.err;
  EXPECT_THAT(r.err, HasSubstr("worker 0"));
  EXPECT_THAT(r.err, HasSubstr("signal SIGKILL"));
  expect_all_gone(parse_probes(r.out), 2);
}

TEST(LaunchLocal, SigtermToTheLauncherStopsEverything) {
  auto r = run_launcher(
      {"-n", "3", "-s", "2", "--timeout", "60", "--grace", "2", "--server-command",
       kProbe + " --sleep 60", "--", kProbe, "--sleep", "60"},
      40s, [](pid_t launcher, const std::string& out) {
        // Wait until all five processes are up, then signal the launcher.
        auto until = std::chrono::steady_clock::now() + 20s;
        while (parse_probes(read_file(out)).size() < 5 && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(20ms);
        kill(launcher, SIGTERM);
      });
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
  EXPECT_THAT(r.err, HasSubstr("SIGTERM"));
  expect_all_gone(parse_probes(r.out), 5);
}

TEST(LaunchLocal, LinesArePrefixedAndNeverInterleaved) {
  TempDir logs;
  const int kLines = 200, kWidth = 20000;
  auto r = run_launcher({"-n", "2", "-s", "0", "--log-dir", logs.path(), "--", kProbe, "--lines",
                         std::to_string(kLines), "--width", std::to_string(kWidth)});
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<std::string, int> long_lines;
  for (const auto& line : lines_of(r.out)) {
    ASSERT_EQ(line[0], '[') << line.substr(0, 80);
    auto close = line.find("] ");
    ASSERT_NE(close, std::string::npos);
    std::string label = line.substr(1, close - 1), body = line.substr(close + 2);
    if (body.starts_with("PID ")) continue;
    ASSERT_TRUE(label == "worker 0" || label == "worker 1") << label;
    char mark = label == "worker 0" ? 'a' : 'b';
    ASSERT_EQ(body, std::string(kWidth, mark)) << "a line of " << label << " was cut or mixed";
    ++long_lines[label];
  }
  EXPECT_EQ(long_lines["worker 0"], kLines);
  EXPECT_EQ(long_lines["worker 1"], kLines);
  // --log-dir: one file per process, its own lines without the prefix.
  for (auto [label, mark] : {std::pair{"worker.0", 'a'}, std::pair{"worker.1", 'b'}}) {
    auto log = lines_of(read_file(logs.path() + "/" + label + ".log"));
    ASSERT_EQ(log.size(), size_t(kLines + 1)) << label;
    EXPECT_THAT(log[0], ::testing::StartsWith("PID "));
    EXPECT_EQ(log[1], std::string(kWidth, mark));
    EXPECT_EQ(log[kLines], std::string(kWidth, mark));
  }
}

// --log-dir files go through base/private_file.h: a symlink planted at a
// worker's log name stops the job before anything runs, naming the file,
// and its target is untouched; otherwise logs are 0600 in a 0700 directory.
TEST(LaunchLocal, LogFilesArePrivateAndNeverFollowASymlink) {
  TempDir logs, elsewhere;
  const std::string victim = elsewhere.path() + "/victim";
  std::ofstream(victim) << "precious\n";
  const std::string link = logs.path() + "/worker.1.log";
  std::filesystem::create_symlink(victim, link);
  auto r = run_launcher({"-n", "2", "-s", "0", "--log-dir", logs.path(), "--", "true"});
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr(link));
  EXPECT_THAT(r.err, HasSubstr("symbolic link"));
  EXPECT_EQ(read_file(victim), "precious\n");

  std::filesystem::remove(link);
  const std::string fresh = logs.path() + "/new";
  r = run_launcher({"-n", "2", "-s", "0", "--log-dir", fresh, "--", "true"});
  ASSERT_EQ(r.code, 0) << r.err;
  struct stat st {};
  ASSERT_EQ(::stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(::stat((fresh + "/worker.0.log").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST(LaunchLocal, AProgramThatCannotStartFailsTheJob) {
  auto r = run_launcher({"-n", "2", "-s", "0", "--", "/nonexistent/program"});
  EXPECT_EQ(r.code, 127);
  EXPECT_THAT(r.err, HasSubstr("cannot start worker 0"));
  EXPECT_THAT(r.err, HasSubstr("No such file"));
}

TEST(LaunchLocal, DryRunPrintsThePlanAndRunsNothing) {
  TempDir dir;
  std::string marker = dir.path() + "/ran";
  auto r = run_launcher({"-n", "2", "-s", "1", "--dry-run", "--server-command", "touch " + marker,
                         "--", "touch", marker});
  ASSERT_EQ(r.code, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  EXPECT_THAT(lines[0], HasSubstr("2 workers, 1 servers, launcher local"));
  EXPECT_THAT(lines[3], ::testing::MatchesRegex("127\\.0\\.0\\.1 +server +0 +0 +/bin/sh -c .*"));
  EXPECT_THAT(lines[4], ::testing::MatchesRegex("127\\.0\\.0\\.1 +worker +0 +0 +touch .*"));
  EXPECT_THAT(lines[5], ::testing::MatchesRegex("127\\.0\\.0\\.1 +worker +1 +1 +touch .*"));
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(LaunchLocal, DryRunShowsTheMpirunAndSrunCommands) {
  auto mpi = run_launcher({"--launcher", "mpi", "-n", "2", "-s", "1", "--dry-run",
                           "--server-command", "srv", "--", "prog", "arg"});
  ASSERT_EQ(mpi.code, 0) << mpi.err;
  EXPECT_THAT(mpi.out, HasSubstr("# runs: mpirun "));
  EXPECT_THAT(mpi.out, HasSubstr("--oversubscribe"));
  EXPECT_THAT(mpi.out, HasSubstr("-x DMLC_ROLE=worker"));
  EXPECT_THAT(mpi.out, ::testing::MatchesRegex("(.|\n)* prog arg : -np 1 (.|\n)*"));
  auto slurm = run_launcher({"--launcher", "slurm", "-n", "3", "-s", "1", "--host-ip", "10.1.2.3",
                             "--dry-run", "--server-command", "srv", "--", "prog"});
  ASSERT_EQ(slurm.code, 0) << slurm.err;
  EXPECT_THAT(slurm.out, HasSubstr("# runs: srun --ntasks=4 --kill-on-bad-exit=1"));
  EXPECT_THAT(slurm.out, HasSubstr("\n0-2 env "));
  EXPECT_THAT(slurm.out, HasSubstr("DMLC_PS_ROOT_URI=10.1.2.3"));
  EXPECT_THAT(slurm.out, HasSubstr("PUSHPULL_RANK=%o /bin/sh -c 'exec srv'\n"));
}

TEST(LaunchLocal, BadInputExits2BeforeAnythingStarts) {
  TempDir dir;
  std::string marker = dir.path() + "/ran";
  std::string bad_hosts = dir.path() + "/hosts";
  {
    std::ofstream f(bad_hosts);
    f << "# two hosts\nnode1 slots=2\nnode2 slots=many\n";
  }
  std::string small_hosts = dir.path() + "/small";
  std::ofstream(small_hosts) << "a slots=2\nb slots=2\n";  // 4 slots; -n 3 needs 6
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"-n", "2"}, "no command to run"},
      {{"-n", "0", "--", "touch", marker}, "at least 1"},
      {{"-n", "-3", "--", "touch", marker}, "at least 1"},
      {{"-n", "2", "-H", dir.path() + "/missing", "--", "touch", marker}, "cannot read hostfile"},
      {{"-n", "2", "-H", bad_hosts, "--", "touch", marker}, "line 3"},
      {{"-n", "2", "--launcher", "pbs", "--", "touch", marker}, "unknown launcher 'pbs'"},
      {{"-n", "2", "--sync-dst-dir", "/tmp/x", "--", "touch", marker}, "give -H too"},
      {{"-n", "2", "--env", "1BAD=x", "--", "touch", marker}, "not a variable name"},
      {{"-n", "2", "--bogus", "--", "touch", marker}, "--bogus"},
      {{"-n", "2", "-H", dir.path(), "--", "touch", marker}, "is a directory"},
      {{"-n", "3", "-H", small_hosts, "--", "touch", marker}, "slots"},
      {{"-n", "2", "--launcher", "local", "-H", small_hosts, "--", "touch", marker}, "drop -H"},
      {{"-n", "2", "-s", "0", "--max-restarts", "1", "--", "touch", marker}, "-s >= 1"},
      {{"-n", "2", "-s", "1", "--max-restarts", "-1", "--", "touch", marker},
       "--max-restarts must not be negative"},
  };
  for (const auto& c : cases) {
    auto r = run_launcher(c.args);
    EXPECT_EQ(r.code, 2) << ::testing::PrintToString(c.args) << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << ::testing::PrintToString(c.args);
  }
  EXPECT_FALSE(std::filesystem::exists(marker));
}

// The real cluster: the embedded scheduler ranks the nodes the launcher
// started; they run a barrier and leave in order.
TEST(LaunchLocal, NodesJoinTheEmbeddedScheduler) {
  std::string node = bin("launch_node_probe");
  auto r = run_launcher(
      {"-n", "3", "-s", "2", "--timeout", "30", "--server-command", node, "--", node}, 60s);
  ASSERT_EQ(r.code, 0) << r.err;
  for (int i = 0; i < 3; ++i)
    EXPECT_THAT(r.out, HasSubstr(fmt_rank("worker", i)));
  for (int i = 0; i < 2; ++i)
    EXPECT_THAT(r.out, HasSubstr(fmt_rank("server", i)));
}

TEST(LaunchLocal, ANodeFailureIsReportedWithItsExitCode) {
  std::string node = bin("launch_node_probe");
  auto r = run_launcher({"-n", "3", "-s", "2", "--timeout", "30", "--grace", "2",
                         "--server-command", node, "--", node, "--fail-rank", "1"},
                        60s);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_THAT(
      r.err, ::testing::ContainsRegex(
                 "job failed: worker 1 \\(pid [0-9]+, host 127\\.0\\.0\\.1\\) exited with code 3"));
}

}  // namespace
}  // namespace pushpull::launch::testing
