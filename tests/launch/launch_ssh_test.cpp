// SPDX-License-Identifier: Apache-2.0
// `pushpull launch` over ssh: two "hosts" are network namespaces, each with
// Debian's sshd on its own address; the launcher runs in a third namespace
// that holds the bridge. Everything (namespaces, keys, sshd) is made by the
// test and removed by it, also when it fails. Needs root; skipped otherwise.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness.h"

namespace pushpull::launch::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

const std::string kProbe = bin("launch_probe");

int sh(const std::string& cmd) {
  int st = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

class SshHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "the ssh launcher test needs root (network namespaces)";
    if (access("/usr/sbin/sshd", X_OK) != 0 || access("/usr/bin/rsync", X_OK) != 0)
      GTEST_SKIP() << "the ssh launcher test needs openssh-server and rsync";
    id_ = std::to_string(getpid());
    subnet_ = "10.233." + std::to_string(20 + getpid() % 200);
    client_ns_ = "ppc-" + id_;
    for (int h = 1; h <= 2; ++h)
      host_ns_.push_back("pp" + std::to_string(h) + "-" + id_);
    if (sh("ip netns add " + client_ns_) != 0) {
      client_ns_.clear();
      host_ns_.clear();
      GTEST_SKIP() << "`ip netns add` is not permitted here: cannot make the ssh hosts";
    }
    for (auto& ns : host_ns_)
      ASSERT_EQ(sh("ip netns add " + ns), 0);
    std::string c = "ip -n " + client_ns_ + " ";
    ASSERT_EQ(sh(c + "link set lo up"), 0);
    ASSERT_EQ(sh(c + "link add br0 type bridge"), 0);
    ASSERT_EQ(sh(c + "addr add " + subnet_ + ".1/24 dev br0"), 0);
    ASSERT_EQ(sh(c + "link set br0 up"), 0);
    std::string key = dir_.path() + "/client_key";
    ASSERT_EQ(sh("ssh-keygen -q -t ed25519 -N '' -f " + key), 0);
    ASSERT_EQ(sh("ssh-keygen -q -t ed25519 -N '' -f " + dir_.path() + "/host_key"), 0);
    ASSERT_EQ(sh("cp " + key + ".pub " + dir_.path() + "/authorized_keys"), 0);
    sh("mkdir -p /run/sshd");  // sshd's privilege separation directory
    for (int h = 1; h <= 2; ++h) {
      const auto& ns = host_ns_[h - 1];
      std::string veth = "vh" + std::to_string(h);
      std::string addr = host_addr(h);
      ASSERT_EQ(sh(c + "link add " + veth + " type veth peer name eth0 netns " + ns), 0);
      ASSERT_EQ(sh(c + "link set " + veth + " master br0 up"), 0);
      ASSERT_EQ(sh("ip -n " + ns + " addr add " + addr + "/24 dev eth0"), 0);
      ASSERT_EQ(sh("ip -n " + ns + " link set eth0 up"), 0);
      ASSERT_EQ(sh("ip -n " + ns + " link set lo up"), 0);
      start_sshd(ns, addr, port(h));
    }
    // Wait until both sshd answer (a loaded machine may take a while).
    for (int h = 1; h <= 2; ++h) {
      bool up = false;
      for (int i = 0; i < 100 && !up; ++i) {
        up = sh("ip netns exec " + client_ns_ + " ssh -o BatchMode=yes -o ConnectTimeout=2 -p " +
                std::to_string(port(h)) + " " + ssh_flags() + " " + host_addr(h) + " true") == 0;
        if (!up) std::this_thread::sleep_for(100ms);
      }
      ASSERT_TRUE(up) << "sshd on " << host_addr(h) << " did not answer";
    }
    hostfile_ = dir_.path() + "/hosts";
    std::ofstream(hostfile_) << "# two namespaces\n"
                             << host_addr(1) << ":" << port(1) << "\n"
                             << host_addr(2) << ":" << port(2) << "\n";
  }

  void TearDown() override {
    for (pid_t pid : sshd_) {
      kill(pid, SIGTERM);
      for (int i = 0; i < 100 && waitpid(pid, nullptr, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(20ms);
      if (waitpid(pid, nullptr, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    for (auto& ns : host_ns_)
      sh("ip netns del " + ns);
    if (!client_ns_.empty()) sh("ip netns del " + client_ns_);
  }

  void start_sshd(const std::string& ns, const std::string& addr, int port) {
    std::string cfg = dir_.path() + "/sshd_" + ns;
    std::ofstream(cfg) << "Port " << port << "\nListenAddress " << addr << "\nHostKey "
                       << dir_.path() << "/host_key\nAuthorizedKeysFile " << dir_.path()
                       << "/authorized_keys\nPidFile none\nPermitRootLogin yes\n"
                       << "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                       << "UsePAM no\nStrictModes no\nLogLevel ERROR\n";
    pid_t pid = fork();
    if (pid == 0) {
      execl("/usr/sbin/ip", "ip", "netns", "exec", ns.c_str(), "/usr/sbin/sshd", "-D", "-e", "-f",
            cfg.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    ASSERT_GT(pid, 0);
    sshd_.push_back(pid);
  }

  std::string host_addr(int h) const { return subnet_ + "." + std::to_string(1 + h); }
  int port(int h) const { return 2221 + h; }
  std::string ssh_flags() const {
    return "-i " + dir_.path() +
           "/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o "
           "LogLevel=ERROR";
  }
  std::vector<std::string> launch_args(std::vector<std::string> rest) const {
    std::vector<std::string> a = {
        "-H",           hostfile_,         "--host-ip",
        subnet_ + ".1", "--ssh-option=-i", "--ssh-option=" + dir_.path() + "/client_key"};
    for (auto o : {"StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"})
      a.insert(a.end(), {"--ssh-option=-o", std::string("--ssh-option=") + o});
    a.insert(a.end(), rest.begin(), rest.end());
    return a;
  }
  Result launch(std::vector<std::string> rest, const std::string& cwd = "") {
    return run_launcher(launch_args(std::move(rest)), 90s, [](pid_t, const std::string&) {}, cwd,
                        {"ip", "netns", "exec", client_ns_});
  }

  TempDir dir_;
  std::string id_, subnet_, client_ns_, hostfile_;
  std::vector<std::string> host_ns_;
  std::vector<pid_t> sshd_;
};

TEST_F(SshHosts, TwoHostJobWithSyncedDirectory) {
  std::string src = dir_.path() + "/src", dst = dir_.path() + "/synced";
  std::filesystem::create_directories(src);
  std::ofstream(src + "/payload.txt") << "shipped\n";
  auto r = launch({"-n", "2", "-s", "2", "--timeout", "30", "--sync-dst-dir", dst,
                   "--server-command", kProbe + " --print-env", "--", kProbe, "--print-env"},
                  src);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_EQ(read_file(dst + "/payload.txt"), "shipped\n");
  auto probes = parse_probes(r.out);
  ASSERT_EQ(probes.size(), 4u) << r.out;
  // Round robin, servers first: server 0 and worker 0 on host 1, the others on host 2.
  std::map<std::string, int> host_of = {
      {"server 0", 1}, {"worker 0", 1}, {"server 1", 2}, {"worker 1", 2}};
  for (auto& [label, h] : host_of) {
    SCOPED_TRACE(label);
    auto& p = probes[label];
    EXPECT_EQ(p.cwd, dst);
    EXPECT_EQ(p.env["DMLC_NODE_HOST"], host_addr(h));
    EXPECT_EQ(p.env["DMLC_PS_ROOT_URI"], subnet_ + ".1");
    EXPECT_EQ(p.env["DMLC_NUM_WORKER"], "2");
    // It really ran behind that host's sshd.
    std::string server_end = host_addr(h);
    server_end += ' ';
    server_end += std::to_string(port(h));
    EXPECT_THAT(p.env["SSH_CONNECTION"], ::testing::EndsWith(server_end));
  }
  // The launcher's fresh job secret reached both hosts (over ssh's stdin).
  const std::string secret = probes["worker 0"].env["PUSHPULL_JOB_SECRET"];
  EXPECT_THAT(secret, ::testing::MatchesRegex("[0-9a-f]{32}"));
  for (auto& [label, p] : probes)
    EXPECT_EQ(p.env["PUSHPULL_JOB_SECRET"], secret) << label;
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr(secret)));
  EXPECT_EQ(probes["worker 1"].env["RANK"], "1");
  EXPECT_EQ(probes["worker 1"].env["LOCAL_RANK"], "0");
  EXPECT_EQ(probes["worker 1"].env["LOCAL_WORLD_SIZE"], "1");
  EXPECT_EQ(probes["server 1"].env["PUSHPULL_RANK"], "1");
}

TEST_F(SshHosts, ClusterNodesOnTwoHostsJoinTheLauncher) {
  std::string node = bin("launch_node_probe");
  auto r = launch({"-n", "2", "-s", "2", "--timeout", "30", "--server-command", node, "--", node});
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("[worker 1] NODE worker 1 of 2+2"));
  EXPECT_THAT(r.out, HasSubstr("[server 1] NODE server 1 of 2+2"));
}

// --timeline-filename over ssh: each host's processes measure their clock
// against the launcher's service, the launcher fetches the hosts' files with
// rsync and writes one trace with every node's spans.
TEST_F(SshHosts, OneTimelineFileFromBothHosts) {
  std::string src = dir_.path() + "/tsrc", dst = dir_.path() + "/tsynced";
  std::filesystem::create_directories(src);
  std::string node = bin("launch_node_probe");
  auto r = launch({"-n", "2", "-s", "2", "--timeout", "30", "--sync-dst-dir", dst,
                   "--timeline-filename", "tl.json", "--server-command", node, "--", node},
                  src);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_THAT(r.err, HasSubstr("timeline: merged 4 files")) << r.err;
  const std::string merged = read_file(src + "/tl.json");
  for (const char* n : {"worker 0", "worker 1", "server 0", "server 1"})
    EXPECT_THAT(merged, HasSubstr(std::string("\"name\":\"") + n + "\"")) << n;
  EXPECT_THAT(merged, HasSubstr("\"BARRIER\""));
  EXPECT_THAT(merged, ::testing::Not(HasSubstr("pushpull_clock_offset")));
  // Each process measured its offset over the hosts' bridge.
  for (const char* f :
       {"/tl.worker0.json", "/tl.worker1.json", "/tl.server0.json", "/tl.server1.json"}) {
    const std::string text = read_file(dst + f);
    const auto at = text.find("\"offset_us\"");
    ASSERT_NE(at, std::string::npos) << f;
    std::printf("%s: %s\n", f, text.substr(at, text.find('}', at) - at).c_str());
  }
  EXPECT_FALSE(std::filesystem::exists(src + "/tl.json.fetch"));
}

TEST_F(SshHosts, AFailureOnOneHostStopsTheOtherHost) {
  auto r = launch({"-n",
                   "2",
                   "-s",
                   "2",
                   "--timeout",
                   "60",
                   "--grace",
                   "2",
                   "--server-command",
                   kProbe + " --print-env --sleep 60",
                   "--",
                   kProbe,
                   "--print-env",
                   "--fail-rank",
                   "1",
                   "--fail-after",
                   "4",
                   "--exit",
                   "3",
                   "--sleep",
                   "60"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("worker 1"));
  EXPECT_THAT(r.err, HasSubstr("exit code 3"));
  // The namespaces share the PID space, so the remote PIDs can be checked.
  auto probes = parse_probes(r.out);
  size_t seen = 0;
  for (auto& [label, p] : probes) {
    if (p.pid <= 0) continue;
    ++seen;
    EXPECT_TRUE(wait_gone(p.pid, 8000ms)) << label << " (pid " << p.pid << ") still runs remotely";
  }
  EXPECT_EQ(seen, 4u) << r.out;
}

}  // namespace
}  // namespace pushpull::launch::testing
