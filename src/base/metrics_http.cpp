// SPDX-License-Identifier: Apache-2.0
// The Prometheus endpoint (see metrics_http.h).
#include "base/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "pushpull/error.h"

namespace pushpull::metrics {
namespace {

using Clock = std::chrono::steady_clock;

struct Client {
  int fd = -1;
  std::string in;
  std::string out;
  size_t written = 0;
  bool answering = false;
  Clock::time_point deadline;
};

std::string reply(std::string_view status, std::string_view type, std::string_view body) {
  return fmt::format(
      "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
      status, type, body.size(), body);
}

}  // namespace

std::string http_response(std::string_view request, const std::function<std::string()>& render) {
  const auto line_end = request.find("\r\n");
  const std::string_view line = request.substr(0, line_end);
  const auto sp1 = line.find(' ');
  const auto sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || !line.substr(sp2 + 1).starts_with("HTTP/1."))
    return reply("400 Bad Request", "text/plain", "bad request\n");
  const std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
  if (target != "/metrics") return reply("404 Not Found", "text/plain", "only /metrics\n");
  if (method != "GET") return reply("405 Method Not Allowed", "text/plain", "only GET /metrics\n");
  return reply("200 OK", "text/plain; version=0.0.4; charset=utf-8", render());
}

MetricsServer::MetricsServer(std::function<std::string()> render) : render_(std::move(render)) {}

MetricsServer::~MetricsServer() {
  stop();
}

void MetricsServer::start(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
      rc != 0)
    throw IoError(fmt::format("metrics endpoint: cannot resolve '{}': {}", host, gai_strerror(rc)));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool ok =
      fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd, 16) == 0;
  const int err = errno;
  ::freeaddrinfo(res);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    throw IoError(fmt::format("metrics endpoint: cannot listen on {}:{}: {}", host, port,
                              std::strerror(err)));
  }
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  listener_ = fd;
  port_ = ntohs(bound.sin_port);
  stop_.store(false);
  thread_ = std::thread([this] { run(); });
}

void MetricsServer::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (listener_ >= 0) ::close(listener_);
  listener_ = -1;
}

void MetricsServer::run() {
  std::vector<Client> clients;
  char buf[4096];
  while (!stop_.load()) {
    std::vector<pollfd> fds;
    fds.push_back({listener_, static_cast<short>(clients.size() < kMaxClients ? POLLIN : 0), 0});
    for (const Client& c : clients)
      fds.push_back({c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
    ::poll(fds.data(), fds.size(), 100);
    const auto now = Clock::now();
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      const short ev = fds[i + 1].revents;
      bool done = now > c.deadline || (ev & (POLLERR | POLLNVAL)) != 0;
      if (!done && !c.answering && (ev & (POLLIN | POLLHUP))) {
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) {
          done = true;
        } else if (n > 0) {
          c.in.append(buf, static_cast<size_t>(n));
          if (c.in.find("\r\n\r\n") != std::string::npos) {
            c.out = http_response(c.in, render_);
            c.answering = true;
            c.deadline = now + kWriteDeadline;
          } else if (c.in.size() > kMaxRequestBytes) {
            c.out = fmt::format(
                "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
                "Connection: close\r\n\r\n");
            c.answering = true;
            c.deadline = now + kWriteDeadline;
          }
        }
      }
      if (!done && c.answering) {
        const ssize_t n =
            ::send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
        if (n > 0) c.written += static_cast<size_t>(n);
        if (n < 0 && errno != EAGAIN && errno != EINTR) done = true;
        if (c.written == c.out.size()) done = true;
      }
      if (done) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
    std::erase_if(clients, [](const Client& c) { return c.fd < 0; });
    if (fds[0].revents & POLLIN) {
      while (clients.size() < kMaxClients) {
        const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        Client c;
        c.fd = fd;
        c.deadline = now + kRequestDeadline;
        clients.push_back(std::move(c));
      }
    }
  }
  for (Client& c : clients)
    ::close(c.fd);
}

}  // namespace pushpull::metrics
