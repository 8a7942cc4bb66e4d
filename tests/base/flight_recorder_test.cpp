// SPDX-License-Identifier: Apache-2.0
// The flight recorder's ring: the last N operations oldest first, states
// and timestamps moving, updates of reused slots dropped, names cut, JSON
// escaping, the dump file (0600, replaced), concurrent writers.
#include "base/flight_recorder.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

namespace f = pushpull::flight;
namespace fs = std::filesystem;
using nlohmann::json;

struct TempDir {
  TempDir() {
    path = fs::temp_directory_path() / ("pp-flight-" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

TEST(flight_recorder, KeepsTheLastOperationsWithTheirStates) {
  TempDir dir;
  f::start(4, dir.path.string(), "worker7");
  std::vector<uint64_t> ids;
  for (int i = 0; i < 6; ++i)
    ids.push_back(f::record("allreduce", "t" + std::to_string(i), 100 * i, f::State::kQueued));
  f::update(ids[0], f::State::kDone);  // reused by t4: dropped
  f::update(ids[3], f::State::kStarted);
  f::update(ids[4], f::State::kDone);
  f::update(ids[5], f::State::kFailed);
  const json j = json::parse(f::to_json("test \"reason\""));
  EXPECT_EQ(j["process"], "worker7");
  EXPECT_EQ(j["reason"], "test \"reason\"");
  const auto& ops = j["operations"];
  ASSERT_EQ(ops.size(), 4u);
  EXPECT_EQ(ops[0]["name"], "t2");
  EXPECT_EQ(ops[0]["state"], "queued");
  EXPECT_TRUE(ops[0]["started_unix_ms"].is_null());
  EXPECT_EQ(ops[1]["name"], "t3");
  EXPECT_EQ(ops[1]["state"], "started");
  EXPECT_FALSE(ops[1]["started_unix_ms"].is_null());
  EXPECT_EQ(ops[2]["state"], "done");
  EXPECT_EQ(ops[3]["state"], "failed");
  EXPECT_EQ(ops[3]["bytes"], 500);
  EXPECT_EQ(ops[3]["kind"], "allreduce");
  EXPECT_GE(ops[3]["ended_unix_ms"].get<double>(), ops[3]["queued_unix_ms"].get<double>());
}

TEST(flight_recorder, CutsLongNamesAndEscapes) {
  TempDir dir;
  f::start(2, dir.path.string(), "server0");
  f::record("push", std::string(500, 'x'), 1, f::State::kStarted);
  f::record("pull", "a\"b\\c\nd", 1, f::State::kStarted);
  const json j = json::parse(f::to_json("r"));
  EXPECT_EQ(j["operations"][0]["name"].get<std::string>().size(), f::kNameBytes - 1);
  EXPECT_EQ(j["operations"][1]["name"], "a\"b\\c\nd");
}

TEST(flight_recorder, DumpWritesAPrivateFileReplacedByTheNext) {
  TempDir dir;
  f::start(8, dir.path.string(), "worker1");
  f::record("broadcast", "w", 4, f::State::kDone);
  const std::string path = f::dump("SIGUSR1");
  ASSERT_EQ(path, (dir.path / "pushpull-flight.worker1.json").string());
  struct stat st {};
  ASSERT_EQ(0, ::stat(path.c_str(), &st));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  f::record("allgather", "v", 4, f::State::kQueued);
  EXPECT_EQ(f::dump("SIGUSR1"), path);  // SIGUSR1 dumps are never rate-limited
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(json::parse(ss.str())["operations"].size(), 2u);
  EXPECT_EQ(f::dump("failure: x"), path);
  EXPECT_EQ(f::dump("failure: y"), "");  // within a second of the last: skipped
}

TEST(flight_recorder, ConcurrentWritersAndAReader) {
  TempDir dir;
  f::start(64, dir.path.string(), "worker0");
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([t] {
      for (int i = 0; i < 20000; ++i)
        f::update(f::record("allreduce", "t" + std::to_string(t), i, f::State::kQueued),
                  f::State::kDone);
    });
  for (int i = 0; i < 50; ++i)
    EXPECT_LE(json::parse(f::to_json("r"))["operations"].size(), 64u);
  for (auto& t : ts)
    t.join();
  EXPECT_EQ(json::parse(f::to_json("r"))["operations"].size(), 64u);
}

TEST(flight_recorder, OffRecordsNothing) {
  f::start(0, "", "x");
  EXPECT_EQ(f::record("allreduce", "t", 1, f::State::kQueued), 0u);
  EXPECT_EQ(f::dump("r"), "");
}

}  // namespace
