// SPDX-License-Identifier: Apache-2.0
// Collectives as processes with PUSHPULL_SHM=1 (every rank on this host:
// data through shared memory, control and failure detection over TCP,
// shm_data_transport.h): every op agrees with the reference, and a killed or
// stopped rank is still named by every survivor, as over TCP alone
// (collective_launch_test). Every process a test starts is killed and reaped
// by its owner object, even on failure.
#include <signal.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <tuple>

#include <fmt/format.h>

#include "launch/harness.h"
#include "support/ports.h"
#include "support/process.h"

namespace pushpull {
namespace {

using launch::testing::bin;
using launch::testing::lines_of;
using launch::testing::run_launcher;
using ::testing::HasSubstr;

int count_in(const std::string& out, const std::string& label, const std::string& s) {
  int n = 0;
  for (const auto& l : lines_of(out))
    n += l.rfind("[" + label + "] ", 0) == 0 && l.find(s) != std::string::npos;
  return n;
}

// World sizes: allreduces through the arena (larger ones in several
// slot-sized segments), the other collectives through the rings.
class ShmWorlds : public ::testing::TestWithParam<int> {};

TEST_P(ShmWorlds, EveryOpAgreesWithTheLocalReference) {
  const int n = GetParam();
  auto r = run_launcher({"-n", std::to_string(n), "-s", "0", "--timeout", "30", "--env",
                         "PUSHPULL_SHM=1", bin("collective_probe"), "--dtypes",
                         "float32,float16,int64,uint8", "--sizes", "0,1,7,1000,100003,300001"},
                        std::chrono::seconds(150));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  for (int w = 0; w < n; ++w) {
    EXPECT_EQ(count_in(r.out, "worker " + std::to_string(w), "PASS "), 1) << r.out;
    EXPECT_THAT(all, HasSubstr(fmt::format("rank {} moves data through shared memory", w)));
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ShmWorlds, ::testing::Values(2, 3));

// Ten ranks of one host: from 9 ranks the engine negotiates over its tree
// (collective/negotiation_tree.h), every op and a join with uneven batches
// included, the data through shared memory.
TEST(ShmWorldsTree, TenRanksNegotiateOverTheTree) {
  const int n = 10;
  auto r = run_launcher(
      {"-n", std::to_string(n), "-s", "0", "--timeout", "30", "--env", "PUSHPULL_SHM=1",
       bin("collective_probe"), "--dtypes", "float32,int64", "--sizes", "0,7,1000"},
      std::chrono::seconds(150));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int w = 0; w < n; ++w)
    EXPECT_EQ(count_in(r.out, "worker " + std::to_string(w), "PASS "), 1) << r.out;
  EXPECT_THAT(r.out + r.err, HasSubstr("rank 9 moves data through shared memory"));
}

std::map<std::string, std::string> shm_env(int rank, int n, int port) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(n)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"PUSHPULL_JOB_ID", "shm-launch-test-" + std::to_string(port)},
          {"PUSHPULL_TIMEOUT", "20"},
          {"PUSHPULL_SHM", "1"},
          {"PUSHPULL_HEARTBEAT_TIMEOUT_MS", "1500"},
          {"PUSHPULL_HEARTBEAT_INTERVAL_MS", "100"}};
}

std::vector<std::unique_ptr<test::ChildProcess>> start_probes(int n,
                                                              const std::vector<std::string>& args,
                                                              int port) {
  std::vector<std::unique_ptr<test::ChildProcess>> ps;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv{bin("collective_probe")};
    argv.insert(argv.end(), args.begin(), args.end());
    ps.push_back(std::make_unique<test::ChildProcess>(argv, shm_env(r, n, port)));
  }
  return ps;
}

// (stop, elements): the victim is killed (0) or stopped (1: only heartbeats
// reveal it), in the middle of allreduces through the arena's slots (1000
// elements: one segment; 300000: two).
class ShmVictim : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ShmVictim, IsAPeerFailureNamingItEverywhere) {
  const bool stop = std::get<0>(GetParam()) == 1;
  const int elements = std::get<1>(GetParam());
  const int n = 3, victim = 1, port = test::free_port();
  auto ps = start_probes(n,
                         {"--victim", std::to_string(victim), "--after", "20", "--elements",
                          std::to_string(elements), "--stop", stop ? "1" : "0"},
                         port);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    auto code = ps[static_cast<size_t>(r)]->wait(std::chrono::seconds(30));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " hangs:\n" << ps[r]->output();
    const std::string out = ps[static_cast<size_t>(r)]->output();
    EXPECT_EQ(*code, 3) << out;
    EXPECT_THAT(out, HasSubstr("ERROR PeerFailure"));
    EXPECT_THAT(out, HasSubstr(fmt::format("rank {}", victim))) << out;
  }
  ps[static_cast<size_t>(victim)]->signal(SIGKILL);
  EXPECT_TRUE(ps[static_cast<size_t>(victim)]->wait(std::chrono::seconds(10)).has_value());
}

INSTANTIATE_TEST_SUITE_P(KilledOrStopped, ShmVictim,
                         ::testing::Combine(::testing::Values(0, 1),
                                            ::testing::Values(1000, 300000)));

}  // namespace
}  // namespace pushpull
