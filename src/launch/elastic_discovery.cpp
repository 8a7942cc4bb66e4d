// SPDX-License-Identifier: Apache-2.0
#include "launch/elastic_discovery.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "base/clock.h"
#include "launch/host_list.h"
#include "launch/spawn.h"
#include "pushpull/error.h"
#include "pushpull/options.h"

namespace pushpull::launch {

using Clock = std::chrono::steady_clock;

std::vector<HostEntry> parse_discovery_output(const std::string& text) {
  std::string list;
  size_t start = 0;
  int line_no = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    std::string line = text.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    start = nl == std::string::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())))
      line.pop_back();
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front())))
      line.erase(0, 1);
    if (line.empty()) continue;
    if (line.find(',') != std::string::npos || line.find(' ') != std::string::npos)
      throw InvalidArgument(
          fmt::format("host discovery script, line {}: '{}' is not host:slots (one host per line)",
                      line_no, line));
    if (!list.empty()) list += ',';
    list += line;
  }
  if (list.empty()) return {};
  auto hosts = parse_host_list(list);
  for (auto& h : hosts)
    if (h.slots == 0) h.slots = 1;
  return hosts;
}

std::vector<HostEntry> run_discovery(const std::string& script, Millis timeout) {
  ChildSpec spec;
  spec.label = "host discovery";
  spec.argv = {"/bin/sh", "-c", script};
  const Environment env = Environment::current();  // named: the loop reads its map
  for (const auto& [name, value] : env.vars())
    spec.env.push_back(name + "=" + value);
  Spawned child;
  if (Status st = spawn_child(spec, &child); !st)
    throw InvalidArgument(
        fmt::format("host discovery script '{}' cannot start: {}", script, st.message()));
  std::string out, err;
  const auto deadline = Clock::now() + timeout;
  bool out_open = true, err_open = true;
  while (out_open || err_open) {
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd fds[2] = {{child.out_r.get(), POLLIN, 0}, {child.err_r.get(), POLLIN, 0}};
    if (::poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 200))) < 0 && errno != EINTR) break;
    char buf[4096];
    for (int i = 0; i < 2; ++i) {
      bool& open = i == 0 ? out_open : err_open;
      if (!open || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        std::string& dst = i == 0 ? out : err;
        if (dst.size() < (1 << 20)) dst.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        open = false;
      }
    }
  }
  int status = 0;
  pid_t r = ::waitpid(child.pid, &status, WNOHANG);
  if (r == 0) {
    // Still running at the deadline (or its pipes closed early): give it the
    // rest of the time, then kill it.
    while (r == 0 && Clock::now() < deadline) {
      ::usleep(20000);
      r = ::waitpid(child.pid, &status, WNOHANG);
    }
    if (r == 0) {
      ::kill(-child.pid, SIGKILL);
      ::waitpid(child.pid, &status, 0);
      throw InvalidArgument(
          fmt::format("host discovery script '{}' ran longer than {} ms", script, timeout.count()));
    }
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw InvalidArgument(fmt::format("host discovery script '{}' failed ({}): {}", script,
                                      WIFEXITED(status)
                                          ? fmt::format("exit code {}", WEXITSTATUS(status))
                                          : fmt::format("signal {}", WTERMSIG(status)),
                                      err.substr(0, 500)));
  return parse_discovery_output(out);
}

}  // namespace pushpull::launch
