// SPDX-License-Identifier: Apache-2.0
// The Prometheus endpoint of one process (docs/timeline.md, "Prometheus"):
// a tiny HTTP/1.1 server answering GET /metrics with the metrics counters
// in the text exposition format (version 0.0.4).
//
// One thread runs a poll() loop over the listener and at most kMaxClients
// connections, all non-blocking: a request is read up to kMaxRequestBytes
// and must be complete within kRequestDeadline, the answer written within
// kWriteDeadline, then the connection is closed (Connection: close). A slow,
// silent or oversized client only loses its own connection; the job's
// threads never wait on this one (they only bump atomic counters).
//
// Ownership: a MetricsServer owns its socket and thread; the destructor (or
// stop()) ends the thread within one poll tick (100 ms). Thread safety:
// start()/stop()/port() from one thread; `render` is called on the server's
// thread and must be thread-safe itself.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

namespace pushpull::metrics {

class MetricsServer {
 public:
  static constexpr size_t kMaxClients = 16;
  static constexpr size_t kMaxRequestBytes = 8192;
  static constexpr std::chrono::milliseconds kRequestDeadline{2000};
  static constexpr std::chrono::milliseconds kWriteDeadline{5000};

  explicit MetricsServer(std::function<std::string()> render);
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  ~MetricsServer();

  // Binds host:port (IPv4 address or name; port 0: any free one), listens
  // and starts the thread. Throws IoError when the address cannot be bound.
  void start(const std::string& host, int port);
  void stop();
  int port() const { return port_; }

 private:
  void run();
  std::function<std::string()> render_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The answer to one request's text (a whole request head): status line,
// headers and body. Exposed for tests.
std::string http_response(std::string_view request, const std::function<std::string()>& render);

}  // namespace pushpull::metrics
