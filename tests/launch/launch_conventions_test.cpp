// SPDX-License-Identifier: Apache-2.0
// Launcher conventions users bring from mpirun, horovodrun and torchrun
// (docs/launch.md): --env takes one value, -np, inline -H lists, MASTER_PORT
// apart from the scheduler's port, the idle-servers hint, --timeline-filename.
// Unit tests of the argument rewriting and host lists, then the real
// `pushpull` binary.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "launch/argv.h"
#include "launch/host_list.h"
#include "pushpull/error.h"
#include "support/process.h"

namespace {

using pushpull::InvalidArgument;
using pushpull::launch::HostEntry;
using pushpull::launch::normalize_launch_words;
using pushpull::launch::parse_host_list;
using pushpull::launch::read_hosts;
using pushpull::test::ChildProcess;
using Words = std::vector<std::string>;

// The launcher's table in miniature: flags, one-value and many-value options.
std::optional<int> arity(std::string_view name) {
  static const std::map<std::string, int, std::less<>> table = {
      {"-n", 1},    {"--num-workers", 1}, {"-s", 1},           {"-H", 1},
      {"--env", 2}, {"--env-worker", 2},  {"--env-server", 2}, {"--dry-run", 0},
      {"-v", 0},    {"--timeout", 1},     {"--ssh-option", 2}};
  auto it = table.find(name);
  if (it == table.end()) return std::nullopt;
  return it->second;
}

Words normalized(Words w) {
  normalize_launch_words(w, arity);
  return w;
}

TEST(LaunchConventions, EnvTakesOneValueAndNeverTheProgram) {
  EXPECT_EQ(normalized({"-n", "2", "--env", "FOO=1", "./train", "--epochs", "3"}),
            (Words{"-n", "2", "--env=FOO=1", "./train", "--epochs", "3"}));
  EXPECT_EQ(normalized({"--env-worker", "A=1", "--env-server", "B", "--env", "C=2", "prog"}),
            (Words{"--env-worker=A=1", "--env-server=B", "--env=C=2", "prog"}));
  EXPECT_EQ(normalized({"--env=FOO=1", "prog"}), (Words{"--env=FOO=1", "prog"}));
}

TEST(LaunchConventions, NpIsNumWorkers) {
  EXPECT_EQ(normalized({"-np", "4", "-s", "0", "prog"}),
            (Words{"--num-workers", "4", "-s", "0", "prog"}));
}

TEST(LaunchConventions, TheProgramsArgumentsAreNeverTouched) {
  EXPECT_EQ(normalized({"-n", "2", "prog", "-np", "3", "--env", "X=1"}),
            (Words{"-n", "2", "prog", "-np", "3", "--env", "X=1"}));
  EXPECT_EQ(normalized({"-n", "2", "--", "-np", "--env", "X"}),
            (Words{"-n", "2", "--", "-np", "--env", "X"}));
  // Flags take no value; attached values ("-n2") take none from the next word.
  EXPECT_EQ(normalized({"--dry-run", "-n2", "-v", "prog", "-np"}),
            (Words{"--dry-run", "-n2", "-v", "prog", "-np"}));
  // Unknown options are left for CLI11 to report; a missing value too.
  EXPECT_EQ(normalized({"--bogus", "x"}), (Words{"--bogus", "x"}));
  EXPECT_EQ(normalized({"--env"}), (Words{"--env"}));
}

TEST(LaunchConventions, InlineHostListGivesSlots) {
  EXPECT_EQ(parse_host_list("h1:2,h2:2"), (std::vector<HostEntry>{{"h1", 22, 2}, {"h2", 22, 2}}));
  EXPECT_EQ(parse_host_list("h1,10.0.0.2:4"),
            (std::vector<HostEntry>{{"h1", 22, 0}, {"10.0.0.2", 22, 4}}));
  EXPECT_EQ(parse_host_list("[fe80::1]:3,[::1]"),
            (std::vector<HostEntry>{{"fe80::1", 22, 3}, {"::1", 22, 0}}));
}

TEST(LaunchConventions, BadInlineHostListsAreRefusedByEntry) {
  for (const char* bad : {"h1:0", "h1:", "h1,,h2", "h1,", "a:b:c", "h1:x", "[fe80::1", "[]:2", ":2",
                          "h1:99999999", "h 1:2"}) {
    try {
      parse_host_list(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("-H"), std::string::npos) << e.what();
    }
  }
}

TEST(LaunchConventions, HostArgumentIsAFileWhenOneExists) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("pp_conventions_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "hosts";
  std::ofstream(file) << "h1:2222 slots=2\nh2\n";
  // A hostfile keeps ssh ports (host:port), an inline list means slots.
  EXPECT_EQ(read_hosts(file.string()), (std::vector<HostEntry>{{"h1", 2222, 2}, {"h2", 22, 0}}));
  EXPECT_EQ(read_hosts("h1:2"), (std::vector<HostEntry>{{"h1", 22, 2}}));
  EXPECT_THROW(read_hosts((dir / "missing").string()), InvalidArgument);  // has '/': a file
  std::filesystem::remove_all(dir);
}

// ---- the real binary ----

struct CliRun {
  int code;
  std::string out;
};

CliRun pushpull(std::vector<std::string> args, int timeout_s = 120) {
  args.insert(args.begin(), std::string(PUSHPULL_BIN_DIR) + "/pushpull");
  ChildProcess child(args, {{"PUSHPULL_LOG_LEVEL", "warning"}});
  auto rc = child.wait(std::chrono::seconds(timeout_s));
  EXPECT_TRUE(rc.has_value()) << "still running:\n" << child.output();
  return {rc.value_or(-1), child.output()};
}

TEST(LaunchConventionsCli, EnvBeforeTheProgramThenItsArguments) {
  // The issue's example: exit 2 before (--env swallowed ./train and its arguments).
  CliRun dry = pushpull({"launch", "--dry-run", "-n", "2", "-s", "1", "--env", "FOO=1",
                         "--env-worker", "BAR=2", "./train", "--epochs", "3"});
  ASSERT_EQ(dry.code, 0) << dry.out;
  EXPECT_NE(dry.out.find("worker     1     1  ./train --epochs 3"), std::string::npos) << dry.out;
  CliRun real = pushpull({"launch", "-n", "2", "-s", "0", "--env", "FOO=1", "--env-worker", "BAR=2",
                          "/bin/sh", "-c", "echo got FOO=$FOO BAR=$BAR args=$0", "x"});
  ASSERT_EQ(real.code, 0) << real.out;
  EXPECT_NE(real.out.find("[worker 0] got FOO=1 BAR=2 args=x"), std::string::npos) << real.out;
  EXPECT_NE(real.out.find("[worker 1] got FOO=1 BAR=2 args=x"), std::string::npos) << real.out;
}

TEST(LaunchConventionsCli, NpIsAnAliasOfN) {
  CliRun r = pushpull({"launch", "-np", "3", "-s", "0", "/bin/sh", "-c", "echo size=$WORLD_SIZE"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[worker 2] size=3"), std::string::npos) << r.out;
}

TEST(LaunchConventionsCli, InlineHostList) {
  CliRun r = pushpull({"launch", "--dry-run", "-n", "4", "-s", "0", "-H", "h1:2,h2:2", "./train"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(h1 +worker +1 +1 )"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(h2 +worker +3 +1 )"))) << r.out;
  CliRun full = pushpull({"launch", "--dry-run", "-n", "5", "-s", "0", "-H", "h1:2,h2:2", "./t"});
  EXPECT_EQ(full.code, 2) << full.out;  // 4 slots for 5 workers
  CliRun bad = pushpull({"launch", "--dry-run", "-n", "2", "-H", "h1:0", "./t"});
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("slots"), std::string::npos) << bad.out;
}

TEST(LaunchConventionsCli, MasterPortIsNotTheSchedulersAndIdleServersGetAHint) {
  // A torch.distributed-style script under -s 1: it never joins the cluster,
  // so the server idles until --timeout, and the launcher says why.
  CliRun r = pushpull({"launch", "-n", "2", "-s", "1", "--timeout", "2", "/bin/sh", "-c",
                       "echo ports $MASTER_PORT $DMLC_PS_ROOT_PORT"});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\[worker 0\] ports (\d+) (\d+))")))
      << r.out;
  EXPECT_NE(m[1].str(), m[2].str()) << r.out;
  EXPECT_NE(r.out.find("hint: workers that use only collectives"), std::string::npos) << r.out;
}

TEST(LaunchConventionsCli, TimelineFilenameReachesEveryProcess) {
  CliRun r = pushpull({"launch", "-n", "2", "-s", "0", "--timeline-filename", "/tmp/tl.json",
                       "/bin/sh", "-c", "echo tl=$PUSHPULL_TIMELINE"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[worker 1] tl=/tmp/tl.json"), std::string::npos) << r.out;
}

// ---- torchrun-style per-node mode: one launcher per node ----

TEST(LaunchConventionsCli, PerNodeRanksAndWorld) {
  ::setenv("PUSHPULL_JOB_SECRET", "s", 1);  // the children inherit it
  CliRun r = pushpull({"launch", "--dry-run", "-v", "--nnodes", "2", "--node-rank", "1",
                       "--nproc-per-node", "2", "--master-addr", "10.0.0.1", "--master-port",
                       "29500", "--host-ip", "10.0.0.2", "./train"});
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* want :
       {"RANK=2", "RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "MASTER_ADDR=10.0.0.1",
        "MASTER_PORT=29500", "DMLC_NODE_HOST=10.0.0.2", "PUSHPULL_JOB_ID=pp-10.0.0.1-29500"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  EXPECT_FALSE(std::regex_search(r.out, std::regex(R"((^|\s)RANK=[01]\b)"))) << r.out;
}

TEST(LaunchConventionsCli, PerNodeBadInput) {
  const std::vector<std::string> base = {"launch", "--dry-run", "--nnodes", "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back("./train");
    return pushpull(a);
  };
  // --nproc-per-node defaults to 1, as torchrun's.
  EXPECT_EQ(with({"--node-rank", "0", "--master-addr", "h", "--master-port", "1"}).code, 0);
  EXPECT_EQ(with({"--nproc-per-node", "1", "--node-rank", "2", "--master-addr", "h",
                  "--master-port", "1"})
                .code,
            2);
  EXPECT_EQ(with({"--nproc-per-node", "1", "--node-rank", "0", "--master-port", "1"}).code, 2);
  // -s: servers on each node (node 0's launcher hosts the scheduler).
  EXPECT_EQ(with({"--nproc-per-node", "1", "--node-rank", "0", "--master-addr", "h",
                  "--master-port", "1", "-s", "1"})
                .code,
            0);
  EXPECT_EQ(with({"--nproc-per-node", "1", "--node-rank", "0", "--master-addr", "h",
                  "--master-port", "1", "-H", "h1,h2"})
                .code,
            2);
  EXPECT_EQ(with({"--nproc-per-node", "2", "-n", "3", "--node-rank", "0", "--master-addr", "h",
                  "--master-port", "1"})
                .code,
            2);
  // No secret set: not bad input any more, the per-user secret file is used
  // (made here in a private temporary place).
  ::unsetenv("PUSHPULL_JOB_SECRET");
  char tmpl[] = "/tmp/pp-pernode.XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const char* before = std::getenv("PUSHPULL_SECRET_FILE");
  const std::string saved = before ? before : "";
  ::setenv("PUSHPULL_SECRET_FILE", (dir + "/secret").c_str(), 1);
  CliRun no_secret = with(
      {"--nproc-per-node", "1", "--node-rank", "0", "--master-addr", "h", "--master-port", "1"});
  EXPECT_EQ(no_secret.code, 0) << no_secret.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/secret"));
  std::filesystem::remove_all(dir);
  if (before)
    ::setenv("PUSHPULL_SECRET_FILE", saved.c_str(), 1);
  else
    ::unsetenv("PUSHPULL_SECRET_FILE");
  CliRun no_n = pushpull({"launch", "--dry-run", "./train"});
  EXPECT_EQ(no_n.code, 2);
  EXPECT_NE(no_n.out.find("-n/--num-workers is required"), std::string::npos) << no_n.out;
}

// Two launchers, one per "node", meeting at node 0's worker 0. `wrap(i)` is
// what runs node i's launcher (nothing, or `ip netns exec NS`).
void two_node_job(const std::string& master_addr, const std::vector<std::string>& host_ips,
                  const std::vector<std::string>& wrap) {
  const int port = 20000 + static_cast<int>(::getpid() % 20000);
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n = 0; n < 2; ++n) {
    std::string cmd = wrap[size_t(n)] + " " + PUSHPULL_BIN_DIR + "/pushpull launch --nnodes 2 " +
                      "--node-rank " + std::to_string(n) + " --nproc-per-node 1 --master-addr " +
                      master_addr + " --master-port " + std::to_string(port) + " --host-ip " +
                      host_ips[size_t(n)] + " --timeout 60 " + PUSHPULL_BIN_DIR +
                      "/kvstore_basics --kvstore dist_sync_allreduce";
    // One secret shared by both nodes, as a user would (docs/launch.md).
    nodes.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{"/bin/sh", "-c", cmd},
        std::map<std::string, std::string>{{"PUSHPULL_JOB_SECRET", "per-node-test-secret"}}));
  }
  for (int n = 0; n < 2; ++n) {
    auto rc = nodes[size_t(n)]->wait(std::chrono::seconds(120));
    const std::string out = nodes[size_t(n)]->output();
    ASSERT_TRUE(rc.has_value()) << "node " << n << " still running:\n" << out;
    EXPECT_EQ(*rc, 0) << "node " << n << ":\n" << out;
    const std::string tag = "[worker " + std::to_string(n) + "] all values as expected";
    EXPECT_NE(out.find(tag), std::string::npos) << "node " << n << ":\n" << out;
  }
}

TEST(LaunchConventionsCli, PerNodeTwoLaunchersOnLoopback) {
  if (!std::filesystem::exists(std::string(PUSHPULL_BIN_DIR) + "/kvstore_basics"))
    GTEST_SKIP() << "kvstore_basics not built (PUSHPULL_BUILD_EXAMPLES=OFF)";
  two_node_job("127.0.0.1", {"127.0.0.1", "127.0.0.1"}, {"", ""});
}

// Per-node mode with nothing set: each node's launcher uses the per-user
// secret file. Two nodes whose files differ (hosts without a shared home,
// made here with two PUSHPULL_SECRET_FILE paths) cannot authenticate each
// other, and the failure says what to do.
TEST(LaunchConventionsCli, PerNodeWithoutASharedSecretSaysWhatToDo) {
  if (!std::filesystem::exists(std::string(PUSHPULL_BIN_DIR) + "/kvstore_basics"))
    GTEST_SKIP() << "kvstore_basics not built (PUSHPULL_BUILD_EXAMPLES=OFF)";
  ::unsetenv("PUSHPULL_JOB_SECRET");  // an earlier test of this program may set it
  char tmpl[] = "/tmp/pp-pernode-homes.XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const int port = 20000 + static_cast<int>((::getpid() + 7919) % 20000);
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n = 0; n < 2; ++n) {
    std::string cmd = std::string(PUSHPULL_BIN_DIR) + "/pushpull launch --nnodes 2 --node-rank " +
                      std::to_string(n) + " --nproc-per-node 1 --master-addr 127.0.0.1 " +
                      "--master-port " + std::to_string(port) + " --host-ip 127.0.0.1 " +
                      "--timeout 20 " + PUSHPULL_BIN_DIR + "/kvstore_basics --kvstore " +
                      "dist_sync_allreduce";
    nodes.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{"/bin/sh", "-c", cmd},
        std::map<std::string, std::string>{
            {"PUSHPULL_SECRET_FILE", dir + "/home" + std::to_string(n) + "/secret"}}));
  }
  // Node 1's worker is refused by node 0's rendezvous and fails at once.
  auto rc = nodes[1]->wait(std::chrono::seconds(60));
  const std::string out = nodes[0]->output() + nodes[1]->output();
  nodes.clear();  // stops node 0, still waiting for its peer
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(rc.has_value()) << out;
  EXPECT_NE(*rc, 0) << out;
  EXPECT_NE(out.find("authentication failed"), std::string::npos) << out;
  EXPECT_NE(out.find("PUSHPULL_JOB_SECRET_FILE on every host"), std::string::npos) << out;
  if (std::getenv("PP_SHOW")) std::cout << out;
}

// Two network namespaces joined by a veth pair: two hosts, each running its
// own launcher (needs root; skipped otherwise). The namespaces are removed
// even when the test fails.
class TwoNamespaces : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string id = std::to_string(::getpid());
    ns_ = {"pp_pn_a_" + id, "pp_pn_b_" + id};
    if (sh("ip netns add " + ns_[0]) != 0) {
      ns_.clear();
      GTEST_SKIP() << "`ip netns add` is not permitted here (needs root): per-node mode across "
                      "namespaces not tested";
    }
    ASSERT_EQ(sh("ip netns add " + ns_[1]), 0);
    const int net = static_cast<int>(::getpid() % 250);
    addr_ = {"10.231." + std::to_string(net) + ".1", "10.231." + std::to_string(net) + ".2"};
    ASSERT_EQ(sh("ip -n " + ns_[0] + " link add eth0 type veth peer name eth0 netns " + ns_[1]), 0);
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(sh("ip -n " + ns_[size_t(i)] + " addr add " + addr_[size_t(i)] + "/24 dev eth0"),
                0);
      ASSERT_EQ(sh("ip -n " + ns_[size_t(i)] + " link set eth0 up"), 0);
      ASSERT_EQ(sh("ip -n " + ns_[size_t(i)] + " link set lo up"), 0);
    }
  }
  void TearDown() override {
    for (const auto& ns : ns_)
      sh("ip netns del " + ns);
  }
  static int sh(const std::string& cmd) { return std::system((cmd + " 2>/dev/null").c_str()); }
  std::vector<std::string> ns_, addr_;
};

TEST_F(TwoNamespaces, PerNodeModeAcrossTwoHosts) {
  if (!std::filesystem::exists(std::string(PUSHPULL_BIN_DIR) + "/kvstore_basics"))
    GTEST_SKIP() << "kvstore_basics not built (PUSHPULL_BUILD_EXAMPLES=OFF)";
  two_node_job(addr_[0], addr_, {"ip netns exec " + ns_[0], "ip netns exec " + ns_[1]});
}

}  // namespace
