// SPDX-License-Identifier: Apache-2.0
// Units of the launcher: hostfile parsing, placement, variables, command
// builders, line splitting, a descriptor passed to one child.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "launch/commands.h"
#include "launch/hostfile.h"
#include "launch/line_splitter.h"
#include "launch/plan.h"
#include "launch/root_cause.h"
#include "launch/supervisor.h"
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
      {"HOROVOD_RANK", "2"},
      {"HOROVOD_SIZE", "3"},
      {"HOROVOD_LOCAL_RANK", "1"},
      {"HOROVOD_LOCAL_SIZE", "2"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"PUSHPULL_MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "4567"},
      {"PUSHPULL_MASTER_PORT", "4567"},
      {"PUSHPULL_TIMEOUT", "12"},
      {"PUSHPULL_JOB_ID", "job7"},
      {"A", "1"},
      {"W", "2"},
      // Host a holds server 0, worker 0, then this one (Prometheus port P + 2).
      {"PUSHPULL_HOST_PROCESS_INDEX", "2"},
  };
  EXPECT_EQ(w, expect);
  EXPECT_EQ(plan[0].env.at("PUSHPULL_HOST_PROCESS_INDEX"), "0");
  EXPECT_EQ(plan[1].env.at("PUSHPULL_HOST_PROCESS_INDEX"), "1");
  EXPECT_EQ(plan[2].env.at("PUSHPULL_HOST_PROCESS_INDEX"), "0");  // the first on host b

  const auto& s = plan[0].env;
  EXPECT_EQ(s.at("DMLC_ROLE"), "server");
  EXPECT_EQ(s.at("PUSHPULL_RANK"), "0");
  EXPECT_EQ(s.at("S"), "3");
  EXPECT_EQ(s.count("W"), 0u);
  EXPECT_EQ(s.count("RANK"), 0u) << "servers are not part of the workers' world";
  EXPECT_EQ(s.count("HOROVOD_RANK"), 0u);
}

// -s 0 with the local launcher: worker 0 inherits the held rendezvous port
// (PUSHPULL_MASTER_PORT); a torch.distributed store, which cannot adopt that
// socket, gets MASTER_PORT of its own. Without one (ssh, mpirun, srun), both
// are the rendezvous port, as before.
TEST(Plan, WithoutServersAHeldRendezvousPortAndATorchPortOfItsOwn) {
  LaunchConfig cfg;
  cfg.num_workers = 2;
  cfg.num_servers = 0;
  cfg.command = {"./train"};
  Rendezvous rv{"127.0.0.1", 4567};
  rv.master_addr = "127.0.0.1";
  rv.master_port = 4568;
  for (const auto& p : make_plan(cfg, rv)) {
    EXPECT_EQ(p.env.at("PUSHPULL_MASTER_PORT"), "4567") << p.label();
    EXPECT_EQ(p.env.at("MASTER_PORT"), "4568") << p.label();
    EXPECT_EQ(p.env.at("MASTER_ADDR"), "127.0.0.1") << p.label();
    EXPECT_EQ(p.env.count("PUSHPULL_LISTEN_FD"), 0u) << "passed by run_launch to worker 0 only";
  }
  for (const auto& p : make_plan(cfg, {"127.0.0.1", 4567})) {
    EXPECT_EQ(p.env.at("PUSHPULL_MASTER_PORT"), "4567") << p.label();
    EXPECT_EQ(p.env.at("MASTER_PORT"), "4567") << p.label();
  }
}

// ChildSpec::pass_fd: that child alone inherits the descriptor (at the same
// number), its sibling does not, and the supervisor closes the launcher's
// copy once the child started (it holds the port alone).
TEST(Supervisor, APassedDescriptorReachesThatChildOnly) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  const int passed = fds[0];
  ::close(fds[1]);
  const std::string probe = "/proc/$$/fd/" + std::to_string(passed);
  auto child = [&](const std::string& label, const std::string& test) {
    ChildSpec c;
    c.label = label;
    c.argv = {"/bin/sh", "-c", test + " || { echo 'fd " + std::to_string(passed) + "'; exit 3; }"};
    for (char** e = environ; *e; ++e)
      c.env.emplace_back(*e);
    return c;
  };
  std::vector<ChildSpec> specs;
  specs.push_back(child("sibling before", "[ ! -e " + probe + " ]"));
  specs.push_back(child("heir", "[ -e " + probe + " ]"));
  specs.back().pass_fd = passed;
  specs.push_back(child("sibling after", "[ ! -e " + probe + " ]"));
  SignalGuard signals;
  SupervisorSettings settings;
  auto outcome = supervise(signals, std::move(specs), settings);
  EXPECT_EQ(outcome.exit_code, 0) << outcome.reason;
  errno = 0;
  EXPECT_EQ(fcntl(passed, F_GETFD), -1) << "the launcher's copy is still open";
  EXPECT_EQ(errno, EBADF);
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
  EXPECT_THAT(argv, ElementsAre("ssh", "-o", "BatchMode=yes", "-p", "2200", "-i", "/k/id", "--",
                                "a", ::testing::StartsWith("sh -c '")));
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
                                "--rsync-path", "mkdir -p /dst && rsync", "--", "/src/", "a:/dst"));
  // Positional arguments come after "--": a directory named like an option
  // ("-e sh", "--rsh=...") is a path to rsync, never an option.
  argv = rsync_argv(cfg, cfg.hosts[0], "--rsh=touch /tmp/pwned", "-e sh");
  const auto dashes = std::find(argv.begin(), argv.end(), "--");
  ASSERT_NE(dashes, argv.end());
  EXPECT_THAT(std::vector<std::string>(dashes + 1, argv.end()),
              ElementsAre("--rsh=touch /tmp/pwned/", "a:-e sh"));
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
  // Horovod's names are per process: none under mpirun (an MPI-style job).
  for (const char* k :
       {"HOROVOD_RANK=", "HOROVOD_SIZE=", "HOROVOD_LOCAL_RANK=", "HOROVOD_LOCAL_SIZE="})
    EXPECT_THAT(workers, ::testing::Not(::testing::Contains(::testing::StartsWith(k))));
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

namespace pushpull::launch {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Secrets, SensitiveNamesAreMasked) {
  for (const char* name : {"PUSHPULL_JOB_SECRET", "HF_TOKEN", "db_password", "MY_PASSWD", "Token"})
    EXPECT_EQ(masked_value(name, "s3cr3t"), "<hidden>") << name;
  EXPECT_EQ(masked_value("PUSHPULL_JOB_ID", "job7"), "job7");
  EXPECT_EQ(masked_value("PATH", "/bin"), "/bin");
}

LaunchConfig secret_config() {
  LaunchConfig c = two_host_config();
  c.job_secret = "0123456789abcdef0123456789abcdef";
  c.env.push_back({"API_TOKEN", "t0k'en $(x)"});
  return c;
}

TEST(Secrets, SshReadsThemFromStdinNeverFromTheCommandLine) {
  auto cfg = secret_config();
  cfg.workdir = "/w";
  auto plan = make_plan(cfg, {"10.0.0.1", 4567});
  EXPECT_EQ(plan[1].env.at("PUSHPULL_JOB_SECRET"), cfg.job_secret);
  auto argv = ssh_argv(cfg, plan[1]);
  for (const auto& a : argv) {
    EXPECT_THAT(a, Not(HasSubstr(cfg.job_secret)));
    EXPECT_THAT(a, Not(HasSubstr("t0k")));
  }
  auto script = remote_script(cfg.workdir, plan[1].env, plan[1].argv, 5);
  EXPECT_THAT(script, HasSubstr("IFS= read -r API_TOKEN ||"));
  EXPECT_THAT(script, HasSubstr("IFS= read -r PUSHPULL_JOB_SECRET ||"));
  EXPECT_THAT(script, HasSubstr("export PUSHPULL_JOB_SECRET\n"));
  // In name order, one line each.
  EXPECT_EQ(ssh_stdin(plan[1].env), "t0k'en $(x)\n" + cfg.job_secret + "\n");
  EXPECT_THROW(ssh_stdin({{"X_SECRET", "two\nlines"}}), InvalidArgument);
}

TEST(Secrets, MpirunForwardsThemByNameOnly) {
  auto cfg = secret_config();
  auto argv = mpirun_argv(cfg, {"10.0.0.1", 4567}, false);
  auto joined = shell_join(argv);
  EXPECT_THAT(joined, Not(HasSubstr(cfg.job_secret)));
  EXPECT_THAT(joined, Not(HasSubstr("t0k")));
  EXPECT_THAT(joined, HasSubstr("-x PUSHPULL_JOB_SECRET -x"));
  EXPECT_THAT(joined, HasSubstr("-x API_TOKEN -x"));
  auto env = launcher_env(cfg, {"10.0.0.1", 4567});
  EXPECT_EQ(env.at("PUSHPULL_JOB_SECRET"), cfg.job_secret);
  EXPECT_EQ(env.at("API_TOKEN"), "t0k'en $(x)");
  EXPECT_EQ(env.count("DMLC_ROLE"), 0u);
  cfg.env_server.push_back({"API_TOKEN", "another"});
  EXPECT_THROW(launcher_env(cfg, {"10.0.0.1", 4567}), InvalidArgument);
}

TEST(Secrets, SrunKeepsThemOutOfTheMultiProgFile) {
  auto cfg = secret_config();
  cfg.launcher = LauncherKind::kSlurm;
  cfg.hosts.clear();
  auto c = srun_command(cfg, {"10.0.0.1", 4567}, "/w/job.conf");
  EXPECT_THAT(c.multi_prog, Not(HasSubstr(cfg.job_secret)));
  EXPECT_THAT(c.multi_prog, Not(HasSubstr("TOKEN")));
  EXPECT_THAT(c.multi_prog, HasSubstr("DMLC_ROLE=worker"));
}

// The remote script, run by a real sh as ssh's remote side would: hostile
// values stay values.
TEST(Commands, RemoteScriptQuotesEveryValue) {
  char tmpl[] = "/tmp/pp-quote-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  std::string workdir = dir + "/it's $(touch pwned-cd) `touch pwned-tick` dir";
  ASSERT_EQ(system(("mkdir -p " + shell_quote(workdir)).c_str()), 0);
  std::string done = dir + "/done";
  std::map<std::string, std::string> env = {
      {"PLAIN", "a b 'c' \"d\" $(touch pwned-env)\nsecond line"},
      {"JOB_SECRET", "s e'c\"r$(touch pwned-secret)t"},
      {"DONE", done},
  };
  std::vector<std::string> argv = {
      "sh", "-c", "printf '%s|' \"$PWD\" \"$PLAIN\" \"$JOB_SECRET\" \"$1\"; : > \"$DONE\"", "sh",
      "x; touch pwned-arg $(touch pwned-arg2)"};
  std::string script = remote_script(workdir, env, argv, 1);
  std::string out_path = dir + "/out", stdin_path = dir + "/stdin";
  std::ofstream(stdin_path) << ssh_stdin(env);
  // Like ssh's channel: the credentials, then stdin stays open until the end
  // (its end of file would stop the program).
  std::string feed = "{ cat " + shell_quote(stdin_path) + "; while [ ! -e " + shell_quote(done) +
                     " ]; do sleep 0.02; done; }";
  std::string cmd = "cd " + shell_quote(dir) + " && " + feed + " | sh -c " + shell_quote(script) +
                    " > " + shell_quote(out_path);
  ASSERT_EQ(system(cmd.c_str()), 0) << script;
  std::ifstream in(out_path);
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(out, workdir + "|" + env["PLAIN"] + "|" + env["JOB_SECRET"] + "|" + argv[4] + "|");
  for (auto& e : std::filesystem::recursive_directory_iterator(dir))
    EXPECT_THAT(e.path().filename().string(), Not(::testing::StartsWith("pwned")))
        << "a value ran as a command";
  std::filesystem::remove_all(dir);
}

// A failed child in the root-cause tests.
ChildState child(std::string label, bool ended, bool exited, int code) {
  ChildState c;
  c.label = std::move(label);
  c.host = "127.0.0.1";
  c.pid = 100;
  c.ended = ended;
  c.exited = exited;
  c.code = code;
  return c;
}

FailureEvent child_event(size_t i) {
  return {FailureEvent::Kind::kChild, i, ""};
}
FailureEvent scheduler_event(std::string m) {
  return {FailureEvent::Kind::kScheduler, 0, std::move(m)};
}

TEST(RootCause, ASignalBeatsTheExitsItCaused) {
  // server 0 is reaped first (exit 1), then worker 1 (SIGKILL).
  std::vector<ChildState> c = {child("server 0", true, true, 1), child("worker 0", false, false, 0),
                               child("worker 1", true, false, 9)};
  auto r = find_root_cause(c, {child_event(0), child_event(2)});
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_EQ(r.reason, "worker 1 (pid 100, host 127.0.0.1) was killed by signal 9 (SIGKILL)");
  EXPECT_THAT(r.consequences, ElementsAre("server 0 exited with code 1"));
}

TEST(RootCause, TheSchedulersVerdictBeatsLaterExits) {
  // worker 1 was stopped (SIGSTOP): the heartbeats caught it; the others
  // exit because of it, one of them with a code other than 1.
  std::vector<ChildState> c = {child("server 0", true, true, 3), child("worker 0", true, true, 1),
                               child("worker 1", false, false, 0)};
  auto r = find_root_cause(
      c, {scheduler_event("worker 1 (host 127.0.0.1:4000) failed: no heartbeat for 5000 ms"),
          child_event(0), child_event(1)});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.reason,
            "worker 1 (pid 100, host 127.0.0.1) failed (reported by the scheduler): no heartbeat "
            "for 5000 ms");
  EXPECT_THAT(r.consequences,
              ElementsAre("server 0 exited with code 3", "worker 0 exited with code 1"));
}

TEST(RootCause, APeerFailureLineNamesTheVictim) {
  // server 0's exit is seen before the scheduler says anything; its output
  // blamed worker 1, which the heartbeats caught.
  std::vector<ChildState> c = {child("server 0", true, true, 1),
                               child("worker 1", false, false, 0)};
  c[0].blames = "worker 1";
  c[0].blame_line = "PeerFailure: worker 1 (host 127.0.0.1:4000) failed: no heartbeat";
  auto r = find_root_cause(c, {child_event(0)});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.reason, ::testing::StartsWith("worker 1 (pid 100, host 127.0.0.1) failed (reported "
                                              "by server 0): no heartbeat"));
  EXPECT_THAT(r.consequences, ElementsAre("server 0 exited with code 1"));
}

TEST(RootCause, TheNamedNodesOwnExitGivesTheCode) {
  // The scheduler saw worker 1's connection close before worker 1 was reaped.
  std::vector<ChildState> c = {child("worker 0", true, true, 1), child("worker 1", true, true, 3)};
  auto r = find_root_cause(c, {scheduler_event("worker 1 (host h:1) failed: its connection closed"),
                               child_event(0), child_event(1)});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.reason, "worker 1 (pid 100, host 127.0.0.1) exited with code 3");
  EXPECT_THAT(r.consequences, ElementsAre("worker 0 exited with code 1"));
}

TEST(RootCause, AServerWhoseLossLeftNoReplicaSaysSo) {
  // Server 0, killed while server 1 catches up: reaped before the
  // scheduler's report; the final line names it and says why the job could
  // not go on without it (found by the survive mode: the reason was lost).
  std::vector<ChildState> c = {child("server 0", true, false, 9), child("worker 0", true, true, 3)};
  auto r = find_root_cause(
      c, {child_event(0),
          scheduler_event("server 0 (host h:1) failed: its connection closed; no replica left: "
                          "the key ranges placed on server 0 lived on servers 0, 1, all dead"),
          child_event(1)});
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_EQ(r.reason,
            "server 0 (pid 100, host 127.0.0.1) was killed by signal 9 (SIGKILL); no replica left: "
            "the key ranges placed on server 0 lived on servers 0, 1, all dead");
}

TEST(RootCause, AWorkerThatExitedZeroWhileOthersWaited) {
  std::vector<ChildState> c = {child("worker 0", false, false, 0),
                               child("worker 1", true, true, 0)};
  auto r = find_root_cause(
      c, {scheduler_event("worker 1 (host :0) failed: its process exited (code 0) without joining "
                          "the job, while registered workers wait for it to register")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.reason,
              ::testing::StartsWith("worker 1 (pid 100, host 127.0.0.1) failed (reported "
                                    "by the scheduler, exited with code 0): its process"));
}

TEST(RootCause, ASpecificCodeBeatsTheGenericOne) {
  std::vector<ChildState> c = {child("worker 0", true, true, 1), child("worker 1", true, true, 3)};
  auto r = find_root_cause(c, {child_event(0), child_event(1)});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.reason, HasSubstr("worker 1"));
}

TEST(RootCause, ASchedulerFailureNamingNoChild) {
  std::vector<ChildState> c = {child("worker 0", false, false, 0)};
  auto r = find_root_cause(c, {scheduler_event("only 0 of 1 servers registered within 100 ms")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.reason, "the scheduler reported: only 0 of 1 servers registered within 100 ms");
}

TEST(RootCause, ARelayedSchedulerVerdictBeatsTheExitThatRelayedIt) {
  // The scheduler's own report is not in yet; worker 0 relays it and exits 1.
  std::vector<ChildState> c = {child("worker 0", true, true, 1)};
  c[0].blames = blamed_in(
      "[pushpull E] PeerFailure: the scheduler ended the job: only 1 of 2 workers registered");
  c[0].blame_line = "PeerFailure: the scheduler ended the job: only 1 of 2 workers registered";
  EXPECT_EQ(c[0].blames, "scheduler");
  auto r = find_root_cause(c, {child_event(0)});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.reason, "the scheduler reported: only 1 of 2 workers registered");
  EXPECT_THAT(r.consequences, ElementsAre("worker 0 exited with code 1"));
}

TEST(RootCause, NodeNames) {
  EXPECT_EQ(node_named_in("PeerFailure: worker 12 (host 1.2.3.4:5) failed: x"), "worker 12");
  EXPECT_EQ(node_named_in("server: PeerFailure: server 0 (host h:1) failed"), "server 0");
  EXPECT_EQ(node_named_in("the worker 3 said hello"), std::nullopt);
  EXPECT_EQ(node_named_in("worker 1 (not registered; host unknown) failed"), "worker 1");
  EXPECT_EQ(node_named_in("scheduler (host h:1) failed"), std::nullopt);
  // The collectives name members by rank: a job's collective rank is its worker rank.
  EXPECT_EQ(node_named_in("PeerFailure: collective: rank 1 (host 127.0.0.1:4000) failed: no "
                          "heartbeat"),
            "worker 1");
  EXPECT_EQ(node_named_in("collective: rank 1 shut down its communicator"), std::nullopt);
  EXPECT_EQ(blamed_in("server: PeerFailure: worker 2 (host h:1) failed: x"), "worker 2");
  EXPECT_EQ(blamed_in("worker 2 (host h:1) failed: x"), "");
  EXPECT_EQ(blamed_in("lenet: error: collective: rank 2 (host h:1) failed: no heartbeat"),
            "worker 2");
  EXPECT_EQ(blamed_in("collective: rank 0 fails its pending operations: collective: rank 2 "
                      "(host h:1) failed: x"),
            "worker 2");
  EXPECT_EQ(blamed_in("PeerFailure: scheduler (host h:1) failed: closed"), "");
}

}  // namespace
}  // namespace pushpull::launch
