// SPDX-License-Identifier: Apache-2.0
// Parameter-server checkpoints under the launcher (docs/ps.md,
// "Checkpoints"): 3 workers x 3 servers (one backup per range, the default)
// run ps_failover_worker (every pulled value checked in closed form each
// round) with --checkpoint-every; the whole job is killed (the launcher
// SIGKILLed: its guardian SIGKILLs every process it started) and relaunched with
// --resume: it must continue from the last complete checkpoint and end with
// exactly the values of an uninterrupted job. A torn, foreign, modified or
// another key's checkpoint file (another secret, another user's job) is
// refused before anything starts, naming the file.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "base/file_auth.h"
#include "ps/checkpoint.h"
#include "support/launched_job.h"
#include "support/process.h"

namespace pushpull {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
using test::bin;
using test::last_round;
using test::TempDir;

// `pushpull launch -n 3 -s S <flags> -- ps_failover_worker sync ROUNDS 10`;
// servers append "rank pid" to DIR/servers.
// `prefix` runs the launcher through another program (setpriv ... env ...).
std::unique_ptr<test::ChildProcess> launch(const std::string& dir, int servers, int rounds,
                                           std::vector<std::string> flags,
                                           std::map<std::string, std::string> env = {},
                                           std::vector<std::string> prefix = {}) {
  std::string server =
      "sh -c 'echo $PUSHPULL_RANK $$ >> " + dir + "/servers; exec " + bin("pushpull") + " server'";
  std::vector<std::string> argv = std::move(prefix);
  for (std::string a :
       {bin("pushpull"), std::string("launch"), std::string("-n"), std::string("3"),
        std::string("-s"), std::to_string(servers), std::string("--server-command"), server})
    argv.push_back(a);
  argv.insert(argv.end(), flags.begin(), flags.end());
  for (std::string a : {std::string("--"), bin("ps_failover_worker"), std::string("sync"),
                        std::to_string(rounds), std::string("10")})
    argv.push_back(a);
  env.insert({{"PUSHPULL_BIGARRAY_BOUND", "1000"},
              {"PUSHPULL_PS_CHUNK_BYTES", "4096"},
              {"PUSHPULL_HEARTBEAT_INTERVAL_MS", "200"},
              {"PUSHPULL_HEARTBEAT_TIMEOUT_MS", "2000"}});
  return std::make_unique<test::ChildProcess>(argv, env);
}

void expect_all_ok(test::ChildProcess& job) {
  auto code = job.wait(120s);
  ASSERT_TRUE(code.has_value()) << "launcher still running:\n" << job.output();
  std::string out = job.output();
  EXPECT_EQ(*code, 0) << out;
  for (int w = 0; w < 3; ++w)
    EXPECT_THAT(out, HasSubstr(fmt::format("[worker {}] OK worker {}", w, w))) << out;
  EXPECT_THAT(out, Not(HasSubstr("WRONG"))) << out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// `--resume ckpt` of a 3x3 job exits 2 before anything starts, naming `file`
// and saying `why`.
void expect_refused(const std::string& dir, const std::string& ckpt, const std::string& file,
                    const std::string& why) {
  auto job = launch(dir, 3, 4, {"--resume", ckpt});
  auto code = job->wait(60s);
  ASSERT_TRUE(code.has_value()) << job->output();
  EXPECT_EQ(*code, 2) << job->output();
  EXPECT_THAT(job->output(), HasSubstr(file)) << job->output();
  EXPECT_THAT(job->output(), HasSubstr(why)) << job->output();
  EXPECT_FALSE(std::filesystem::exists(dir + "/servers")) << "a server started";
}

TEST(PsCheckpoint, AJobKilledWholeAndResumedEndsWithTheUninterruptedValues) {
  TempDir dir("pp-ckpt-e2e");
  const std::string ckpt = dir.path + "/ckpt";
  const int rounds = 80;
  auto job = launch(dir.path, 3, rounds, {"--checkpoint-dir", ckpt, "--checkpoint-every", "4"});
  // Run until a checkpoint is complete and a few rounds beyond it.
  auto until = std::chrono::steady_clock::now() + 90s;
  std::optional<int64_t> done;
  while (std::chrono::steady_clock::now() < until) {
    if (std::filesystem::exists(ckpt)) done = ps::last_complete_checkpoint(ckpt, 3);
    if (done && last_round(job->output()) >= *done + 3) break;
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(done.has_value()) << job->output();
  ASSERT_LT(last_round(job->output()), rounds) << "finished before the kill:\n" << job->output();
  // The launcher SIGKILLed: its guardian SIGKILLs every process of the job.
  std::vector<int> servers;
  std::ifstream pids(dir.path + "/servers");
  for (int rank, pid; pids >> rank >> pid;)
    servers.push_back(pid);
  ASSERT_EQ(servers.size(), 3u) << job->output();
  job->signal(SIGKILL);
  auto code = job->wait(60s);
  ASSERT_TRUE(code.has_value()) << job->output();
  EXPECT_EQ(*code, 128 + SIGKILL) << job->output();
  // No old server may still write a checkpoint while the new job reads them.
  auto gone = std::chrono::steady_clock::now() + 30s;
  for (int pid : servers)
    while (::kill(pid, 0) == 0 && std::chrono::steady_clock::now() < gone)
      std::this_thread::sleep_for(5ms);
  for (int pid : servers)
    ASSERT_NE(::kill(pid, 0), 0) << "server " << pid << " survived the launcher";

  std::filesystem::remove(dir.path + "/servers");
  auto resumed = launch(dir.path, 3, rounds, {"--resume", ckpt, "--checkpoint-every", "4"});
  expect_all_ok(*resumed);
  std::string out = resumed->output();
  auto at = out.find("resuming from round ");
  ASSERT_NE(at, std::string::npos) << out;
  const int from = std::atoi(out.c_str() + at + 20);
  EXPECT_GE(from, *done) << out;
  EXPECT_EQ(from % 4, 0) << out;
  // The resumed job's first round is the checkpoint's next (checked in closed form).
  EXPECT_THAT(out, HasSubstr(fmt::format("] ROUND {}\n", from + 1))) << out;
  EXPECT_THAT(out, Not(HasSubstr(fmt::format("] ROUND {}\n", from)))) << out;
}

// A 3x3 job checkpointing every 4 rounds runs 8 rounds (round 8 complete);
// the servers' pid file is emptied for the resumed job.
void checkpoint_round_8(const std::string& dir, const std::string& ckpt) {
  auto first = launch(dir, 3, 8, {"--checkpoint-dir", ckpt, "--checkpoint-every", "4"});
  expect_all_ok(*first);
  ASSERT_EQ(ps::last_complete_checkpoint(ckpt, 3), 8);
  std::filesystem::remove(dir + "/servers");
}

void kill_server_1(const std::string& dir, test::ChildProcess& job) {
  std::ifstream pids(dir + "/servers");
  std::map<int, int> servers;
  for (int rank, pid; pids >> rank >> pid;)
    servers[rank] = pid;
  ASSERT_EQ(servers.count(1), 1u) << job.output();
  ::kill(servers[1], SIGKILL);
}

TEST(PsCheckpoint, AResumedJobStillFailsOverExactly) {
  // The restored ranges reach their backups (at the init, then every round):
  // a server killed after the resume fails over with nothing lost.
  TempDir dir("pp-ckpt-e2e");
  const std::string ckpt = dir.path + "/ckpt";
  ASSERT_NO_FATAL_FAILURE(checkpoint_round_8(dir.path, ckpt));
  auto resumed = launch(dir.path, 3, 60, {"--resume", ckpt});
  auto until = std::chrono::steady_clock::now() + 60s;
  while (last_round(resumed->output()) < 10 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  ASSERT_GE(last_round(resumed->output()), 10) << resumed->output();
  ASSERT_NO_FATAL_FAILURE(kill_server_1(dir.path, *resumed));
  expect_all_ok(*resumed);
  EXPECT_THAT(resumed->output(), HasSubstr("fail-over")) << resumed->output();
}

TEST(PsCheckpoint, AHomeKilledAfterTheResumeBeforeTheInitLeavesTheRestoredValues) {
  // Server 1 dies after it loaded the checkpoint and before worker 0's init:
  // the init of its ranges goes to their backup, which must hold the
  // checkpoint's values (it loads the files of the homes it backs up), not
  // create the ranges from the program's initial weights while the rounds
  // go on from 8 (every pull after that would be WRONG).
  TempDir dir("pp-ckpt-e2e");
  const std::string ckpt = dir.path + "/ckpt";
  ASSERT_NO_FATAL_FAILURE(checkpoint_round_8(dir.path, ckpt));
  auto resumed =
      launch(dir.path, 3, 20, {"--resume", ckpt}, {{"PP_TEST_PAUSE_BEFORE_INIT_MS", "1500"}});
  auto until = std::chrono::steady_clock::now() + 60s;
  while (resumed->output().find("BEFORE INIT") == std::string::npos &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  ASSERT_THAT(resumed->output(), HasSubstr("BEFORE INIT"));
  ASSERT_NO_FATAL_FAILURE(kill_server_1(dir.path, *resumed));
  expect_all_ok(*resumed);
  EXPECT_THAT(resumed->output(), HasSubstr("fail-over")) << resumed->output();
  EXPECT_THAT(resumed->output(), HasSubstr("as their backup")) << resumed->output();
}

TEST(PsCheckpoint, TornAndForeignFilesAreRefusedNamingTheFile) {
  TempDir dir("pp-ckpt-e2e");
  const std::string ckpt = dir.path + "/ckpt";
  auto job = launch(dir.path, 3, 4, {"--checkpoint-dir", ckpt, "--checkpoint-every", "2"});
  expect_all_ok(*job);
  ASSERT_EQ(ps::last_complete_checkpoint(ckpt, 3), 4);
  std::filesystem::remove(dir.path + "/servers");

  // Foreign: the files of a 3-server job for a 2-server job.
  auto foreign = launch(dir.path, 2, 4, {"--resume", ckpt});
  auto code = foreign->wait(60s);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2) << foreign->output();
  EXPECT_THAT(foreign->output(), HasSubstr(ps::checkpoint_path(ckpt, 4, 0))) << foreign->output();
  EXPECT_THAT(foreign->output(), HasSubstr("another job layout")) << foreign->output();

  // Rewritten with another key (another user's secret file): refused as
  // written by another user, naming the file and where our key comes from.
  const base::FileKey mine = base::checkpoint_key(Environment::current());
  const base::FileKey theirs =
      base::checkpoint_key(Environment{{"PUSHPULL_SECRET_FILE", dir.path + "/their-secret"}});
  const std::string rekeyed = ps::checkpoint_path(ckpt, 4, 2);
  const std::string original = read_file(rekeyed);
  ps::Checkpoint c = ps::decode_checkpoint(original, rekeyed, {3, 2, 3}, mine);
  ps::write_file_atomically(rekeyed, ps::encode_checkpoint(c, theirs));
  expect_refused(dir.path, ckpt, rekeyed, "written by another user or with another secret");
  ps::write_file_atomically(rekeyed, original);

  // One byte flipped in the middle of server 0's file (its checksum and tag
  // cannot be fixed up without the key).
  const std::string flipped = ps::checkpoint_path(ckpt, 4, 0);
  std::string bytes = read_file(flipped);
  bytes[bytes.size() / 2] ^= 0x01;
  ps::write_file_atomically(flipped, bytes);
  expect_refused(dir.path, ckpt, flipped, "authentication tag mismatch");
  bytes[bytes.size() / 2] ^= 0x01;
  ps::write_file_atomically(flipped, bytes);

  // Torn: server 1's file of round 4 cut short.
  const std::string victim = ps::checkpoint_path(ckpt, 4, 1);
  std::filesystem::resize_file(victim, std::filesystem::file_size(victim) / 2);
  auto torn = launch(dir.path, 3, 4, {"--resume", ckpt});
  code = torn->wait(60s);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2) << torn->output();
  EXPECT_THAT(torn->output(), HasSubstr(victim)) << torn->output();
  EXPECT_THAT(torn->output(), HasSubstr("torn")) << torn->output();
}

// Another local user's job (uid 65534, its own home and so its own per-user
// secret) writes a complete checkpoint; resuming from its files as root (our
// secret) is refused: a copied or planted checkpoint is not ours.
TEST(PsCheckpoint, AnotherUsersCheckpointIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root and setpriv to run a job as uid 65534";
  TempDir dir("pp-ckpt-e2e");
  const std::string home = dir.path + "/nobody";
  std::filesystem::create_directories(home);
  ASSERT_EQ(::chmod(dir.path.c_str(), 0755), 0);
  ASSERT_EQ(::chown(home.c_str(), 65534, 65534), 0);
  const std::string ckpt = home + "/ckpt";
  auto theirs = launch(
      home, 3, 4, {"--checkpoint-dir", ckpt, "--checkpoint-every", "2"}, {},
      {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/env", "-u",
       "PUSHPULL_SECRET_FILE", "-u", "XDG_CONFIG_HOME", "HOME=" + home});
  expect_all_ok(*theirs);
  ASSERT_EQ(ps::last_complete_checkpoint(ckpt, 3), 4);
  ASSERT_TRUE(std::filesystem::exists(home + "/.config/pushpull/secret"));
  std::filesystem::remove(home + "/servers");
  ASSERT_NO_FATAL_FAILURE(expect_refused(dir.path, ckpt, ps::checkpoint_path(ckpt, 4, 0),
                                         "written by another user or with another secret"));
}

TEST(PsCheckpoint, BadCheckpointFlagsExit2BeforeAnythingStarts) {
  TempDir dir("pp-ckpt-e2e");
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  for (const Case& c : {Case{{"--checkpoint-every", "2"}, "needs --checkpoint-dir"},
                        Case{{"--checkpoint-dir", dir.path}, "needs --checkpoint-every"},
                        Case{{"--resume", dir.path + "/none"}, "does not exist"},
                        Case{{"--resume", dir.path}, "no complete checkpoint"}}) {
    auto job = launch(dir.path, 3, 4, c.flags);
    auto code = job->wait(60s);
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 2) << job->output();
    EXPECT_THAT(job->output(), HasSubstr(c.says)) << job->output();
    EXPECT_FALSE(std::filesystem::exists(dir.path + "/servers")) << "a server started";
  }
}

}  // namespace
}  // namespace pushpull
