// SPDX-License-Identifier: Apache-2.0
// Test helper: n TcpTransports on loopback, as threads of this process, fully
// connected (every rank listens, the book is exchanged, connect_all runs on a
// thread per rank). Ownership: the caller owns the returned transports.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collective/tcp_transport.h"

namespace pushpull::collective::testing {

inline std::vector<std::unique_ptr<TcpTransport>> connect_tcp_group(
    int n, Millis connect_timeout = Millis(5000)) {
  NetOptions net;
  net.connect_timeout = connect_timeout;
  std::vector<std::unique_ptr<TcpTransport>> ts;
  std::vector<std::pair<std::string, int>> book;
  for (int r = 0; r < n; ++r) {
    ts.push_back(std::make_unique<TcpTransport>(r, n, net));
    book.emplace_back("127.0.0.1", ts.back()->port());
  }
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] { ts[r]->connect_all(book); });
  for (auto& t : th)
    t.join();
  return ts;
}

}  // namespace pushpull::collective::testing
