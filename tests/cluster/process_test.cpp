// SPDX-License-Identifier: Apache-2.0
// Multi-process jobs on loopback (scheduler, servers and workers as real
// processes of cluster_node) and fault tests: SIGKILL a worker, a server, the
// scheduler; SIGSTOP a server. Every other process must report a PeerFailure
// naming the right node and exit non-zero within the failure deadline + 5 s.
// ChildProcess kills and reaps its own PID on every path.
#include <gtest/gtest.h>

#include <signal.h>

#include <regex>

#include "support/process.h"
#include "support/wait.h"
#include "transport/message.h"
#include "transport/socket.h"

namespace pushpull::test {
namespace {

using namespace std::chrono_literals;
constexpr auto kHeartbeatTimeout = 2000ms;

class Job {
 public:
  Job(int servers, int workers, int rounds) {
    const std::string bin = std::string(PUSHPULL_BIN_DIR) + "/cluster_node";
    std::map<std::string, std::string> env = {
        {"DMLC_PS_ROOT_URI", "127.0.0.1"},
        {"DMLC_NODE_HOST", "127.0.0.1"},
        {"DMLC_NUM_SERVER", std::to_string(servers)},
        {"DMLC_NUM_WORKER", std::to_string(workers)},
        {"PUSHPULL_HEARTBEAT_INTERVAL_MS", "100"},
        {"PUSHPULL_HEARTBEAT_TIMEOUT_MS", std::to_string(kHeartbeatTimeout.count())},
        {"PUSHPULL_STARTUP_TIMEOUT_MS", "30000"},
        {"PUSHPULL_LOG_LEVEL", "warning"},
        // Without parameter-server replicas a dead server fails the job (the
        // fail-over is tested in tests/e2e/ps_failover_test.cpp).
        {"PUSHPULL_PS_REPLICAS", "0"},
        {"DMLC_PS_ROOT_PORT", "0"},
        {"DMLC_ROLE", "scheduler"},
    };
    scheduler = std::make_unique<ChildProcess>(std::vector<std::string>{bin}, env);
    std::smatch m;
    std::regex port_re("PORT (\\d+)");
    std::string out;
    EXPECT_TRUE(wait_until([&] {
      out = scheduler->output();
      return std::regex_search(out, m, port_re);
    }));
    env["DMLC_PS_ROOT_PORT"] = m[1];
    std::vector<std::string> args = {bin, "--rounds", std::to_string(rounds)};
    for (int r = 0; r < servers; ++r) {
      env["DMLC_ROLE"] = "server";
      env["PUSHPULL_RANK"] = std::to_string(r);
      this->servers.push_back(std::make_unique<ChildProcess>(args, env));
    }
    for (int r = 0; r < workers; ++r) {
      env["DMLC_ROLE"] = "worker";
      env["PUSHPULL_RANK"] = std::to_string(r);
      this->workers.push_back(std::make_unique<ChildProcess>(args, env));
    }
  }
  std::vector<ChildProcess*> nodes() {
    std::vector<ChildProcess*> out;
    for (auto& p : servers)
      out.push_back(p.get());
    for (auto& p : workers)
      out.push_back(p.get());
    return out;
  }
  bool all_ready() {
    return wait_until(
        [&] {
          for (auto* p : nodes())
            if (p->output().find("READY") == std::string::npos) return false;
          return true;
        },
        30s);
  }

  std::unique_ptr<ChildProcess> scheduler;
  std::vector<std::unique_ptr<ChildProcess>> servers, workers;
};

TEST(MultiProcess, RegistersRanksBarriersAndShutsDownInOrder) {
  Job job(2, 3, 40);
  ASSERT_TRUE(job.all_ready());
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(job.servers[r]->output().find("READY server " + std::to_string(r)),
              std::string::npos);
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(job.workers[r]->output().find("READY worker " + std::to_string(r)),
              std::string::npos);

  // Garbage at the scheduler's port while the job runs: random bytes, a huge
  // length, a truncated message. The job must not notice.
  const int port = std::stoi(std::regex_replace(job.scheduler->output(),
                                                std::regex("[\\s\\S]*PORT (\\d+)[\\s\\S]*"), "$1"));
  auto addr = transport::resolve("127.0.0.1", port);
  for (int kind = 0; kind < 3; ++kind) {
    transport::Fd fd;
    Status st = transport::connect_once(addr, 2s, &fd);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    std::vector<std::byte> bytes;
    if (kind == 0) {
      for (int i = 0; i < 5000; ++i)
        bytes.push_back(static_cast<std::byte>(i * 7919));
    } else {
      auto hb = transport::encode_header(transport::Header{
          .type = transport::msg::kHello, .payload_bytes = kind == 1 ? (1ull << 45) : 100});
      bytes.assign(hb.begin(), hb.end());
      if (kind == 2) bytes.resize(bytes.size() + 10);
    }
    // The node may close on the garbage before it all went: it is not checked.
    (void)transport::write_all(fd.get(), bytes.data(), bytes.size(),
                               std::chrono::steady_clock::now() + 2s);
  }

  for (auto* p : job.nodes()) {
    auto code = p->wait(60s);
    ASSERT_TRUE(code) << "node did not finish";
    EXPECT_EQ(*code, 0) << p->output();
    EXPECT_NE(p->output().find("DONE"), std::string::npos);
  }
  auto code = job.scheduler->wait(15s);
  ASSERT_TRUE(code);
  EXPECT_EQ(*code, 0) << job.scheduler->output();
}

// Kills or stops `victim`, then checks every other process.
void expect_everyone_fails(Job& job, ChildProcess* victim, int sig, const std::string& name) {
  ASSERT_TRUE(job.all_ready());
  std::this_thread::sleep_for(200ms);  // some barriers in flight
  auto t0 = std::chrono::steady_clock::now();
  victim->signal(sig);
  std::vector<ChildProcess*> others;
  for (auto* p : job.nodes())
    if (p != victim) others.push_back(p);
  if (job.scheduler.get() != victim) others.push_back(job.scheduler.get());
  const auto limit = kHeartbeatTimeout + 5s;
  for (auto* p : others) {
    auto left = limit - (std::chrono::steady_clock::now() - t0);
    auto code = p->wait(std::chrono::duration_cast<std::chrono::milliseconds>(left));
    ASSERT_TRUE(code) << "a process did not exit within the deadline; output:\n" << p->output();
    EXPECT_NE(*code, 0) << p->output();
    std::string out = p->output();
    EXPECT_NE(out.find("PeerFailure"), std::string::npos) << out;
    EXPECT_NE(out.find(name), std::string::npos) << "expected '" << name << "' in:\n" << out;
  }
}

TEST(Fault, KillWorker) {
  Job job(2, 3, 0);
  expect_everyone_fails(job, job.workers[1].get(), SIGKILL, "worker 1 (host 127.0.0.1:");
}

TEST(Fault, KillServer) {
  Job job(2, 3, 0);
  expect_everyone_fails(job, job.servers[0].get(), SIGKILL, "server 0 (host 127.0.0.1:");
}

TEST(Fault, KillScheduler) {
  Job job(2, 3, 0);
  expect_everyone_fails(job, job.scheduler.get(), SIGKILL, "scheduler");
}

TEST(Fault, StopServer) {
  Job job(2, 3, 0);
  expect_everyone_fails(job, job.servers[1].get(), SIGSTOP, "server 1 (host 127.0.0.1:");
  EXPECT_NE(job.scheduler->output().find("no heartbeat"), std::string::npos);
}

}  // namespace
}  // namespace pushpull::test
