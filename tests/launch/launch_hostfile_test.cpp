// SPDX-License-Identifier: Apache-2.0
// Units of the launcher: hostfile parsing and the placement of servers and
// workers on the hosts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "launch/hostfile.h"
#include "launch/plan.h"
#include "pushpull/error.h"

namespace pushpull::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string error_of(std::string_view text) {
  try {
    parse_hostfile(text, "hosts.txt");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Hostfile, ParsesHostsPortsSlotsAndComments) {
  auto hosts = parse_hostfile(
      "# cluster\n"
      "node1\n"
      "\n"
      "node2:2222 slots=4   # fast one\n"
      "  10.0.0.7 slots=2\n"
      "[fe80::1]:23\n",
      "hosts.txt");
  ASSERT_EQ(hosts.size(), 4u);
  EXPECT_EQ(hosts[0], (HostEntry{"node1", 22, 0}));
  EXPECT_EQ(hosts[1], (HostEntry{"node2", 2222, 4}));
  EXPECT_EQ(hosts[2], (HostEntry{"10.0.0.7", 22, 2}));
  EXPECT_EQ(hosts[3], (HostEntry{"fe80::1", 23, 0}));
}

TEST(Hostfile, BadLinesNameTheirLineNumber) {
  EXPECT_THAT(error_of("a\nb slots=x\n"), HasSubstr("hosts.txt line 2"));
  EXPECT_THAT(error_of("a\n\n# c\nb:99999\n"), HasSubstr("line 4"));
  EXPECT_THAT(error_of("a colour=red\n"), HasSubstr("unknown field 'colour=red'"));
  EXPECT_THAT(error_of("a slots=0\n"), HasSubstr("line 1"));
  EXPECT_THAT(error_of("fe80::1\n"), HasSubstr("brackets"));
  EXPECT_THAT(error_of("a:\n"), HasSubstr("empty ssh port"));
  EXPECT_THAT(error_of("a;rm\n"), HasSubstr("contains the character ';'"));
  EXPECT_THAT(error_of("-oProxyCommand=touch\n"), HasSubstr("starts with '-'"));
  EXPECT_THAT(error_of("-oProxyCommand=touch:22\n"), HasSubstr("starts with '-'"));
  EXPECT_THAT(error_of("a$(id)\n"), HasSubstr("contains the character '$'"));
  EXPECT_THAT(error_of("a`id`\n"), HasSubstr("contains the character '`'"));
  EXPECT_THAT(error_of("a'b\n"), HasSubstr("contains the character '''"));
  EXPECT_THAT(error_of("a|b\n"), HasSubstr("contains the character '|'"));
  EXPECT_THAT(error_of("root@-oProxy\n"), HasSubstr("after the user name"));
  EXPECT_THAT(error_of("# nothing\n\n"), HasSubstr("lists no host"));
}

TEST(Hostfile, AcceptsNamesUsersAndAddresses) {
  EXPECT_TRUE(check_host_name("node-1.example.org").is_ok());
  EXPECT_TRUE(check_host_name("me@node_2").is_ok());
  EXPECT_TRUE(check_host_name("fe80::1").is_ok());
  EXPECT_TRUE(check_host_name("[fe80::1]").is_ok());
  EXPECT_EQ(check_host_name("").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(check_host_name("a b").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(check_host_name("a\nb").code(), ErrorCode::kInvalidArgument);
}

TEST(Hostfile, UnreadableFileSaysWhy) {
  try {
    read_hostfile("/nonexistent/hosts");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/hosts"));
    EXPECT_THAT(e.what(), HasSubstr("No such file"));
  }
}

TEST(Hostfile, ADirectoryIsNotAHostfile) {
  try {
    read_hostfile("/tmp");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("is a directory"));
  }
}

TEST(Placement, RoundRobinServersFirstThenWorkersFromTheFirstHost) {
  std::vector<HostEntry> hosts = {{"a", 22, 0}, {"b", 22, 0}};
  // 1 server, 3 workers: server on a; workers a, b, a.
  EXPECT_THAT(place(hosts, 1, 3), ElementsAre(0, 0, 1, 0));
}

TEST(Placement, RoundRobinSkipsFullHosts) {
  std::vector<HostEntry> hosts = {{"a", 22, 1}, {"b", 22, 0}};
  EXPECT_THAT(place(hosts, 2, 2), ElementsAre(0, 1, 1, 1));
}

TEST(Placement, FillsHostsInOrderWhenAllDeclareSlots) {
  std::vector<HostEntry> hosts = {{"a", 22, 3}, {"b", 22, 2}};
  EXPECT_THAT(place(hosts, 2, 3), ElementsAre(0, 0, 0, 1, 1));
  EXPECT_THROW(place(hosts, 3, 3), InvalidArgument);
}

TEST(Placement, LocalPutsEverythingOnHostZero) {
  EXPECT_THAT(place({}, 2, 1), ElementsAre(0, 0, 0));
}

// --server-hosts: the last hosts run one server each (ranks 0..k-1); the
// other servers (one per worker host here: the hybrid) and the workers go on
// the others; too few servers or no worker host is refused.
TEST(Placement, SpareServerHostsRunOneServerEachAndNoWorker) {
  std::vector<HostEntry> hosts = {{"w0", 22, 0}, {"w1", 22, 0}, {"s0", 22, 0}, {"s1", 22, 0}};
  EXPECT_THAT(place(hosts, 2, 2, 2), ElementsAre(2, 3, 0, 1));
  EXPECT_THAT(place(hosts, 4, 2, 2), ElementsAre(2, 3, 0, 1, 0, 1));
  EXPECT_THAT(place(hosts, 4, 4, 2), ElementsAre(2, 3, 0, 1, 0, 1, 0, 1));
  EXPECT_THROW(place(hosts, 1, 2, 2), InvalidArgument);
  EXPECT_THROW(place(hosts, 4, 2, 4), InvalidArgument);
}
}  // namespace
}  // namespace pushpull::launch
