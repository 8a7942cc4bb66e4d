// SPDX-License-Identifier: Apache-2.0
#include "bench_netns.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "bench_procs.h"
#include "pushpull/error.h"

namespace pushpull::cli {
namespace {

// Runs an iproute2/tc command line quietly; its exit status.
int sh(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str());
}

// The output of a command line (stderr dropped), or "" when it cannot run.
std::string capture(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return out;
  char buf[256];
  while (size_t n = std::fread(buf, 1, sizeof buf, p))
    out.append(buf, n);
  ::pclose(p);
  return out;
}

std::string ns_name(int id, int h) {
  return fmt::format("ppb{}h{}", id, h);
}

}  // namespace

extern "C" char** environ;

// Started before the first namespace exists, so no exit path can leave one
// behind: the shell blocks reading its stdin (a pipe whose only writer is
// this process, close-on-exec so no child inherits it), and on EOF, whether
// from the destructor or from the kernel closing a dead process's files,
// kills what still runs in each namespace and deletes it. In its own session
// (setsid) so a Ctrl-C to the terminal's process group does not stop it.
void NetnsLab::start_guardian(int id, int hosts) {
  std::string names;
  for (int h = 0; h < hosts; ++h)
    names += ns_name(id, h) + " ";
  names += hub_;
  const std::string script = fmt::format(
      "cat >/dev/null; for ns in {}; do for p in $(ip netns pids $ns 2>/dev/null); do kill -9 $p; "
      "done; ip netns del $ns 2>/dev/null; done; exit 0",
      names);
  int fds[2] = {-1, -1};
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[0], 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, "/bin/sh", &fa, &attr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(fds[0]);
  if (rc != 0) {
    ::close(fds[1]);
    return;  // the destructor still cleans up on every non-signal path
  }
  guardian_fd_ = fds[1];
  guardian_pid_ = pid;
}

NetnsLab::NetnsLab(int hosts, const std::string& rate, int queue_ms) {
  const int id = static_cast<int>(::getpid());
  const std::string subnet = fmt::format("10.{}.{}", 200 + id % 50, (id / 50) % 250);
  hub_ = fmt::format("ppb{}hub", id);
  start_guardian(id, hosts);
  auto must = [&](const std::string& cmd) {
    if (sh(cmd) != 0) {
      teardown();
      throw IoError(fmt::format(
          "bench --netns: `{}` failed; network namespaces need root (CAP_NET_ADMIN), iproute2 "
          "and the tbf qdisc",
          cmd));
    }
  };
  must("ip netns add " + hub_);
  must(fmt::format("ip -n {} link add br0 type bridge", hub_));
  must(fmt::format("ip -n {} link set br0 up", hub_));
  // Shape egress of both ends of every link: tbf needs a burst >= 64 KB.
  auto shape = [&](const std::string& ns, const std::string& dev) {
    if (!rate.empty())
      must(
          fmt::format("ip netns exec {} tc qdisc add dev {} root tbf rate {} burst 256kb latency "
                      "{}ms",
                      ns, dev, rate, queue_ms));
  };
  for (int h = 0; h < hosts; ++h) {
    std::string ns = ns_name(id, h), veth = fmt::format("vh{}", h);
    std::string addr = fmt::format("{}.{}", subnet, h + 2);
    ns_.push_back(ns);
    addr_.push_back(addr);
    must("ip netns add " + ns);
    must(fmt::format("ip -n {} link add {} type veth peer name eth0 netns {}", hub_, veth, ns));
    must(fmt::format("ip -n {} link set {} master br0 up", hub_, veth));
    must(fmt::format("ip -n {} addr add {}/24 dev eth0", ns, addr));
    must(fmt::format("ip -n {} link set eth0 up", ns));
    must(fmt::format("ip -n {} link set lo up", ns));
    shape(ns, "eth0");
    shape(hub_, veth);
  }
}

NetnsLab::~NetnsLab() {
  teardown();
}

void NetnsLab::teardown() {
  for (auto& ns : ns_)
    sh("ip netns del " + ns);
  ns_.clear();
  addr_.clear();
  if (!hub_.empty()) sh("ip netns del " + hub_);
  hub_.clear();
  if (guardian_fd_ >= 0) {
    ::close(guardian_fd_);  // EOF: the guardian finds nothing left and exits
    guardian_fd_ = -1;
    for (int i = 0; i < 500; ++i) {  // reap it, for at most 5 s
      int status = 0;
      if (::waitpid(guardian_pid_, &status, WNOHANG) != 0) break;
      ::usleep(10000);
    }
    guardian_pid_ = -1;
  }
}

std::pair<uint64_t, uint64_t> NetnsLab::link_bytes(int h) const {
  auto read = [&](const char* what) -> uint64_t {
    std::string out =
        capture(fmt::format("ip netns exec {} cat /sys/class/net/eth0/statistics/{}", ns(h), what));
    try {
      return out.empty() ? 0 : std::stoull(out);
    } catch (const std::exception&) {
      return 0;
    }
  };
  return {read("rx_bytes"), read("tx_bytes")};
}

std::vector<std::string> NetnsLab::exec(int h) const {
  return {"ip", "netns", "exec", ns(h)};
}

double NetnsLab::goodput_bps(int seconds) const {
  if (hosts() < 2) return 0;
  ProcessGroup server;
  auto s = exec(0);
  s.insert(s.end(), {"iperf3", "-s", "-1", "-B", address(0)});
  server.start(s);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ProcessGroup client;
  auto c = exec(1);
  c.insert(c.end(), {"iperf3", "-c", address(0), "-t", std::to_string(seconds), "-f", "m"});
  client.start(c);
  auto res = client.run(std::chrono::seconds(seconds + 20));
  server.run(std::chrono::seconds(5));
  // "... 0.00-2.00 sec  228 MBytes   956 Mbits/sec    receiver"
  std::smatch m;
  static const std::regex re(R"(([0-9.]+) Mbits/sec\s+receiver)");
  if (!res.ok || !std::regex_search(res.output, m, re)) return 0;
  return std::stod(m[1]) * 1e6;
}

}  // namespace pushpull::cli
