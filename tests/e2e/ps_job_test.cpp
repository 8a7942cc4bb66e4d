// SPDX-License-Identifier: Apache-2.0
// Parameter-server jobs as real processes through `pushpull launch`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "support/launched_job.h"
#include "support/ports.h"
#include "support/process.h"

namespace pushpull {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using test::bin;
using test::TempDir;

std::vector<int> read_pids(const std::string& file) {
  std::ifstream in(file);
  std::vector<int> pids;
  for (int p; in >> p;)
    pids.push_back(p);
  return pids;
}

TEST(PsJob, KVStoreTutorialOnTwoWorkersAndTwoServersPullsSixes) {
  test::ChildProcess job({bin("pushpull"), "launch", "-n", "2", "-s", "2", "--timeout", "30", "--",
                          bin("kvstore_basics"), "--kvstore", "dist_sync"});
  auto code = job.wait(60s);
  ASSERT_TRUE(code.has_value()) << "launcher still running:\n" << job.output();
  std::string out = job.output();
  EXPECT_EQ(*code, 0) << out;
  for (int w = 0; w < 2; ++w) {
    std::string tag = "[worker " + std::to_string(w) + "] ";
    EXPECT_THAT(out,
                HasSubstr(tag + "push ones+d from 2 devices x 2 worker(s), pull (expect all 6)"));
    EXPECT_THAT(out, HasSubstr(tag + "  [  6.0000   6.0000   6.0000 ]"));
    EXPECT_THAT(out, HasSubstr(tag + "all values as expected"));
  }
}

TEST(PsJob, OneProgramForEveryRoleMXNetStyle) {
  // Servers run the same program: create_kvstore turns them into servers.
  std::string prog = bin("kvstore_basics") + " --kvstore dist_device_sync";
  test::ChildProcess job({bin("pushpull"), "launch", "-n", "2", "-s", "1", "--timeout", "30",
                          "--server-command", prog, "--", bin("kvstore_basics"), "--kvstore",
                          "dist_device_sync"});
  auto code = job.wait(60s);
  ASSERT_TRUE(code.has_value()) << job.output();
  EXPECT_EQ(*code, 0) << job.output();
  EXPECT_THAT(job.output(), HasSubstr("[worker 1] all values as expected"));
}

// The job's processes started by hand (no launcher, which would stop the
// workers as soon as the server died): a scheduler, two servers, two workers.
struct HandJob {
  explicit HandJob(const std::string& dir) {
    int port = test::free_port();
    std::map<std::string, std::string> env = {{"DMLC_PS_ROOT_URI", "127.0.0.1"},
                                              {"DMLC_PS_ROOT_PORT", std::to_string(port)},
                                              {"DMLC_NUM_SERVER", "2"},
                                              {"DMLC_NUM_WORKER", "2"},
                                              {"DMLC_NODE_HOST", "127.0.0.1"},
                                              {"PUSHPULL_HEARTBEAT_INTERVAL_MS", "200"},
                                              {"PUSHPULL_HEARTBEAT_TIMEOUT_MS", "2000"},
                                              {"PUSHPULL_STARTUP_TIMEOUT_MS", "30000"},
                                              // no backups: a dead server fails the job
                                              {"PUSHPULL_PS_REPLICAS", "0"}};
    auto with_role = [&](const char* role) {
      auto e = env;
      e["DMLC_ROLE"] = role;
      return e;
    };
    scheduler = std::make_unique<test::ChildProcess>(
        std::vector<std::string>{bin("pushpull"), "scheduler"}, with_role("scheduler"));
    for (int i = 0; i < 2; ++i)
      servers.push_back(std::make_unique<test::ChildProcess>(
          std::vector<std::string>{bin("pushpull"), "server"}, with_role("server")));
    for (int i = 0; i < 2; ++i)
      workers.push_back(std::make_unique<test::ChildProcess>(
          std::vector<std::string>{bin("ps_loop_worker"), dir + "/stop"}, with_role("worker")));
  }
  std::unique_ptr<test::ChildProcess> scheduler;
  std::vector<std::unique_ptr<test::ChildProcess>> servers, workers;
};

// SIGKILL or SIGSTOP a server mid-training: every worker fails with a
// PeerFailure naming that server within the failure deadline (2 s) + 5 s.
void fail_a_server(int sig) {
  TempDir dir("pp-e2e");
  HandJob job(dir.path);
  auto ready = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < ready &&
         (job.workers[0]->output().find("READY") == std::string::npos ||
          job.workers[1]->output().find("READY") == std::string::npos))
    std::this_thread::sleep_for(20ms);
  ASSERT_THAT(job.workers[1]->output(), HasSubstr("READY"));
  std::this_thread::sleep_for(200ms);
  auto t0 = std::chrono::steady_clock::now();
  job.servers[0]->signal(sig);
  for (auto& w : job.workers) {
    auto code = w->wait(10s);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(code.has_value()) << "worker still running:\n"
                                  << w->output() << "\nscheduler:\n"
                                  << job.scheduler->output();
    EXPECT_EQ(*code, 3) << w->output();
    EXPECT_LT(took, 2.0 + 5.0);
    EXPECT_THAT(w->output(), HasSubstr("ERROR PeerFailure")) << w->output();
    EXPECT_THAT(w->output(), HasSubstr("server")) << w->output();
  }
  auto code = job.scheduler->wait(10s);
  ASSERT_TRUE(code.has_value()) << job.scheduler->output();
  EXPECT_NE(*code, 0) << job.scheduler->output();
  // ChildProcess destructors SIGKILL and reap whatever is left (the stopped server).
}

TEST(PsJobFault, ServerKilled) {
  fail_a_server(SIGKILL);
}
TEST(PsJobFault, ServerStopped) {
  fail_a_server(SIGSTOP);
}

TEST(PsJobFault, LauncherStopsTheJobWhenAServerDies) {
  TempDir dir("pp-e2e");
  std::string pids = dir.path + "/servers";
  std::string server = "sh -c 'echo $$ >> " + pids + "; exec " + bin("pushpull") + " server'";
  test::ChildProcess job(
      {bin("pushpull"), "launch", "-n", "2", "-s", "2", "--timeout", "5", "--server-command",
       server, "--", bin("ps_loop_worker"), dir.path + "/stop"},
      {{"PUSHPULL_PS_REPLICAS", "0"}});  // no backups: the job fails
  auto ready = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < ready &&
         job.output().find("READY worker 1") == std::string::npos)
    std::this_thread::sleep_for(20ms);
  auto servers = read_pids(pids);
  ASSERT_EQ(servers.size(), 2u) << job.output();
  ::kill(servers[1], SIGKILL);
  auto code = job.wait(15s);
  ASSERT_TRUE(code.has_value()) << job.output();
  EXPECT_EQ(*code, 137) << job.output();
  EXPECT_THAT(job.output(), HasSubstr("failed with signal SIGKILL"));
  EXPECT_NE(::kill(servers[0], 0), 0) << "the other server was left running";
}

}  // namespace
}  // namespace pushpull
