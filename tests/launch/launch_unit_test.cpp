// Units of the launcher: hostfile parsing, placement, variables, command
// builders, line splitting.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "launch/commands.h"
#include "launch/hostfile.h"
#include "launch/line_splitter.h"
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
  EXPECT_THAT(error_of("# nothing\n\n"), HasSubstr("lists no host"));
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

LaunchConfig two_host_config() {
  LaunchConfig c;
  c.num_workers = 3;
  c.num_servers = 1;
  c.launcher = LauncherKind::kSsh;
  c.hosts = {{"a", 2200, 0}, {"b", 22, 0}};
  c.command = {"./train", "--lr", "0.1"};
  c.server_command = "pushpull server";
  c.host_ip = "10.0.0.1";
  c.job_id = "job7";
  c.timeout_s = 12;
  c.interface = "eth1";
  c.env = {{"A", "1"}};
  c.env_worker = {{"W", "2"}};
  c.env_server = {{"S", "3"}};
  return c;
}

TEST(Plan, RanksLocalRanksAndEnvironment) {
  auto cfg = two_host_config();
  auto plan = make_plan(cfg, {"10.0.0.1", 4567});
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].label(), "server 0");
  EXPECT_EQ(plan[0].host, "a");
  EXPECT_EQ(plan[0].ssh_port, 2200);
  EXPECT_THAT(plan[0].argv, ElementsAre("/bin/sh", "-c", "exec pushpull server"));
  // Workers 0, 1, 2 on a, b, a.
  EXPECT_EQ(plan[1].host, "a");
  EXPECT_EQ(plan[2].host, "b");
  EXPECT_EQ(plan[3].host, "a");
  EXPECT_EQ(plan[3].label(), "worker 2");
  EXPECT_EQ(plan[3].local_rank, 1);
  EXPECT_EQ(plan[3].local_size, 2);
  EXPECT_EQ(plan[2].local_rank, 0);
  EXPECT_EQ(plan[2].local_size, 1);

  const auto& w = plan[3].env;
  std::map<std::string, std::string> expect = {
      {"DMLC_ROLE", "worker"},
      {"PUSHPULL_ROLE", "worker"},
      {"DMLC_PS_ROOT_URI", "10.0.0.1"},
      {"PUSHPULL_ROOT_URI", "10.0.0.1"},
      {"DMLC_PS_ROOT_PORT", "4567"},
      {"PUSHPULL_ROOT_PORT", "4567"},
      {"DMLC_NUM_WORKER", "3"},
      {"PUSHPULL_NUM_WORKER", "3"},
      {"DMLC_NUM_SERVER", "1"},
      {"PUSHPULL_NUM_SERVER", "1"},
      {"DMLC_NODE_HOST", "a"},
      {"PUSHPULL_NODE_HOST", "a"},
      {"DMLC_INTERFACE", "eth1"},
      {"PUSHPULL_INTERFACE", "eth1"},
      {"RANK", "2"},
      {"PUSHPULL_RANK", "2"},
      {"WORLD_SIZE", "3"},
      {"PUSHPULL_WORLD_SIZE", "3"},
      {"LOCAL_RANK", "1"},
      {"PUSHPULL_LOCAL_RANK", "1"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"PUSHPULL_LOCAL_SIZE", "2"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"PUSHPULL_MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "4567"},
      {"PUSHPULL_MASTER_PORT", "4567"},
      {"PUSHPULL_TIMEOUT", "12"},
      {"PUSHPULL_JOB_ID", "job7"},
      {"A", "1"},
      {"W", "2"},
  };
  EXPECT_EQ(w, expect);

  const auto& s = plan[0].env;
  EXPECT_EQ(s.at("DMLC_ROLE"), "server");
  EXPECT_EQ(s.at("PUSHPULL_RANK"), "0");
  EXPECT_EQ(s.at("S"), "3");
  EXPECT_EQ(s.count("W"), 0u);
  EXPECT_EQ(s.count("RANK"), 0u) << "servers are not part of the workers' world";
}

TEST(Commands, ShellQuoteSurvivesQuotes) {
  EXPECT_EQ(shell_quote("plain/path-1.0"), "plain/path-1.0");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("it's a $HOME"), "'it'\\''s a $HOME'");
}

TEST(Commands, SshCommandExportsEnvCdsAndKillsTheGroupOnEof) {
  auto cfg = two_host_config();
  cfg.workdir = "/data/job dir";
  cfg.ssh_options = {"-i", "/k/id"};
  auto plan = make_plan(cfg, {"10.0.0.1", 4567});
  auto argv = ssh_argv(cfg, plan[0]);
  EXPECT_THAT(argv, ElementsAre("ssh", "-o", "BatchMode=yes", "-p", "2200", "-i", "/k/id", "a",
                                ::testing::StartsWith("sh -c '")));
  auto script = remote_script(cfg.workdir, plan[0].env, plan[0].argv, 5);
  EXPECT_THAT(script, HasSubstr("cd '/data/job dir' ||"));
  EXPECT_THAT(script, HasSubstr("export DMLC_ROLE=server\n"));
  EXPECT_THAT(script, HasSubstr("setsid /bin/sh -c 'exec pushpull server' </dev/null 3<&- &"));
  EXPECT_THAT(script, HasSubstr("kill -TERM -$pid"));
  EXPECT_THAT(script, HasSubstr("kill -KILL -$pid"));
  EXPECT_THAT(script, HasSubstr(") <&3 >/dev/null 2>&1 &"));  // the watcher reads the channel
}

TEST(Commands, RsyncUsesTheSamePortAndCreatesTheDirectory) {
  auto cfg = two_host_config();
  cfg.ssh_options = {"-i", "/k/id"};
  auto argv = rsync_argv(cfg, cfg.hosts[0], "/src", "/dst");
  EXPECT_THAT(argv, ElementsAre("rsync", "-a", "-e", "ssh -o BatchMode=yes -p 2200 -i /k/id",
                                "--rsync-path", "mkdir -p /dst && rsync", "/src/", "a:/dst"));
}

TEST(Commands, MpirunHasTwoAppContexts) {
  auto cfg = two_host_config();
  cfg.workdir = "/w";
  auto argv = mpirun_argv(cfg, {"10.0.0.1", 4567}, true);
  auto joined = shell_join(argv);
  EXPECT_THAT(joined,
              ::testing::StartsWith(
                  "mpirun --allow-run-as-root --oversubscribe --host a,b --wdir /w -np 3 "));
  auto colon = std::find(argv.begin(), argv.end(), ":");
  ASSERT_NE(colon, argv.end());
  std::vector<std::string> workers(argv.begin(), colon), servers(colon + 1, argv.end());
  EXPECT_THAT(workers, ::testing::Contains("DMLC_ROLE=worker"));
  EXPECT_THAT(workers, ::testing::Contains("WORLD_SIZE=3"));
  EXPECT_THAT(workers, ::testing::Not(::testing::Contains(::testing::StartsWith("RANK="))));
  EXPECT_THAT(workers, ::testing::Contains("W=2"));
  EXPECT_THAT(servers, ::testing::Contains("DMLC_ROLE=server"));
  EXPECT_THAT(servers, ::testing::Contains("S=3"));
  EXPECT_EQ(servers.front(), "-np");
  EXPECT_EQ(servers[1], "1");
  EXPECT_EQ(servers.back(), "exec pushpull server");
  EXPECT_EQ(workers.back(), "0.1");
  EXPECT_THAT(shell_join(mpirun_argv(cfg, {"h", 1}, false)), ::testing::Not(HasSubstr("root")));
}

TEST(Commands, SrunMultiProg) {
  auto cfg = two_host_config();
  cfg.launcher = LauncherKind::kSlurm;
  cfg.hosts.clear();
  cfg.workdir = "/w";
  auto c = srun_command(cfg, {"10.0.0.1", 4567}, "/w/job.conf");
  EXPECT_THAT(c.argv, ElementsAre("srun", "--ntasks=4", "--kill-on-bad-exit=1", "--chdir=/w",
                                  "--multi-prog", "/w/job.conf"));
  // One comment line, then workers 0-2 and server 3.
  auto nl1 = c.multi_prog.find('\n');
  auto nl2 = c.multi_prog.find('\n', nl1 + 1);
  std::string workers = c.multi_prog.substr(nl1 + 1, nl2 - nl1 - 1);
  std::string servers = c.multi_prog.substr(nl2 + 1);
  EXPECT_THAT(workers, ::testing::StartsWith("0-2 env "));
  EXPECT_THAT(workers, HasSubstr(" DMLC_ROLE=worker "));
  EXPECT_THAT(workers, HasSubstr(" DMLC_PS_ROOT_PORT=4567 "));
  EXPECT_THAT(workers, HasSubstr(" PUSHPULL_RANK=%t RANK=%t ./train --lr 0.1"));
  EXPECT_THAT(servers, ::testing::StartsWith("3 env "));
  EXPECT_THAT(servers, HasSubstr(" DMLC_ROLE=server "));
  EXPECT_THAT(servers, HasSubstr(" PUSHPULL_RANK=%o /bin/sh -c 'exec pushpull server'\n"));
}

TEST(LineSplitter, JoinsPiecesAndSplitsLines) {
  LineSplitter s(8);
  std::vector<std::string> got;
  auto emit = [&](std::string_view l) { got.emplace_back(l); };
  s.feed("ab", emit);
  s.feed("c\nde\n\nf", emit);
  EXPECT_THAT(got, ElementsAre("abc", "de", ""));
  s.feed("0123456789", emit);  // "f0123456789": one full piece of 8, then "789"
  EXPECT_THAT(got, ElementsAre("abc", "de", "", "f0123456"));
  s.flush(emit);
  EXPECT_THAT(got, ElementsAre("abc", "de", "", "f0123456", "789"));
}

}  // namespace
}  // namespace pushpull::launch
