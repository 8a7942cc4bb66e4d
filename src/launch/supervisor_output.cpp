// SPDX-License-Identifier: Apache-2.0
// The supervisor's output (supervisor_impl.h): polling the children's pipes
// and the signal fd, reading the pipes line by line, printing each line with
// its child's prefix, copying it to the child's log file, and noting whom a
// failing child blames.
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <fmt/format.h>

#include "launch/supervisor_impl.h"

namespace pushpull::launch::supervisor_detail {

namespace {

void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = write(fd, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed terminal must not stop the job
    s.remove_prefix(size_t(n));
  }
}

}  // namespace

bool Job::has_open_streams() const {
  for (auto& c : children_)
    for (auto& st : c.streams)
      if (st.fd.get() >= 0) return true;
  return false;
}

void Job::poll_once(Millis timeout) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Child*, Stream*>> owners;
  fds.push_back({signals_.fd(), POLLIN, 0});
  owners.push_back({nullptr, nullptr});
  for (auto& c : children_)
    for (auto& st : c.streams)
      if (st.fd.get() >= 0) {
        fds.push_back({st.fd.get(), POLLIN, 0});
        owners.push_back({&c, &st});
      }
  int n = poll(fds.data(), fds.size(), int(timeout.count()));
  if (n <= 0) return;
  // Output first: a failing child's last lines (its PeerFailure) say whom
  // it blames, and they are in the pipe before its exit can be reaped.
  for (size_t i = 1; i < fds.size(); ++i)
    if (fds[i].revents) read_stream(*owners[i].first, *owners[i].second);
  if (fds[0].revents) reap();
}

void Job::read_stream(Child& c, Stream& st) {
  char buf[16384];
  ssize_t n = read(st.fd.get(), buf, sizeof buf);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    flush(c, st);
    st.fd.reset();
    return;
  }
  st.lines.feed(std::string_view(buf, size_t(n)), [&](std::string_view l) { emit(c, st, l); });
}

// Reads what is already in a child's pipes (it has exited: nothing more is
// coming from it, though a grandchild may still write later).
void Job::drain(Child& c) {
  for (auto& st : c.streams)
    for (int i = 0; i < 64 && st.fd.get() >= 0; ++i) {
      pollfd p{st.fd.get(), POLLIN, 0};
      if (poll(&p, 1, 0) <= 0) break;
      read_stream(c, st);
    }
}

void Job::flush(Child& c, Stream& st) {
  st.lines.flush([&](std::string_view l) { emit(c, st, l); });
}

void Job::emit(Child& c, Stream& st, std::string_view line) {
  // One write per line: lines of different children never mix.
  write_all(st.out, fmt::format("[{}] {}\n", c.spec.label, line));
  if (c.log.get() >= 0) write_all(c.log.get(), fmt::format("{}\n", line));
  // A node that fails because a peer failed says so: remember whom.
  if (c.result.blames.empty()) {
    if (auto who = blamed_in(line); !who.empty() && who != c.spec.label) {
      c.result.blames = who;
      c.result.blame_line = std::string(failure_report_in(line));
    }
  }
}

}  // namespace pushpull::launch::supervisor_detail
