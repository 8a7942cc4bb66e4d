// SPDX-License-Identifier: Apache-2.0
// `pushpull launch` and its credentials and command lines: the job secret
// reaches every process through its environment only (ssh: stdin; mpirun:
// `-x NAME`; srun: its environment), never a command line, the plan or the
// log; hostile working directories, values and arguments stay values on the
// remote shell; hostile host names are refused; the scheduler binds only the
// address it hands out. Stand-in `ssh`, `mpirun` and `srun` programs (shell
// scripts first in PATH) record their argv, stdin and environment; the
// stand-in ssh then runs the remote command here with sh, so the job runs.
#include <sys/stat.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness.h"
#include "launch/commands.h"

namespace pushpull::launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

const std::string kProbe = bin("launch_probe");
const std::string kSecret = "f00dfeedcafe0123456789abcdef0042";

void write_script(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  chmod(path.c_str(), 0755);
}

// Every file in `dir` whose name ends with `suffix`, with its contents.
std::map<std::string, std::string> files_ending(const std::string& dir, const std::string& suffix) {
  std::map<std::string, std::string> out;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().string().ends_with(suffix)) out[e.path().string()] = read_file(e.path());
  return out;
}

std::vector<std::string> split_nul(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == '\0') {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

class StandIns : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string log = shell_quote(logs_.path());
    // ssh: argv (NUL-separated) and stdin to files; then, like sshd, run the
    // words after the host with a shell, its stdin the channel (the
    // launcher's pipe) until the command ends.
    write_script(stubs_.path() + "/ssh", "#!/bin/sh\nlog=" + log + R"(/ssh.$$
for a in "$@"; do printf '%s\0' "$a"; done > "$log.argv"
while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done
if [ $# -lt 3 ]; then echo "stand-in ssh: expected -- HOST COMMAND" >&2; exit 255; fi
shift 2
mkfifo "$log.fifo"
exec 3<&0
tee "$log.stdin" <&3 >"$log.fifo" 3<&- &
tee_pid=$!
exec 3<&-
sh -c "$*" <"$log.fifo"
rc=$?
kill $tee_pid 2>/dev/null
exit $rc
)");
    // mpirun / srun: argv and environment; srun also keeps its --multi-prog file.
    for (std::string name : {"mpirun", "srun"})
      write_script(stubs_.path() + "/" + name, "#!/bin/sh\nlog=" + log + "/" + name + R"(.$$
for a in "$@"; do printf '%s\0' "$a"; done > "$log.argv"
env > "$log.env"
while [ $# -gt 0 ]; do
  if [ "$1" = "--multi-prog" ]; then cp "$2" "$log.conf"; fi
  shift
done
exit 0
)");
    hosts_ = dir_.path() + "/hosts";
    std::ofstream(hosts_) << "hostA\nhostB\n";
  }

  // env [-u PUSHPULL_JOB_SECRET | PUSHPULL_JOB_SECRET=...] PATH=stubs:$PATH ...
  std::vector<std::string> wrapper(std::optional<std::string> secret,
                                   std::vector<std::string> more = {}) const {
    std::vector<std::string> w = {"env"};
    if (secret)
      w.push_back("PUSHPULL_JOB_SECRET=" + *secret);
    else
      w.insert(w.end(), {"-u", "PUSHPULL_JOB_SECRET"});
    w.push_back("PATH=" + stubs_.path() + ":" + std::string(getenv("PATH") ? getenv("PATH") : ""));
    w.insert(w.end(), more.begin(), more.end());
    return w;
  }

  Result launch(const std::vector<std::string>& args, std::optional<std::string> secret,
                const std::string& cwd = "", std::vector<std::string> more_env = {}) {
    return run_launcher(
        args, 60s, [](pid_t, const std::string&) {}, cwd, wrapper(secret, std::move(more_env)));
  }

  TempDir stubs_, logs_, dir_;
  std::string hosts_;
};

TEST_F(StandIns, SshPassesTheSecretOnStdinAndQuotesEveryValue) {
  // A working directory and a value that would run commands if unquoted.
  std::string workdir = dir_.path() + "/it's $(touch pwned-cd) `touch pwned-tick`; dir";
  std::filesystem::create_directories(workdir);
  std::string odd = "a 'b' \"c\" $(touch pwned-env) `touch pwned-env2`;|&\nsecond line";
  auto r = launch({"-H", hosts_, "-n", "2", "-s", "0", "-v", "--env", "PROBE_EXTRA=" + odd, "--",
                   kProbe, "--print-env"},
                  std::nullopt, workdir);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  auto probes = parse_probes(r.out);
  ASSERT_EQ(probes.size(), 2u) << r.out;
  // The generated secret reached both processes...
  std::string secret = probes["worker 0"].env["PUSHPULL_JOB_SECRET"];
  EXPECT_THAT(secret, ::testing::MatchesRegex("[0-9a-f]{32}"));
  EXPECT_EQ(probes["worker 1"].env["PUSHPULL_JOB_SECRET"], secret);
  for (auto& [label, p] : probes) {
    EXPECT_EQ(p.cwd, workdir) << label;
    EXPECT_EQ(p.env["PROBE_EXTRA"], "a 'b' \"c\" $(touch pwned-env) `touch pwned-env2`;|&")
        << label;
  }
  EXPECT_THAT(r.out, HasSubstr("[worker 0] second line"));
  // ...through ssh's stdin, never its command line or the launcher's output.
  auto argvs = files_ending(logs_.path(), ".argv");
  ASSERT_EQ(argvs.size(), 2u);
  for (auto& [file, text] : argvs) {
    auto argv = split_nul(text);
    EXPECT_THAT(text, Not(HasSubstr(secret))) << file;
    ASSERT_GE(argv.size(), 3u);
    EXPECT_EQ(argv[argv.size() - 3], "--") << "the host must follow --";
    EXPECT_THAT(argv[argv.size() - 2], ::testing::AnyOf("hostA", "hostB"));
  }
  for (auto& [file, text] : files_ending(logs_.path(), ".stdin"))
    EXPECT_THAT(text, ::testing::StartsWith(secret + "\n")) << file;
  EXPECT_THAT(r.err, Not(HasSubstr(secret)));
  EXPECT_THAT(r.err, HasSubstr("PUSHPULL_JOB_SECRET=<hidden>"));  // -v prints the variables
  // Nothing ran as a command.
  for (auto& e : std::filesystem::recursive_directory_iterator(dir_.path()))
    EXPECT_THAT(e.path().filename().string(), Not(::testing::StartsWith("pwned")));
}

TEST_F(StandIns, ArgumentsReachTheRemoteProgramAsTheyWere) {
  std::vector<std::string> args = {
      "x; touch pwned-1", "$(touch pwned-2)", "it's", "`touch pwned-3`", "a\"b", "*", "-n", "",
      "two  spaces",      "new\nline"};
  std::vector<std::string> cmd = {
      "-H", hosts_, "-n", "1",  "-s",
      "0",  "--",   "sh", "-c", "for a in \"$@\"; do printf 'ARG<%s>\\n' \"$a\"; done",
      "sh"};
  cmd.insert(cmd.end(), args.begin(), args.end());
  auto r = launch(cmd, kSecret, dir_.path());
  ASSERT_EQ(r.code, 0) << r.err;
  std::string expect;
  for (auto& a : args) {
    std::string line = "ARG<" + a + ">";
    // Output lines are prefixed one by one.
    for (size_t nl = line.find('\n'); nl != std::string::npos; nl = line.find('\n', nl + 1))
      line.replace(nl, 1, "\n[worker 0] ");
    expect += "[worker 0] " + line + "\n";
  }
  EXPECT_EQ(r.out, expect);
  for (auto& e : std::filesystem::recursive_directory_iterator(dir_.path()))
    EXPECT_THAT(e.path().filename().string(), Not(::testing::StartsWith("pwned")));
}

TEST_F(StandIns, TheLaunchersOwnSecretIsPassedOn) {
  auto r = launch({"-H", hosts_, "-n", "1", "-s", "0", "--", kProbe, "--print-env"}, kSecret);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(parse_probes(r.out)["worker 0"].env["PUSHPULL_JOB_SECRET"], kSecret);
  for (auto& [file, text] : files_ending(logs_.path(), ".argv"))
    EXPECT_THAT(text, Not(HasSubstr(kSecret)));
}

TEST_F(StandIns, HostilesHostNamesAreRefused) {
  std::string marker = dir_.path() + "/pwned";
  for (std::string host : std::vector<std::string>{"-oProxyCommand=touch_" + marker, "-F/tmp/x",
                                                   "host;touch", "host$(touch)", "root@-oProxy"}) {
    SCOPED_TRACE(host);
    std::ofstream(hosts_) << host << "\n";
    auto r = launch({"-H", hosts_, "-n", "1", "-s", "0", "--", "true"}, kSecret);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("host name"));
  }
  EXPECT_TRUE(files_ending(logs_.path(), ".argv").empty()) << "ssh ran";
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST_F(StandIns, MpirunGetsTheSecretByNameOnly) {
  auto r = launch({"--launcher", "mpi", "-n", "2", "-s", "1", "--timeout", "5", "--env",
                   "HF_TOKEN=tok-value", "--", "prog"},
                  kSecret);
  ASSERT_EQ(r.code, 0) << r.err;
  auto argvs = files_ending(logs_.path(), ".argv");
  ASSERT_EQ(argvs.size(), 1u);
  auto argv = split_nul(argvs.begin()->second);
  EXPECT_THAT(argvs.begin()->second, Not(HasSubstr(kSecret)));
  EXPECT_THAT(argvs.begin()->second, Not(HasSubstr("tok-value")));
  int forwarded = 0;
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "-x" && (argv[i + 1] == "PUSHPULL_JOB_SECRET" || argv[i + 1] == "HF_TOKEN"))
      ++forwarded;
  EXPECT_EQ(forwarded, 4) << "both names, in both app contexts";
  auto env = files_ending(logs_.path(), ".env").begin()->second;
  EXPECT_THAT(env, HasSubstr("\nPUSHPULL_JOB_SECRET=" + kSecret + "\n"));
  EXPECT_THAT(env, HasSubstr("\nHF_TOKEN=tok-value\n"));
}

TEST_F(StandIns, SrunGetsTheSecretThroughItsEnvironment) {
  auto r = launch({"--launcher", "slurm", "-n", "2", "-s", "1", "--timeout", "5", "--host-ip",
                   "127.0.0.1", "--", "prog"},
                  kSecret, dir_.path());
  ASSERT_EQ(r.code, 0) << r.err;
  auto conf = files_ending(logs_.path(), ".conf");
  ASSERT_EQ(conf.size(), 1u);
  EXPECT_THAT(conf.begin()->second, HasSubstr("DMLC_ROLE=worker"));
  EXPECT_THAT(conf.begin()->second, Not(HasSubstr(kSecret)));
  EXPECT_THAT(files_ending(logs_.path(), ".argv").begin()->second, Not(HasSubstr(kSecret)));
  EXPECT_THAT(files_ending(logs_.path(), ".env").begin()->second,
              HasSubstr("\nPUSHPULL_JOB_SECRET=" + kSecret + "\n"));
}

TEST_F(StandIns, DryRunAndVerboseNeverShowCredentials) {
  for (std::string launcher : {"local", "ssh", "mpi", "slurm"}) {
    SCOPED_TRACE(launcher);
    std::vector<std::string> args = {"--launcher",   launcher,
                                     "-n",           "2",
                                     "-s",           "1",
                                     "--dry-run",    "-v",
                                     "--env",        "DB_PASSWORD=pw-value",
                                     "--env-worker", "WANDB_API_TOKEN=tok-value"};
    if (launcher == "ssh") args.insert(args.end(), {"-H", hosts_});
    if (launcher == "slurm") args.insert(args.end(), {"--host-ip", "10.0.0.1"});
    args.insert(args.end(), {"--", "prog"});
    auto r = launch(args, kSecret);
    ASSERT_EQ(r.code, 0) << r.err;
    for (const auto& text : {r.out, r.err}) {
      EXPECT_THAT(text, Not(HasSubstr(kSecret)));
      EXPECT_THAT(text, Not(HasSubstr("pw-value")));
      EXPECT_THAT(text, Not(HasSubstr("tok-value")));
    }
    if (launcher == "local" || launcher == "ssh") {
      EXPECT_THAT(r.out, HasSubstr("PUSHPULL_JOB_SECRET=<hidden>"));
      EXPECT_THAT(r.out, HasSubstr("DB_PASSWORD=<hidden>"));
    }
  }
  EXPECT_TRUE(files_ending(logs_.path(), ".argv").empty()) << "a dry run ran something";
}

// An empty PUSHPULL_JOB_SECRET no longer turns authentication off (issue
// 35): the launcher makes a secret as when it is unset; only
// PUSHPULL_ALLOW_INSECURE=1 runs a job without one.
TEST_F(StandIns, AnEmptySecretIsAFreshOneUnlessInsecureIsAllowed) {
  auto r = launch({"-H", hosts_, "-n", "1", "-s", "0", "--", kProbe, "--print-env"}, "");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(parse_probes(r.out)["worker 0"].env["PUSHPULL_JOB_SECRET"].size(), 32u) << r.out;
  r = launch({"-H", hosts_, "-n", "1", "-s", "0", "--", kProbe, "--print-env"}, "", "",
             {"PUSHPULL_ALLOW_INSECURE=1"});
  EXPECT_EQ(r.code, 0) << r.err;
  auto probe = parse_probes(r.out)["worker 0"];
  // (Empty, not absent: the stand-in ssh passes its own environment on.)
  EXPECT_EQ(probe.env["PUSHPULL_JOB_SECRET"], "");
  EXPECT_EQ(probe.env["PUSHPULL_ALLOW_INSECURE"], "1");
  // One host: the same (a fresh secret).
  r = launch({"-n", "1", "-s", "1", "--dry-run", "--", "prog"}, "");
  EXPECT_EQ(r.code, 0) << r.err;
  // A secret for one role only is refused.
  r = launch({"-n", "1", "--env-worker", "PUSHPULL_JOB_SECRET=x", "--dry-run", "--", "prog"},
             kSecret);
  EXPECT_EQ(r.code, 2) << r.err;
}

// What the scheduler listens on, as the worker sees it with `ss`.
std::string listeners_of_root_port(const Result& r) {
  std::string out;
  for (auto& l : lines_of(r.out))
    if (l.starts_with("[worker 0] LISTEN")) out += l + "\n";
  return out;
}

TEST_F(StandIns, TheSchedulerBindsTheAddressItHandsOut) {
  if (access("/usr/bin/ss", X_OK) != 0 && access("/bin/ss", X_OK) != 0)
    GTEST_SKIP() << "needs ss (iproute2)";
  std::string show = "ss -Hltn \"sport = :$DMLC_PS_ROOT_PORT\" | sed 's/^/LISTEN /'";
  std::vector<std::string> job = {
      "-n",       "1",  "-s", "1",  "--timeout", "3", "--grace", "1", "--server-command",
      "sleep 30", "--", "sh", "-c", show};
  // One host: loopback only.
  auto r = launch(job, kSecret);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(listeners_of_root_port(r), HasSubstr(" 127.0.0.1:")) << r.out;
  EXPECT_THAT(listeners_of_root_port(r), Not(::testing::ContainsRegex(" 0\\.0\\.0\\.0:[0-9]")))
      << r.out;
  // Several hosts: the address handed out as DMLC_PS_ROOT_URI.
  std::vector<std::string> multi = {"-H", hosts_, "--host-ip", "127.0.0.2"};
  multi.insert(multi.end(), job.begin(), job.end());
  r = launch(multi, kSecret);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(listeners_of_root_port(r), HasSubstr(" 127.0.0.2:")) << r.out;
  EXPECT_THAT(listeners_of_root_port(r), Not(::testing::ContainsRegex(" 0\\.0\\.0\\.0:[0-9]")))
      << r.out;
  // PUSHPULL_BIND_ANY=1: every interface.
  r = launch(job, kSecret, "", {"PUSHPULL_BIND_ANY=1"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(listeners_of_root_port(r), ::testing::ContainsRegex(" 0\\.0\\.0\\.0:[0-9]")) << r.out;
}

}  // namespace
}  // namespace pushpull::launch::testing
