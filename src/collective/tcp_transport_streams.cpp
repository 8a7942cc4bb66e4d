// TcpTransport::setup_streams: opens the direct data streams (tcp_streams.h)
// after the net connections are up.
//
// Every rank listens on a fresh port of its host and tells each higher rank,
// over the (authenticated) net connection, that port and a random nonce; the
// higher rank connects and presents the nonce and its rank, so only members
// of this group can take a stream. Connects complete in the kernel's backlog,
// so "connect to the lower ranks, then accept the higher ones" cannot
// deadlock. Everything is bounded by NetOptions::connect_timeout.
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "collective/tcp_transport.h"
#include "pushpull/log.h"

namespace pushpull::collective {
namespace {

constexpr uint64_t kStreamSetupTag = kControlTagBit | 0x53545245414d;  // "STREAM"

void put(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t get(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

void TcpTransport::setup_streams(const std::vector<std::pair<std::string, int>>& book) {
  const auto deadline = Clock::now() + opts_.connect_timeout;
  const std::string what = fmt::format("collective rank {}: data streams", rank_);
  std::vector<net::Fd> fds(static_cast<size_t>(size_));
  net::Fd listener;
  uint64_t nonce = 0;
  std::vector<Request> sends;
  unsigned char offer[16];
  if (rank_ + 1 < size_) {
    listener = net::listen_on(host_, 0, size_);
    nonce = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    put(offer, static_cast<uint64_t>(net::local_port(listener.get())));
    put(offer + 8, nonce);
    for (int q = rank_ + 1; q < size_; ++q)
      sends.push_back(isend(*this, q, kStreamSetupTag, offer, sizeof offer));
  }
  // Connect to every lower rank's listener.
  for (int p = 0; p < rank_; ++p) {
    unsigned char got[16];
    irecv(*this, p, kStreamSetupTag, got, sizeof got)
        .wait(deadline, fmt::format("{}: offer from rank {}", what, p));
    std::string error;
    const auto& host = book[static_cast<size_t>(p)].first;
    const int port = static_cast<int>(get(got));
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    net::Fd fd = net::connect_once(net::resolve(host, port), std::max(left, Millis(1)), &error);
    unsigned char hello[16];
    put(hello, get(got + 8));
    put(hello + 8, static_cast<uint64_t>(rank_));
    if (!fd.valid() || !net::write_all(fd.get(), hello, sizeof hello, deadline, &error))
      throw IoError(fmt::format("{}: cannot open the data stream to rank {} at {}: {}", what, p,
                                net::format_address(host, port), error));
    fds[static_cast<size_t>(p)] = std::move(fd);
  }
  // Accept every higher rank.
  for (int expected = size_ - 1 - rank_; expected > 0;) {
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    pollfd pfd{listener.get(), POLLIN, 0};
    if (left <= 0 || ::poll(&pfd, 1, static_cast<int>(left)) == 0)
      throw Timeout(fmt::format("{}: {} higher rank(s) did not open their data stream within {} ms",
                                what, expected, opts_.connect_timeout.count()));
    net::Fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) continue;
    unsigned char hello[16];
    std::string error;
    if (!net::read_all(fd.get(), hello, sizeof hello, deadline, &error)) {
      PP_WARN("{}: dropped a data stream connection: {}", what, error);
      continue;
    }
    const uint64_t q = get(hello + 8);
    if (get(hello) != nonce || q <= static_cast<uint64_t>(rank_) ||
        q >= static_cast<uint64_t>(size_) || fds[q].valid()) {
      PP_WARN("{}: refused a data stream connection with a wrong nonce or rank", what);
      continue;
    }
    fds[q] = std::move(fd);
    --expected;
  }
  for (auto& s : sends)
    s.wait(deadline, what);
  for (auto& fd : fds) {
    if (!fd.valid()) continue;
    net::set_nonblocking(fd.get(), true);
    // TCP_NODELAY only: fixed SO_SNDBUF/SO_RCVBUF would switch off the
    // kernel's buffer autotuning, measured 20% slower on loopback.
    net::tune_socket(fd.get(), 0);
  }
  streams_ = std::move(fds);
  streams_ready_ = true;
}

}  // namespace pushpull::collective
