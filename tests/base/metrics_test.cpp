// SPDX-License-Identifier: Apache-2.0
// Metrics: counters, the JSON line, the writer from PUSHPULL_METRICS (in
// forked children, so each starts undecided) with periodic and final lines,
// and the cost-free off state.
#include "base/metrics.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#if __has_include(<nlohmann/json.hpp>)
#include <nlohmann/json.hpp>
#define PP_HAVE_JSON 1
#endif

namespace {

namespace fs = std::filesystem;
namespace m = pushpull::metrics;

template <class F>
int in_child(F body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 1;
    try {
      rc = body();
    } catch (...) {
      rc = 3;
    }
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

fs::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::temp_directory_path() /
                 (std::string("pp_metrics_") + info->name() + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(Metrics, EveryCounterHasAName) {
  for (int i = 0; i < static_cast<int>(m::Counter::kCount); ++i)
    EXPECT_NE(m::counter_name(static_cast<m::Counter>(i)), "unknown") << i;
}

#ifdef PP_HAVE_JSON
TEST(Metrics, PeriodicAndFinalLinesFromTheEnvironment) {
  const fs::path dir = temp_dir();
  const std::string base = (dir / "metrics.jsonl").string();
  int rc = in_child([&] {
    ::setenv("PUSHPULL_METRICS", base.c_str(), 1);
    ::setenv("PUSHPULL_METRICS_INTERVAL_MS", "20", 1);
    ::setenv("PUSHPULL_ROLE", "server", 1);
    ::setenv("PUSHPULL_RANK", "2", 1);
    if (!m::enabled()) return 10;
    PP_METRIC_ADD(kServerPushes, 3);
    PP_METRIC_ADD(kPsBytes, 4096);
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    PP_METRIC_ADD(kServerPushes, 1);
    std::exit(0);  // the final line is written at exit
  });
  ASSERT_EQ(rc, 0);
  std::ifstream in(dir / "metrics.server2.jsonl");
  ASSERT_TRUE(in.good());
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(nlohmann::json::parse(line));
  ASSERT_GE(lines.size(), 2u);  // at least one periodic line and the final one
  const auto& last = lines.back();
  EXPECT_TRUE(last["final"].get<bool>());
  EXPECT_EQ(last["node"], "server 2");
  EXPECT_EQ(last["counters"]["server_pushes"], 4);
  EXPECT_EQ(last["counters"]["ps_bytes"], 4096);
  EXPECT_EQ(last["counters"]["collective_ops"], 0);
  EXPECT_FALSE(lines.front()["final"].get<bool>());
  for (size_t i = 1; i < lines.size(); ++i)
    EXPECT_GE(lines[i]["ts_ms"].get<int64_t>(), lines[i - 1]["ts_ms"].get<int64_t>());
}
#endif

TEST(Metrics, OffCountsAndEvaluatesNothing) {
  const fs::path dir = temp_dir();
  int rc = in_child([&] {
    ::unsetenv("PUSHPULL_METRICS");
    int evaluated = 0;
    auto v = [&] { return ++evaluated; };
    PP_METRIC_ADD(kCollectiveOps, v());
    if (m::enabled()) return 10;
    if (m::value(m::Counter::kCollectiveOps) != 0) return 11;
    return evaluated == 0 ? 0 : 12;
  });
  EXPECT_EQ(rc, 0);
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(Metrics, UnwritableFileLeavesMetricsOff) {
  int rc = in_child([&] {
    ::setenv("PUSHPULL_METRICS", "/nonexistent-dir/m", 1);
    return m::enabled() ? 10 : 0;
  });
  EXPECT_EQ(rc, 0);
}

TEST(Metrics, SnapshotLineNamesEveryCounter) {
  const std::string line = m::snapshot_line("worker 1", true);
  for (int i = 0; i < static_cast<int>(m::Counter::kCount); ++i)
    EXPECT_NE(line.find(std::string(m::counter_name(static_cast<m::Counter>(i)))),
              std::string::npos);
  EXPECT_NE(line.find(R"("node":"worker 1")"), std::string::npos);
  EXPECT_NE(line.find(R"("final":true)"), std::string::npos);
}

}  // namespace
