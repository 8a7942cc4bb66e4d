// SPDX-License-Identifier: Apache-2.0
// The job of the worker-restart tests (ps_restart_test.cpp,
// ps_restart_limits_test.cpp): `pushpull launch` of 3 workers
// (ps_failover_worker) x 3 servers, with hooks to wait for a round and to
// signal a worker or a server, and the check of a job that succeeded after a
// restart. A Job owns its launcher process; used by one test thread.
#pragma once

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/launched_job.h"
#include "support/process.h"

namespace pushpull::restart_testing {

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
  bool wait_round(int round, std::chrono::seconds limit = 60s) {
    return test::wait_round(*proc, round, limit);  // support/launched_job.h
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

inline void expect_success(Job& job) {
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

}  // namespace pushpull::restart_testing
