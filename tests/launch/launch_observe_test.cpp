// SPDX-License-Identifier: Apache-2.0
// The launcher's timeline merge (launch/observe.h): files shifted by their
// clock offsets, pids kept apart, the offset events dropped, a file cut
// short read up to its last whole event; and the timeline base name it
// finds (--env over the launcher's environment, HOROVOD_TIMELINE too).
#include "launch/observe.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "launch/commands.h"

namespace {

namespace fs = std::filesystem;
namespace l = pushpull::launch;
using nlohmann::json;

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

TEST(launch_observe, TimelineMergeAlignsAndRenumbers) {
  const fs::path dir = fs::temp_directory_path() / ("pp-merge-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  write(dir / "a.json",
        "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"worker 0\"}},\n"
        "{\"name\":\"pushpull_clock_offset\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":"
        "{\"offset_us\":1000.5,\"rtt_us\":20,\"samples\":16}},\n"
        "{\"name\":\"SUM\",\"ph\":\"X\",\"ts\":10.000,\"dur\":1.0,\"pid\":1,\"tid\":1}\n]\n");
  // Cut short (a killed process): no closing bracket, a torn last event.
  write(dir / "b.json",
        "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"server 0\"}},\n"
        "{\"name\":\"PUSH\",\"ph\":\"X\",\"ts\":20.000,\"dur\":1.0,\"pid\":1,\"tid\":2},\n"
        "{\"name\":\"PU");
  const fs::path out = dir / "all.json";
  EXPECT_EQ(
      l::merge_timeline_files({(dir / "a.json").string(), (dir / "b.json").string()}, out.string()),
      4u);
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str());
  ASSERT_EQ(j.size(), 4u);
  EXPECT_EQ(j[0]["pid"], 1001);
  EXPECT_EQ(j[1]["name"], "SUM");
  EXPECT_DOUBLE_EQ(j[1]["ts"].get<double>(), 1010.5);  // shifted by the offset
  EXPECT_EQ(j[2]["pid"], 2001);
  EXPECT_DOUBLE_EQ(j[3]["ts"].get<double>(), 20.0);  // no offset event: unshifted
  fs::remove_all(dir);
}

TEST(launch_observe, RemoteTimelineFilesComeOverTheJobsSsh) {
  l::LaunchConfig cfg;
  cfg.ssh_options = {"-i", "key"};
  l::HostEntry h;
  h.host = "node7";
  h.ssh_port = 2200;
  EXPECT_EQ(l::rsync_fetch_argv(cfg, h, "/w/t.*.json", "/tmp/f"),
            (std::vector<std::string>{"rsync", "-a", "-e", "ssh -o BatchMode=yes -p 2200 -i key",
                                      "--", "node7:/w/t.*.json", "/tmp/f/"}));
}

TEST(launch_observe, TimelineBaseFromEnvOrLauncher) {
  l::LaunchConfig cfg;
  EXPECT_EQ(l::timeline_base(cfg, pushpull::Environment{}), "");
  EXPECT_EQ(l::timeline_base(cfg, pushpull::Environment{{"HOROVOD_TIMELINE", "/t/h.json"}}),
            "/t/h.json");
  cfg.env.emplace_back("PUSHPULL_TIMELINE", "/t/p.json");
  EXPECT_EQ(l::timeline_base(cfg, pushpull::Environment{{"PUSHPULL_TIMELINE", "/t/x.json"}}),
            "/t/p.json");
}

}  // namespace
