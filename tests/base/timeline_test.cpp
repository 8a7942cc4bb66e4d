// SPDX-License-Identifier: Apache-2.0
// The timeline writer: files load as JSON (nlohmann-json) with the events,
// lanes and arguments written; names are escaped; many threads at once; the
// process-wide timeline from PUSHPULL_TIMELINE / HOROVOD_TIMELINE (in forked
// children, so each starts undecided) and its cost-free off state.
#include "base/timeline.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pushpull/error.h"

#if __has_include(<nlohmann/json.hpp>)
#include <nlohmann/json.hpp>
#define PP_HAVE_JSON 1
#endif

namespace {

namespace fs = std::filesystem;
namespace tl = pushpull::timeline;

fs::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::temp_directory_path() /
                 (std::string("pp_timeline_") + info->name() + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

#ifdef PP_HAVE_JSON
using nlohmann::json;

json load(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);  // throws on malformed JSON: the test fails
}

// Process and thread names from the metadata events.
struct Lanes {
  std::map<int, std::string> process;
  std::map<std::pair<int, int>, std::string> thread;
};
Lanes lanes_of(const json& events) {
  Lanes l;
  for (const auto& e : events) {
    if (e["ph"] != "M") continue;
    if (e["name"] == "process_name") l.process[e["pid"]] = e["args"]["name"];
    if (e["name"] == "thread_name")
      l.thread[{e["pid"].get<int>(), e["tid"].get<int>()}] = e["args"]["name"];
  }
  return l;
}

// Runs `body` in a forked child with a fresh (undecided) process-wide
// timeline; returns its exit status.
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

TEST(Timeline, SpansAndLanesLoadAsAChromeTrace) {
  const fs::path file = temp_dir() / "t.json";
  const auto t0 = tl::Clock::now();
  {
    tl::Recorder rec(file.string());
    rec.span("worker 0", "grad.0", "NEGOTIATE", t0, t0 + std::chrono::microseconds(10));
    rec.span("worker 0", "grad.0", "ALLREDUCE", t0 + std::chrono::microseconds(10),
             t0 + std::chrono::microseconds(30), 4096);
    rec.span("worker 0", "grad.1", "QUEUE", t0, t0 + std::chrono::microseconds(5));
    rec.span("server 1", "key 7", "SUM", t0, t0 + std::chrono::microseconds(2));
    rec.instant("server 1", "key 7", "UPDATE", t0 + std::chrono::microseconds(3));
  }
  const json events = load(file);
  ASSERT_TRUE(events.is_array());
  const Lanes lanes = lanes_of(events);
  std::map<std::string, json> by_name;
  for (const auto& e : events)
    if (e["ph"] != "M") by_name[e["name"]] = e;
  ASSERT_EQ(by_name.size(), 5u);
  const json& ar = by_name["ALLREDUCE"];
  EXPECT_EQ(ar["ph"], "X");
  EXPECT_EQ(ar["args"]["bytes"], 4096);
  EXPECT_NEAR(ar["dur"].get<double>(), 20.0, 0.01);
  EXPECT_NEAR(ar["ts"].get<double>() - by_name["NEGOTIATE"]["ts"].get<double>(), 10.0, 0.01);
  EXPECT_EQ(lanes.process.at(ar["pid"]), "worker 0");
  EXPECT_EQ(lanes.thread.at({ar["pid"].get<int>(), ar["tid"].get<int>()}), "grad.0");
  EXPECT_EQ(by_name["NEGOTIATE"]["tid"], ar["tid"]);
  EXPECT_NE(by_name["QUEUE"]["tid"], ar["tid"]);
  EXPECT_EQ(by_name["QUEUE"]["pid"], ar["pid"]);
  EXPECT_NE(by_name["SUM"]["pid"], ar["pid"]);
  EXPECT_EQ(lanes.process.at(by_name["SUM"]["pid"]), "server 1");
  EXPECT_EQ(by_name["UPDATE"]["ph"], "i");
  EXPECT_FALSE(by_name["NEGOTIATE"].contains("args"));
}

TEST(Timeline, NamesAreEscaped) {
  const fs::path file = temp_dir() / "t.json";
  const std::string odd = "a\"b\\c\nd\te\x01f";
  {
    tl::Recorder rec(file.string());
    rec.span(odd, odd, odd, tl::Clock::now(), tl::Clock::now());
  }
  const json events = load(file);
  const Lanes lanes = lanes_of(events);
  ASSERT_EQ(lanes.process.size(), 1u);
  EXPECT_EQ(lanes.process.begin()->second, odd);
  EXPECT_EQ(lanes.thread.begin()->second, odd);
  bool found = false;
  for (const auto& e : events)
    found |= e["ph"] == "X" && e["name"] == odd;
  EXPECT_TRUE(found);
}

TEST(Timeline, ManyThreadsAndBufferFlushes) {
  const fs::path file = temp_dir() / "t.json";
  constexpr int kThreads = 4, kEach = 5000;  // > 1 MiB of events: several flushes
  {
    tl::Recorder rec(file.string());
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&rec, t] {
        for (int i = 0; i < kEach; ++i) {
          const auto now = tl::Clock::now();
          rec.span("worker " + std::to_string(t), "tensor." + std::to_string(i % 7), "ALLREDUCE",
                   now, now, i);
        }
      });
    for (auto& th : threads)
      th.join();
    rec.flush();
    EXPECT_GT(fs::file_size(file), 1u << 20);
  }
  const json events = load(file);
  int spans = 0;
  std::set<std::pair<int, int>> used;
  for (const auto& e : events)
    if (e["ph"] == "X") {
      ++spans;
      used.insert({e["pid"].get<int>(), e["tid"].get<int>()});
    }
  EXPECT_EQ(spans, kThreads * kEach);
  EXPECT_EQ(used.size(), size_t(kThreads * 7));
  EXPECT_EQ(lanes_of(events).thread.size(), size_t(kThreads * 7));
}

TEST(Timeline, EventsAfterCloseAreDropped) {
  const fs::path file = temp_dir() / "t.json";
  tl::Recorder rec(file.string());
  rec.span("w", "l", "BEFORE", tl::Clock::now(), tl::Clock::now());
  rec.close();
  rec.span("w", "l", "AFTER", tl::Clock::now(), tl::Clock::now());
  rec.close();
  int spans = 0;
  for (const auto& e : load(file))
    spans += e["ph"] == "X";
  EXPECT_EQ(spans, 1);
}

TEST(Timeline, FromPushpullTimelineWithRoleAndRank) {
  const fs::path dir = temp_dir();
  const std::string base = (dir / "trace.json").string();
  int rc = in_child([&] {
    ::setenv("PUSHPULL_TIMELINE", base.c_str(), 1);
    ::setenv("PUSHPULL_ROLE", "worker", 1);
    ::setenv("PUSHPULL_RANK", "3", 1);
    if (!tl::enabled()) return 10;
    { PP_TIMELINE_SPAN("worker 3", std::string("grad.") + "0", "ALLREDUCE", 64); }
    std::exit(0);  // the atexit handler closes the file
  });
  ASSERT_EQ(rc, 0);
  const json events = load(dir / "trace.worker3.json");
  int spans = 0;
  for (const auto& e : events)
    if (e["ph"] == "X") {
      ++spans;
      EXPECT_EQ(e["name"], "ALLREDUCE");
      EXPECT_EQ(e["args"]["bytes"], 64);
    }
  EXPECT_EQ(spans, 1);
}

TEST(Timeline, HorovodTimelineIsHonoured) {
  const fs::path dir = temp_dir();
  const std::string base = (dir / "hvd").string();
  int rc = in_child([&] {
    ::unsetenv("PUSHPULL_TIMELINE");
    ::unsetenv("PUSHPULL_ROLE");
    ::unsetenv("DMLC_ROLE");
    ::unsetenv("PUSHPULL_RANK");
    ::setenv("HOROVOD_TIMELINE", base.c_str(), 1);
    ::setenv("RANK", "1", 1);
    if (!tl::enabled()) return 10;
    tl::span("rank 1", "t", "BROADCAST", tl::Clock::now(), tl::Clock::now());
    tl::shutdown();
    return tl::enabled() ? 11 : 0;  // off after shutdown
  });
  ASSERT_EQ(rc, 0);
  EXPECT_TRUE(fs::exists(dir / "hvd.rank1.json"));
  load(dir / "hvd.rank1.json");
}

TEST(Timeline, OffEvaluatesNothingAndWritesNothing) {
  const fs::path dir = temp_dir();
  int rc = in_child([&] {
    ::unsetenv("PUSHPULL_TIMELINE");
    ::unsetenv("HOROVOD_TIMELINE");
    int evaluated = 0;
    auto lane = [&] {
      ++evaluated;
      return std::string("x");
    };
    for (int i = 0; i < 3; ++i) {
      PP_TIMELINE_SPAN(lane(), lane(), "ALLREDUCE");
    }
    if (tl::enabled() || !tl::current_path().empty()) return 10;
    return evaluated == 0 ? 0 : 11;
  });
  EXPECT_EQ(rc, 0);
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(Timeline, UnwritableFileIsReportedAndLeavesTheTimelineOff) {
  EXPECT_THROW(tl::Recorder("/nonexistent-dir/t.json"), pushpull::IoError);
  int rc = in_child([&] {
    ::setenv("PUSHPULL_TIMELINE", "/nonexistent-dir/t", 1);
    return tl::enabled() ? 10 : 0;
  });
  EXPECT_EQ(rc, 0);
}

TEST(Timeline, ExplicitStartWritesThePathAsGiven) {
  const fs::path file = temp_dir() / "explicit.json";
  int rc = in_child([&] {
    tl::start(file.string());
    if (tl::current_path() != file.string()) return 10;
    { PP_TIMELINE_SPAN("server 0", "key 1", "PUSH"); }
    tl::shutdown();
    return 0;
  });
  ASSERT_EQ(rc, 0);
  int spans = 0;
  for (const auto& e : load(file))
    spans += e["ph"] == "X";
  EXPECT_EQ(spans, 1);
}
#endif  // PP_HAVE_JSON

TEST(Timeline, ProcessFileNames) {
  EXPECT_EQ(tl::process_file_name("/tmp/trace.json", "worker", 0), "/tmp/trace.worker0.json");
  EXPECT_EQ(tl::process_file_name("trace", "server", 12), "trace.server12.json");
  EXPECT_EQ(tl::process_file_name(".json", "rank", 1), ".json.rank1.json");
}

}  // namespace
