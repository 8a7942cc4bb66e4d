// SPDX-License-Identifier: Apache-2.0
// The Prometheus endpoint: the text exposition format of every counter, and
// the HTTP server (GET /metrics answered, other paths and methods refused,
// an oversized request cut off, a silent client not holding up the next one).
// (Suite names in lower case so `ctest -R metrics` selects them.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "base/metrics.h"
#include "base/metrics_http.h"

namespace {

namespace m = pushpull::metrics;

// Connects to 127.0.0.1:port with 5 s send/receive deadlines.
int dial(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(0, ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a));
  return fd;
}

// Sends `request` and reads until the server closes (or 5 s pass).
std::string exchange(int port, const std::string& request) {
  const int fd = dial(port);
  EXPECT_EQ(static_cast<ssize_t>(request.size()),
            ::send(fd, request.data(), request.size(), MSG_NOSIGNAL));
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return got;
}

// A metric name as the format allows ours: pushpull_[a-z_]+_total.
bool metric_name(std::string_view n) {
  if (!n.starts_with("pushpull_") || !n.ends_with("_total") || n.size() <= 15) return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; });
}

TEST(metrics_prometheus, TextFormatHasEveryCounterWithTypeHelpAndLabels) {
  m::add(m::Counter::kCollectiveOps, 3);
  const std::string text = m::prometheus_text("worker", "2");
  const std::string labels = "{role=\"worker\",rank=\"2\"} ";
  std::istringstream in(text);
  int samples = 0, helps = 0, types = 0;
  for (std::string line; std::getline(in, line);) {
    std::string_view l(line);
    if (l.starts_with("# HELP ")) {
      l.remove_prefix(7);
      const auto sp = l.find(' ');
      EXPECT_TRUE(sp != std::string_view::npos && metric_name(l.substr(0, sp)) && sp + 1 < l.size())
          << line;
      ++helps;
    } else if (l.starts_with("# TYPE ")) {
      l.remove_prefix(7);
      EXPECT_TRUE(l.ends_with(" counter") && metric_name(l.substr(0, l.size() - 8))) << line;
      ++types;
    } else {
      const auto brace = l.find('{');
      ASSERT_NE(brace, std::string_view::npos) << "not exposition format: " << line;
      EXPECT_TRUE(metric_name(l.substr(0, brace))) << line;
      EXPECT_EQ(l.substr(brace, labels.size()), labels) << line;
      const std::string_view v = l.substr(brace + labels.size());
      EXPECT_TRUE(!v.empty() && std::all_of(v.begin(), v.end(), [](char c) {
        return c >= '0' && c <= '9';
      })) << line;
      ++samples;
    }
  }
  const int n = static_cast<int>(m::Counter::kCount);
  EXPECT_EQ(samples, n);
  EXPECT_EQ(helps, n);
  EXPECT_EQ(types, n);
  EXPECT_TRUE(text.ends_with("\n"));
  EXPECT_NE(text.find("pushpull_collective_ops_total{role=\"worker\",rank=\"2\"} " +
                      std::to_string(m::value(m::Counter::kCollectiveOps)) + "\n"),
            std::string::npos);
  EXPECT_EQ(m::label_escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(metrics_prometheus, ResponsesByRequest) {
  auto body = [] { return std::string("x 1\n"); };
  const std::string ok = m::http_response("GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n", body);
  EXPECT_TRUE(ok.starts_with("HTTP/1.1 200 OK\r\n")) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(ok.find("Content-Length: 4\r\n"), std::string::npos);
  EXPECT_TRUE(ok.ends_with("\r\n\r\nx 1\n"));
  EXPECT_TRUE(
      m::http_response("GET /metrics?x=1 HTTP/1.0\r\n\r\n", body).starts_with("HTTP/1.1 200"));
  EXPECT_TRUE(m::http_response("GET / HTTP/1.1\r\n\r\n", body).starts_with("HTTP/1.1 404"));
  EXPECT_TRUE(m::http_response("POST /metrics HTTP/1.1\r\n\r\n", body).starts_with("HTTP/1.1 405"));
  EXPECT_TRUE(m::http_response("garbage\r\n\r\n", body).starts_with("HTTP/1.1 400"));
}

TEST(metrics_prometheus, ServerAnswersAndSurvivesBadClients) {
  m::MetricsServer server([] { return m::prometheus_text("server", "0"); });
  server.start("127.0.0.1", 0);
  ASSERT_GT(server.port(), 0);
  // A silent client holds a connection; the next one is answered anyway.
  const int silent = dial(server.port());
  const std::string got = exchange(server.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(got.starts_with("HTTP/1.1 200 OK")) << got;
  EXPECT_NE(got.find("pushpull_server_rounds_total{role=\"server\",rank=\"0\"}"),
            std::string::npos);
  // Oversized: answered 431 and closed, never read to the end.
  const std::string big =
      exchange(server.port(), "GET /metrics HTTP/1.1\r\nX: " +
                                  std::string(m::MetricsServer::kMaxRequestBytes, 'a'));
  EXPECT_TRUE(big.starts_with("HTTP/1.1 431")) << big.substr(0, 80);
  EXPECT_TRUE(exchange(server.port(), "GET /x HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
  // The silent client is closed by its deadline.
  char c;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(0, ::recv(silent, &c, 1, 0));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  ::close(silent);
  server.stop();
}

}  // namespace
