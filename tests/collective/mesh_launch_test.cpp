// SPDX-License-Identifier: Apache-2.0
// The partial mesh with real processes: 12 ranks (collective_probe), each
// advertising its own loopback address (PUSHPULL_NODE_HOST=127.0.0.x, so the
// mesh is the multi-host one: O(log n) start-up links per rank, the others on
// first use). Every op works (the alltoall connects lazily; the engine's
// negotiation runs over the negotiation tree, whose edges are start-up
// links), and a SIGSTOPped rank is found by its ring
// predecessor, probed, and named by every survivor, also by those that never
// had a connection to it, within the heartbeat timeout + 2 s; so is a
// killed one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "launch/harness.h"
#include "support/ports.h"
#include "support/process.h"

namespace pushpull {
namespace {

using launch::testing::bin;
using ::testing::HasSubstr;

constexpr int kRanks = 12;

std::vector<std::unique_ptr<test::ChildProcess>> start_probes(
    int n, int port, const std::vector<std::string>& args,
    const std::map<std::string, std::string>& extra = {}) {
  std::vector<std::unique_ptr<test::ChildProcess>> ps;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv{bin("collective_probe")};
    argv.insert(argv.end(), args.begin(), args.end());
    std::map<std::string, std::string> env{
        {"RANK", std::to_string(r)},
        {"WORLD_SIZE", std::to_string(n)},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(port)},
        {"PUSHPULL_NODE_HOST", fmt::format("127.0.0.{}", r + 1)},
        {"PUSHPULL_JOB_ID", "mesh-launch-test-" + std::to_string(port)},
        {"PUSHPULL_TIMEOUT", "20"}};
    env.insert(extra.begin(), extra.end());
    ps.push_back(std::make_unique<test::ChildProcess>(argv, env));
  }
  return ps;
}

TEST(MeshProcesses, EveryOpWorksOnThePartialMesh) {
  const int port = test::free_port();
  auto ps = start_probes(kRanks, port, {"--sizes", "1,3000"}, {{"PUSHPULL_LOG_LEVEL", "info"}});
  for (int r = 0; r < kRanks; ++r) {
    auto code = ps[static_cast<size_t>(r)]->wait(std::chrono::seconds(120));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " hangs:\n" << ps[r]->output();
    EXPECT_EQ(*code, 0) << ps[static_cast<size_t>(r)]->output();
    const std::string out = ps[static_cast<size_t>(r)]->output();
    EXPECT_THAT(out, HasSubstr("PASS "));
    // Rank 0 of 12: ring, 2^k and halving-doubling partners 1, 2, 4, 8, 10, 11.
    if (r == 0) {
      EXPECT_THAT(out, HasSubstr("connected to 6 of 11 peers at start-up")) << out;
    }
  }
}

TEST(MeshProcesses, AStoppedRankIsNamedByEverySurvivor) {
  const int port = test::free_port(), victim = 6;
  auto ps = start_probes(
      kRanks, port, {"--victim", std::to_string(victim), "--after", "20", "--stop", "1"},
      {{"PUSHPULL_HEARTBEAT_TIMEOUT_MS", "1500"}, {"PUSHPULL_HEARTBEAT_INTERVAL_MS", "100"}});
  for (int r = 0; r < kRanks; ++r) {
    if (r == victim) continue;
    auto code = ps[static_cast<size_t>(r)]->wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " hangs:\n" << ps[r]->output();
    EXPECT_EQ(*code, 3) << ps[static_cast<size_t>(r)]->output();
    const std::string out = ps[static_cast<size_t>(r)]->output();
    EXPECT_THAT(
        out, HasSubstr(fmt::format("collective: rank {} (host 127.0.0.{}:", victim, victim + 1)));
    EXPECT_THAT(out, HasSubstr("no answer to probes"));
    // "ERROR PeerFailure <ms since the last good op>": 1.5 s + 2 s, with 3 s
    // of slack for a busy machine.
    auto at = out.find("ERROR PeerFailure ");
    ASSERT_NE(at, std::string::npos) << out;
    EXPECT_LT(std::stoll(out.substr(at + 18)), 1500 + 2000 + 3000) << out;
  }
  ps[static_cast<size_t>(victim)]->signal(SIGKILL);
  EXPECT_TRUE(ps[static_cast<size_t>(victim)]->wait(std::chrono::seconds(10)).has_value());
}

// A killed rank: its partners see their connections close and, after the
// grace, blame it; the verdict floods to the ranks that had no connection
// to it. Every survivor names it, within the timeout + 2 s.
TEST(MeshProcesses, AKilledRankIsNamedByEverySurvivor) {
  const int port = test::free_port(), victim = 6;
  auto ps = start_probes(
      kRanks, port, {"--victim", std::to_string(victim), "--after", "20"},
      {{"PUSHPULL_HEARTBEAT_TIMEOUT_MS", "1500"}, {"PUSHPULL_HEARTBEAT_INTERVAL_MS", "100"}});
  for (int r = 0; r < kRanks; ++r) {
    auto code = ps[static_cast<size_t>(r)]->wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " hangs:\n" << ps[r]->output();
    if (r == victim) {
      EXPECT_EQ(*code, 128 + SIGKILL);
      continue;
    }
    EXPECT_EQ(*code, 3) << ps[static_cast<size_t>(r)]->output();
    const std::string out = ps[static_cast<size_t>(r)]->output();
    EXPECT_THAT(
        out, HasSubstr(fmt::format("collective: rank {} (host 127.0.0.{}:", victim, victim + 1)));
    auto at = out.find("ERROR PeerFailure ");
    ASSERT_NE(at, std::string::npos) << out;
    EXPECT_LT(std::stoll(out.substr(at + 18)), 1500 + 2000 + 3000) << out;
  }
}

}  // namespace
}  // namespace pushpull
