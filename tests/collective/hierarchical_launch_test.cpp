// SPDX-License-Identifier: Apache-2.0
// The hierarchical allreduce as processes: 2 hosts x 2 ranks of
// tests/collective/collective_probe, bootstrapped from torchrun-style
// variables, each rank advertising its host's address, so the Session groups
// the ranks by the rendezvous addresses and picks the hierarchy by itself.
// The hosts are either two loopback addresses (127.0.0.1 and 127.0.0.2: no
// privileges needed) or two network namespaces joined by a veth pair (root
// only; skipped, saying why, elsewhere). Checked: every op agrees with the
// local reference, rank 0 says it uses the hierarchy, and a rank killed in
// the middle of large (pipelined) hierarchical allreduces is named by every
// survivor within the deadline. Every process and namespace a test makes is
// removed by its owner object, also when the test fails; a guardian process
// removes the namespaces when the test program itself is killed.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "launch/harness.h"
#include "support/ports.h"
#include "support/process.h"

extern "C" char** environ;

namespace pushpull {
namespace {

using launch::testing::bin;
using ::testing::HasSubstr;

constexpr int kHosts = 2, kPerHost = 2, kRanks = kHosts * kPerHost;

// Where the ranks run: host h's address, and the argv prefix that runs a
// program on it.
struct Hosts {
  std::vector<std::string> address;
  std::vector<std::vector<std::string>> prefix;
};

Hosts loopback_hosts() {
  return Hosts{{"127.0.0.1", "127.0.0.2"}, {{}, {}}};
}

std::string ip_tool() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (std::filesystem::exists(p)) return p;
  return "";
}

int sh(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str());
}

bool netns_exists(const std::string& name) {
  return sh(fmt::format("{} netns list | grep -qw {}", ip_tool(), name)) == 0;
}

// Two network namespaces joined by one veth pair (10.9.0.1 and 10.9.0.2).
// The destructor kills whatever still runs inside and deletes them; a
// guardian shell (its own session, blocked reading a pipe only this process
// holds) does the same when this process dies without running it.
class TwoNamespaces {
 public:
  TwoNamespaces() {
    const int id = static_cast<int>(::getpid());
    ns_ = {fmt::format("pphier{}a", id), fmt::format("pphier{}b", id)};
    start_guardian();
    const std::string ip = ip_tool();
    for (const std::string& cmd :
         {fmt::format("{} netns add {}", ip, ns_[0]), fmt::format("{} netns add {}", ip, ns_[1]),
          fmt::format("{} -n {} link add eth0 type veth peer name eth0 netns {}", ip, ns_[0],
                      ns_[1]),
          fmt::format("{} -n {} addr add 10.9.0.1/24 dev eth0", ip, ns_[0]),
          fmt::format("{} -n {} addr add 10.9.0.2/24 dev eth0", ip, ns_[1]),
          fmt::format("{} -n {} link set eth0 up", ip, ns_[0]),
          fmt::format("{} -n {} link set eth0 up", ip, ns_[1]),
          fmt::format("{} -n {} link set lo up", ip, ns_[0]),
          fmt::format("{} -n {} link set lo up", ip, ns_[1])})
      if (sh(cmd) != 0) {
        failed_ = "`" + cmd + "` failed";
        return;
      }
  }
  ~TwoNamespaces() {
    for (const auto& ns : ns_) {
      sh(fmt::format("for p in $({} netns pids {}); do kill -9 $p; done", ip_tool(), ns));
      sh(fmt::format("{} netns del {}", ip_tool(), ns));
    }
    if (guardian_fd_ >= 0) {
      ::close(guardian_fd_);  // EOF: the guardian finds nothing left and exits
      int status = 0;
      for (int i = 0; i < 500 && ::waitpid(guardian_pid_, &status, WNOHANG) == 0; ++i)
        ::usleep(10000);
    }
  }
  TwoNamespaces(const TwoNamespaces&) = delete;
  TwoNamespaces& operator=(const TwoNamespaces&) = delete;

  // Why the namespaces could not be made ("" when they are up).
  const std::string& failed() const { return failed_; }
  const std::vector<std::string>& names() const { return ns_; }
  Hosts hosts() const {
    return Hosts{{"10.9.0.1", "10.9.0.2"},
                 {{ip_tool(), "netns", "exec", ns_[0]}, {ip_tool(), "netns", "exec", ns_[1]}}};
  }

 private:
  void start_guardian() {
    const std::string script = fmt::format(
        "cat >/dev/null; for ns in {0} {1}; do for p in $({2} netns pids $ns 2>/dev/null); do "
        "kill -9 $p; done; {2} netns del $ns 2>/dev/null; done; exit 0",
        ns_[0], ns_[1], ip_tool());
    int fds[2] = {-1, -1};
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[0], 0);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
    const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
    pid_t pid = -1;
    int rc = ::posix_spawn(&pid, "/bin/sh", &fa, &attr, const_cast<char**>(argv), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    ::close(fds[0]);
    if (rc != 0) {
      ::close(fds[1]);
      return;
    }
    guardian_fd_ = fds[1];
    guardian_pid_ = pid;
  }
  std::vector<std::string> ns_;
  std::string failed_;
  int guardian_fd_ = -1;
  pid_t guardian_pid_ = -1;
};

// Rank r runs on host r / kPerHost.
std::vector<std::unique_ptr<test::ChildProcess>> start_world(
    const Hosts& hosts, int port, const std::vector<std::string>& args,
    std::map<std::string, std::string> extra = {}) {
  std::vector<std::unique_ptr<test::ChildProcess>> ps;
  for (int r = 0; r < kRanks; ++r) {
    const int h = r / kPerHost;
    std::vector<std::string> argv = hosts.prefix[static_cast<size_t>(h)];
    argv.push_back(bin("collective_probe"));
    argv.insert(argv.end(), args.begin(), args.end());
    std::map<std::string, std::string> env = {
        {"RANK", std::to_string(r)},
        {"WORLD_SIZE", std::to_string(kRanks)},
        {"MASTER_ADDR", hosts.address[0]},
        {"MASTER_PORT", std::to_string(port)},
        {"PUSHPULL_NODE_HOST", hosts.address[static_cast<size_t>(h)]},
        {"PUSHPULL_JOB_ID", "hierarchical-test-" + std::to_string(port)},
        // Connections from another address (namespace) need the job's secret.
        {"PUSHPULL_JOB_SECRET", "hierarchical-test-secret-" + std::to_string(port)},
        {"PUSHPULL_TIMEOUT", "20"}};
    for (const auto& [k, v] : extra)
      env[k] = v;
    ps.push_back(std::make_unique<test::ChildProcess>(argv, env));
  }
  return ps;
}

// Every op through the hierarchy: small sizes in several dtypes, then one
// large enough for the pipeline (above kPipelineBytes in float32).
void expect_every_op_passes(const Hosts& hosts) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--dtypes", "float32,float16,int32,uint8", "--sizes",
                                 "0,1,3,7,1000,100003"},
        std::vector<std::string>{"--dtypes", "float32", "--sizes", "600001"}}) {
    auto ps = start_world(hosts, test::free_port(), args);
    for (int r = 0; r < kRanks; ++r) {
      auto& p = *ps[static_cast<size_t>(r)];
      auto code = p.wait(std::chrono::seconds(120));
      ASSERT_TRUE(code.has_value()) << "rank " << r << " hangs:\n" << p.output();
      EXPECT_EQ(*code, 0) << p.output();
      EXPECT_THAT(p.output(), HasSubstr("PASS ")) << p.output();
      // local ranks from the advertised hosts
      EXPECT_THAT(p.output(),
                  HasSubstr(fmt::format("PLACE rank={} size={} local_rank={} local_size={}", r,
                                        kRanks, r % kPerHost, kPerHost)));
    }
    EXPECT_THAT(ps[0]->output(), HasSubstr("hierarchical allreduce: 2 hosts x 2 ranks (automatic)"))
        << ps[0]->output();
  }
}

// Rank 3 dies (SIGKILL) in the middle of 2.4 MB (pipelined) allreduces:
// every survivor fails with PeerFailure naming it, and nobody hangs.
void expect_killed_rank_is_named(const Hosts& hosts) {
  const int victim = 3;
  auto start = std::chrono::steady_clock::now();
  auto ps = start_world(
      hosts, test::free_port(),
      {"--victim", std::to_string(victim), "--after", "4", "--elements", "600001"},
      {{"PUSHPULL_HEARTBEAT_TIMEOUT_MS", "1500"}, {"PUSHPULL_HEARTBEAT_INTERVAL_MS", "100"}});
  for (int r = 0; r < kRanks; ++r) {
    auto& p = *ps[static_cast<size_t>(r)];
    auto code = p.wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " hangs:\n" << p.output();
    if (r == victim) {
      EXPECT_EQ(*code, 128 + SIGKILL) << p.output();
      continue;
    }
    EXPECT_EQ(*code, 3) << p.output();
    EXPECT_THAT(p.output(), HasSubstr("ERROR PeerFailure"));
    EXPECT_THAT(p.output(), HasSubstr(fmt::format("collective: rank {} (host {}:", victim,
                                                  hosts.address[victim / kPerHost])))
        << p.output();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(40));
}

TEST(HierarchicalProcesses, TwoLoopbackHostsEveryOpAgreesWithTheReference) {
  expect_every_op_passes(loopback_hosts());
}

TEST(HierarchicalProcesses, TwoLoopbackHostsAKilledRankIsNamedEverywhere) {
  expect_killed_rank_is_named(loopback_hosts());
}

// Skips (visibly) unless root with iproute2 and network namespaces.
std::unique_ptr<TwoNamespaces> namespaces_or_skip(std::string* why) {
  if (::geteuid() != 0) {
    *why = "needs root (CAP_NET_ADMIN) for network namespaces";
    return nullptr;
  }
  if (ip_tool().empty()) {
    *why = "needs iproute2 (ip) for network namespaces";
    return nullptr;
  }
  auto lab = std::make_unique<TwoNamespaces>();
  if (!lab->failed().empty()) {
    *why = "cannot make network namespaces here: " + lab->failed();
    return nullptr;
  }
  return lab;
}

TEST(HierarchicalNetns, TwoNamespaceHostsEveryOpAndAKilledRank) {
  std::string why;
  auto lab = namespaces_or_skip(&why);
  if (!lab) GTEST_SKIP() << why;
  expect_every_op_passes(lab->hosts());
  expect_killed_rank_is_named(lab->hosts());
  const std::vector<std::string> names = lab->names();
  lab.reset();
  for (const auto& ns : names)
    EXPECT_FALSE(netns_exists(ns)) << ns << " was left behind";
}

}  // namespace
}  // namespace pushpull
