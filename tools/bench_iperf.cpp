// SPDX-License-Identifier: Apache-2.0
// iperf3 as the ceiling every loopback benchmark compares with, measured in
// the same run: a child `iperf3 -s -1` that we start, and kill and reap (this
// PID only) when done, plus one client run parsed from its output.
#include "bench_iperf.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "transport/socket.h"

namespace pushpull::cli {
namespace {

// Runs a child, kills and reaps it (this PID only) on destruction.
class Child {
 public:
  explicit Child(std::vector<std::string> argv) {
    std::vector<char*> a;
    for (auto& s : argv)
      a.push_back(s.data());
    a.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int devnull = ::open("/dev/null", O_WRONLY);
      dup2(devnull, 1);
      dup2(devnull, 2);
      execvp(a[0], a.data());
      _exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace

// Single-stream iperf3 over loopback: {bytes moved, seconds}, or nullopt.
std::optional<std::pair<double, double>> iperf3_once(int seconds) {
  int port;
  {
    transport::Fd probe = transport::listen_on("127.0.0.1", 0);
    port = transport::local_port(probe.get());
  }
  Child server({"iperf3", "-s", "-1", "-p", std::to_string(port)});
  std::string out;
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::string cmd = fmt::format("iperf3 -c 127.0.0.1 -p {} -t {} -f m 2>&1", port, seconds);
    FILE* f = popen(cmd.c_str(), "r");
    if (!f) return std::nullopt;
    out.clear();
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, f))
      out.append(buf, n);
    int rc = pclose(f);
    if (rc == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // server not up yet
  }
  // "[  5]   0.00-3.00   sec  9.1 GBytes  26000 Mbits/sec    receiver"
  std::smatch m;
  std::regex re(R"(([\d.]+)-([\d.]+)\s+sec\s+([\d.]+) (\w)Bytes\s+([\d.]+) Mbits/sec\s+receiver)");
  if (!std::regex_search(out, m, re)) return std::nullopt;
  double secs = std::stod(m[2]) - std::stod(m[1]);
  double mult = m[4] == "G" ? 1073741824.0 : m[4] == "M" ? 1048576.0 : 1024.0;
  return std::make_pair(std::stod(m[3]) * mult, secs);
}

}  // namespace pushpull::cli
