// SPDX-License-Identifier: Apache-2.0
// The host discovery script of elastic jobs (launch/elastic_discovery.h):
// its output format, and scripts that fail, hang or print nonsense.
#include <gtest/gtest.h>

#include "launch/elastic_discovery.h"
#include "pushpull/error.h"

namespace pushpull::launch {
namespace {

TEST(ElasticDiscovery, ParsesHostSlotsLines) {
  auto hosts = parse_discovery_output("# now\n127.0.0.1:4\n\n  node-2:2  # comment\nnode-3\n");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "127.0.0.1");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[1].host, "node-2");
  EXPECT_EQ(hosts[1].slots, 2);
  EXPECT_EQ(hosts[2].slots, 1);  // no slots: one
  EXPECT_TRUE(parse_discovery_output("").empty());
  EXPECT_TRUE(parse_discovery_output("# nobody\n").empty());
}

TEST(ElasticDiscovery, RejectsMalformedLines) {
  EXPECT_THROW(parse_discovery_output("a:1,b:2\n"), InvalidArgument);
  EXPECT_THROW(parse_discovery_output("a 1\n"), InvalidArgument);
  EXPECT_THROW(parse_discovery_output("-oProxyCommand=x:1\n"), InvalidArgument);
  EXPECT_THROW(parse_discovery_output("a:x\n"), InvalidArgument);
}

TEST(ElasticDiscovery, RunsTheScriptAndReportsItsFailures) {
  auto hosts = run_discovery("printf '127.0.0.1:3\\n'", Millis(5000));
  ASSERT_EQ(hosts.size(), 1u);
  EXPECT_EQ(hosts[0].slots, 3);
  try {
    run_discovery("echo broken >&2; exit 3", Millis(5000));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("exit code 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("broken"), std::string::npos) << e.what();
  }
  try {
    run_discovery("sleep 30", Millis(300));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("longer than 300 ms"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pushpull::launch
