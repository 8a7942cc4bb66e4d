// SPDX-License-Identifier: Apache-2.0
// Test helper: n TcpTransports on loopback, as threads of this process,
// connected (every rank listens, the book is exchanged, connect_all runs on a
// thread per rank: the mesh partners connect, other pairs on first use). Ownership: the caller owns
// the returned transports.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness.h"
#include "pushpull/options.h"
#include "transport/tcp/tcp_transport.h"

namespace pushpull::collective::testing {

using transport::Clock;
using transport::Request;
using transport::TcpTransport;

// hosts[r]: rank r's listening address (a loopback one: 127.0.0.x); ranks
// on different addresses count as different hosts (mesh_partners), so
// distinct addresses give the partial mesh of a multi-host job.
inline std::vector<std::unique_ptr<TcpTransport>> connect_tcp_group_on(
    const std::vector<std::string>& hosts, Millis connect_timeout = Millis(5000)) {
  const int n = static_cast<int>(hosts.size());
  NetOptions net;
  net.connect_timeout = connect_timeout;
  std::vector<std::unique_ptr<TcpTransport>> ts;
  std::vector<std::pair<std::string, int>> book;
  for (int r = 0; r < n; ++r) {
    ts.push_back(std::make_unique<TcpTransport>(r, n, net, hosts[static_cast<size_t>(r)]));
    book.emplace_back(hosts[static_cast<size_t>(r)], ts.back()->port());
  }
  // A rank that fails to connect fails the test (rethrown), not the process.
  on_threads(n, [&](int r) { ts[r]->connect_all(book); });
  return ts;
}

inline std::vector<std::unique_ptr<TcpTransport>> connect_tcp_group(
    int n, Millis connect_timeout = Millis(5000)) {
  return connect_tcp_group_on(std::vector<std::string>(static_cast<size_t>(n), "127.0.0.1"),
                              connect_timeout);
}

// How a posted operation ended: ok, or the error it failed with (its code
// and message), waiting at most 20 s.
inline Status outcome(const Request& r) {
  try {
    r.wait(Clock::now() + std::chrono::seconds(20), "test operation");
    return Status::ok();
  } catch (const Error& e) {
    return Status(e.code(), e.what());
  }
}

// Options of rank `rank` of `size` meeting through the MASTER_ADDR store on
// `host`:`port` (loopback, or "inproc": the in-process medium), under a job
// id made of `job` and the port.
inline Options master_addr_options(const std::string& job, int rank, int size, int port,
                                   const std::string& host = "127.0.0.1") {
  Options o;
  o.net.job_id = job + "-" + std::to_string(port);
  o.net.connect_timeout = Millis(5000);
  o.collective.rank = rank;
  o.collective.size = size;
  o.collective.master_addr = host;
  o.collective.master_port = port;
  return o;
}

// Rank r alone on "host" 127.0.0.(r + 1).
inline std::vector<std::string> distinct_loopback_hosts(int n) {
  std::vector<std::string> hosts;
  for (int r = 0; r < n; ++r)
    hosts.push_back("127.0.0." + std::to_string(r + 1));
  return hosts;
}

}  // namespace pushpull::collective::testing
