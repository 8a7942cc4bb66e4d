// SPDX-License-Identifier: Apache-2.0
#include "bench_netns.h"

#include <unistd.h>

#include <chrono>
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

}  // namespace

NetnsLab::NetnsLab(int hosts, const std::string& rate) {
  const int id = static_cast<int>(::getpid());
  const std::string subnet = fmt::format("10.{}.{}", 200 + id % 50, (id / 50) % 250);
  hub_ = fmt::format("ppb{}hub", id);
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
                      "50ms",
                      ns, dev, rate));
  };
  for (int h = 0; h < hosts; ++h) {
    std::string ns = fmt::format("ppb{}h{}", id, h), veth = fmt::format("vh{}", h);
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
