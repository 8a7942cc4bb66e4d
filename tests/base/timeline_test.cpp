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

TEST(Timeline, PhasesOfALaneFollowEachOther) {
  const fs::path file = temp_dir() / "t.json";
  const auto t0 = tl::Clock::now();
  const auto us = [&](int n) { return t0 + std::chrono::microseconds(n); };
  {
    tl::Recorder rec(file.string());
    rec.phase("rank 0", "grad.0", "QUEUE", us(0));
    rec.phase("rank 0", "grad.1", "QUEUE", us(1));
    rec.phase("rank 0", "grad.0", "NEGOTIATE", us(5));
    rec.phase("rank 0", "grad.0", "ALLREDUCE", us(9), 1024);
    rec.end("rank 0", "grad.0", us(20));
    rec.end("rank 0", "grad.0", us(30));  // nothing open: ignored
    rec.end("rank 0", "never", us(30));   // never begun: ignored
    // grad.1 stays open: close() ends it.
  }
  std::vector<json> spans;
  for (const auto& e : load(file))
    if (e["ph"] == "X") spans.push_back(e);
  ASSERT_EQ(spans.size(), 4u);
  std::map<std::string, json> by;
  for (const auto& e : spans)
    by[e["name"].get<std::string>() + "/" + std::to_string(e["tid"].get<int>())] = e;
  const json& q = by.at("QUEUE/1");
  EXPECT_NEAR(q["dur"].get<double>(), 5.0, 0.01);
  EXPECT_NEAR(by.at("NEGOTIATE/1")["dur"].get<double>(), 4.0, 0.01);
  EXPECT_NEAR(by.at("ALLREDUCE/1")["dur"].get<double>(), 11.0, 0.01);
  EXPECT_EQ(by.at("ALLREDUCE/1")["args"]["bytes"], 1024);
  EXPECT_GT(by.at("QUEUE/2")["dur"].get<double>(), 0.0);  // ended by close()
}

TEST(Timeline, AsyncOperationsBeginAndEndById) {
  const fs::path file = temp_dir() / "t.json";
  const auto t0 = tl::Clock::now();
  {
    tl::Recorder rec(file.string());
    rec.async_begin("worker 1", "PUSH", 7, 42, 4096, t0);
    rec.async_begin("worker 1", "PULL", 8, 42, -1, t0);
    rec.async_end("worker 1", 7, t0 + std::chrono::microseconds(50));
    rec.async_end("worker 1", 99, t0);  // unknown id: ignored
    // 8 stays open: close() ends it.
  }
  std::map<std::string, std::vector<json>> by_id;
  for (const auto& e : load(file))
    if (e["ph"] == "b" || e["ph"] == "e") by_id[e["id2"]["local"]].push_back(e);
  ASSERT_EQ(by_id.size(), 2u);
  const auto& push = by_id.at("0x7");
  ASSERT_EQ(push.size(), 2u);
  EXPECT_EQ(push[0]["ph"], "b");
  EXPECT_EQ(push[0]["name"], "PUSH");
  EXPECT_EQ(push[0]["args"]["key"], 42);
  EXPECT_EQ(push[0]["args"]["bytes"], 4096);
  EXPECT_EQ(push[1]["ph"], "e");
  EXPECT_EQ(push[1]["name"], "PUSH");
  EXPECT_NEAR(push[1]["ts"].get<double>() - push[0]["ts"].get<double>(), 50.0, 0.01);
  const auto& pull = by_id.at("0x8");
  ASSERT_EQ(pull.size(), 2u);
  EXPECT_FALSE(pull[0]["args"].contains("bytes"));
  EXPECT_EQ(pull[1]["ph"], "e");
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
    PP_TIMELINE_PHASE(tl::process_node(), "grad.1", "QUEUE");
    PP_TIMELINE_END(tl::process_node(), "grad.1");
    if (tl::process_node() != "worker 3") return 12;
    std::exit(0);  // the atexit handler closes the file
  });
  ASSERT_EQ(rc, 0);
  const json events = load(dir / "trace.worker3.json");
  int spans = 0;
  for (const auto& e : events)
    if (e["ph"] == "X") {
      ++spans;
      if (e["name"] == "ALLREDUCE") {
        EXPECT_EQ(e["args"]["bytes"], 64);
      }
    }
  EXPECT_EQ(spans, 2);
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
      PP_TIMELINE_PHASE(lane(), lane(), "QUEUE");
      PP_TIMELINE_END(lane(), lane());
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
