// SPDX-License-Identifier: Apache-2.0
// Units of the launcher: the command builders (ssh, rsync, mpirun, srun),
// line splitting, the secrets kept out of command lines and logs, and the
// remote script run by a real sh.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "launch/commands.h"
#include "launch/line_splitter.h"
#include "launch/plan.h"
#include "two_host_config.h"

namespace pushpull::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

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

}  // namespace
}  // namespace pushpull::launch
