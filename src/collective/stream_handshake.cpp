// SPDX-License-Identifier: Apache-2.0
#include "collective/stream_handshake.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "net/address.h"
#include "net/peer_policy.h"
#include "net/wire.h"
#include "pushpull/log.h"

namespace pushpull::collective {
namespace {

constexpr size_t kHelloBytes = kStreamHelloBytes;

net::ProofInput input(const StreamAuth& auth, net::Direction d, const net::Nonce& acceptor_nonce,
                      const net::Nonce& connector_nonce, int prover_rank) {
  return {d, acceptor_nonce, connector_nonce, auth.job_id, Role::kWorker, prover_rank};
}

// A connection to the listener that has not proved who it is yet.
struct Pending {
  net::Fd fd;
  std::unique_ptr<net::TlsLink> tls;  // with TLS: the nonce goes out once its handshake is done
  std::string address;
  std::string host;
  Clock::time_point deadline;
  net::Nonce nonce{};
  std::byte in[kHelloBytes];
  size_t got = 0;
};

bool send_now(int fd, net::TlsLink* tls, const void* data, size_t n) {
  // A fresh socket's send buffer always takes these few bytes at once.
  if (tls != nullptr) return tls->send(data, n) == static_cast<ssize_t>(n) && tls->flush() == 1;
  ssize_t r = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  return r == static_cast<ssize_t>(n);
}

}  // namespace

StreamHelloCheck check_stream_hello(std::span<const std::byte, kStreamHelloBytes> hello,
                                    const StreamAuth& auth, const net::Nonce& nonce, int rank,
                                    int size, const std::vector<bool>& taken) {
  StreamHelloCheck out;
  const uint64_t q = net::load_le<uint64_t>(hello.data());
  net::Nonce theirs;
  net::Proof proof;
  std::memcpy(theirs.data(), hello.data() + 8, theirs.size());
  std::memcpy(proof.data(), hello.data() + 8 + theirs.size(), proof.size());
  if (q <= static_cast<uint64_t>(rank) || q >= static_cast<uint64_t>(size)) {
    out.refusal = fmt::format("claims rank {}, not one of {}..{}", q, rank + 1, size - 1);
    return out;
  }
  const int qr = static_cast<int>(q);
  const std::string key = auth.key();
  if (!net::verify_proof(key, input(auth, net::Direction::kConnector, nonce, theirs, qr), proof)) {
    out.refusal = fmt::format("failed to prove it is rank {} of this job", q);
    return out;
  }
  if (static_cast<size_t>(qr) < taken.size() && taken[static_cast<size_t>(qr)]) {
    out.refusal = fmt::format("rank {} already has its data stream or is not expected", q);
    return out;
  }
  out.rank = qr;
  out.answer = net::compute_proof(key, input(auth, net::Direction::kAcceptor, nonce, theirs, rank));
  return out;
}

std::string StreamAuth::key() const {
  return job_secret + std::string(reinterpret_cast<const char*>(token.data()), token.size());
}

std::vector<Stream> accept_streams(int listener, const StreamAuth& auth, int rank, int size,
                                   Clock::time_point deadline, Millis handshake_timeout,
                                   const std::string& what,
                                   const std::function<std::optional<Status>()>& abandon) {
  std::vector<bool> expected(static_cast<size_t>(std::max(size, 0)), false);
  for (int q = rank + 1; q < size; ++q)
    expected[static_cast<size_t>(q)] = true;
  return accept_streams(listener, auth, rank, expected, deadline, handshake_timeout, what, abandon);
}

std::vector<Stream> accept_streams(int listener, const StreamAuth& auth, int rank,
                                   const std::vector<bool>& expected_ranks,
                                   Clock::time_point deadline, Millis handshake_timeout,
                                   const std::string& what,
                                   const std::function<std::optional<Status>()>& abandon) {
  const int size = static_cast<int>(expected_ranks.size());
  std::vector<Stream> fds(static_cast<size_t>(size));
  std::vector<Pending> pending;
  net::PendingLimit per_source;
  std::vector<std::string> local_hosts;  // this machine's addresses: not capped, see peer_policy.h
  for (const auto& i : net::list_interfaces())
    local_hosts.push_back(i.address);
  net::RefusalLog log;
  int expected = 0;
  for (int q = rank + 1; q < size; ++q)
    expected += expected_ranks[static_cast<size_t>(q)] ? 1 : 0;
  auto pause_until = Clock::time_point{};
  auto drop = [&](size_t i, const std::string& why) {
    log.note(pending[i].host, fmt::format("{}: dropped a data stream connection from {}: {}", what,
                                          pending[i].address, why));
    per_source.release(pending[i].host);
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
  };
  while (expected > 0) {
    if (abandon)
      if (auto why = abandon()) why->raise();
    auto now = Clock::now();
    if (now >= deadline) {
      std::vector<int> missing;
      for (int q = rank + 1; q < size; ++q)
        if (expected_ranks[static_cast<size_t>(q)] && !fds[static_cast<size_t>(q)].fd.valid())
          missing.push_back(q);
      throw Timeout(fmt::format("{}: rank(s) {} did not open their data stream in time", what,
                                fmt::join(missing, ", ")));
    }
    // Expired handshakes go; the rest and the listener are polled together.
    for (size_t i = pending.size(); i-- > 0;)
      if (now >= pending[i].deadline) drop(i, "no handshake within the handshake timeout");
    auto wake = abandon ? std::min(deadline, now + Millis(100)) : deadline;
    for (auto& p : pending)
      wake = std::min(wake, p.deadline);
    const bool listening = now >= pause_until;
    if (!listening) wake = std::min(wake, pause_until);
    std::vector<pollfd> pfds;
    pfds.push_back({listening ? listener : -1, POLLIN, 0});
    for (auto& p : pending)
      pfds.push_back(
          {p.fd.get(), static_cast<short>(p.tls && p.tls->output_pending() ? POLLOUT : POLLIN), 0});
    auto left = std::chrono::duration_cast<Millis>(wake - now).count() + 1;
    int n = ::poll(pfds.data(), pfds.size(), static_cast<int>(std::max<int64_t>(left, 0)));
    if (n < 0 && errno != EINTR)
      throw IoError(fmt::format("{}: poll failed: {}", what, std::strerror(errno)));
    if (n <= 0) continue;
    // Handshakes first (indexes shift when one is dropped, so walk backwards).
    for (size_t i = pending.size(); i-- > 0;) {
      if (pfds[i + 1].revents == 0) continue;
      Pending& p = pending[i];
      if (p.tls && !p.tls->established()) {
        auto step = p.tls->handshake();
        if (step == net::TlsLink::Step::kFailed) {
          drop(i, p.tls->error());
        } else if (step == net::TlsLink::Step::kDone &&
                   !send_now(p.fd.get(), p.tls.get(), p.nonce.data(), p.nonce.size())) {
          drop(i, "could not send the nonce");
        }
        continue;
      }
      ssize_t r = p.tls ? p.tls->recv(p.in + p.got, kHelloBytes - p.got)
                        : ::recv(p.fd.get(), p.in + p.got, kHelloBytes - p.got, MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (r <= 0) {
        drop(i, r == 0 ? "closed before the handshake" : std::strerror(errno));
        continue;
      }
      p.got += static_cast<size_t>(r);
      if (p.got < kHelloBytes) continue;
      std::vector<bool> taken(static_cast<size_t>(size));
      for (size_t k = 0; k < fds.size(); ++k)
        taken[k] = fds[k].fd.valid() || !expected_ranks[k];  // not a partner: refused
      StreamHelloCheck check = check_stream_hello(p.in, auth, p.nonce, rank, size, taken);
      if (check.rank < 0) {
        drop(i, check.refusal);
        continue;
      }
      const auto q = static_cast<size_t>(check.rank);
      if (!send_now(p.fd.get(), p.tls.get(), check.answer.data(), check.answer.size())) {
        drop(i, "could not answer the handshake");
        continue;
      }
      fds[q] = Stream{std::move(p.fd), std::move(p.tls)};
      per_source.release(p.host);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      --expected;
    }
    if (!listening || pfds[0].revents == 0) continue;
    while (true) {
      net::SockAddr remote;
      remote.len = sizeof remote.storage;
      int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&remote.storage), &remote.len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int err = errno;
        if (err == EINTR || err == ECONNABORTED) continue;
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
          // Stop polling the listener for a while instead of spinning on it.
          PP_WARN("{}: cannot accept a data stream: {}; retrying in 100 ms", what,
                  std::strerror(err));
          pause_until = Clock::now() + Millis(100);
        }
        break;
      }
      Pending p;
      p.fd = net::Fd(fd);
      p.address = remote.to_string();
      p.host = net::host_of(remote);
      const bool local = net::is_local_peer(remote, local_hosts);
      if (auth.local_only && !local) {
        log.note(p.host, fmt::format("{}: refused a data stream connection from {}: no job "
                                     "secret, so only this machine's peers are accepted",
                                     what, p.address));
        continue;
      }
      if (!local && !per_source.admit(p.host)) {
        log.note(p.host, fmt::format("{}: closed a data stream connection from {} at once: {} "
                                     "from that address are already authenticating",
                                     what, p.address, per_source.limit()));
        continue;
      }
      p.deadline = std::min(deadline, Clock::now() + handshake_timeout);
      p.nonce = net::random_nonce();
      if (auth.tls) {
        p.tls = std::make_unique<net::TlsLink>(auth.tls, fd, net::TlsLink::Side::kServer);
        pending.push_back(std::move(p));
        continue;
      }
      if (!send_now(fd, nullptr, p.nonce.data(), p.nonce.size())) {
        per_source.release(p.host);
        continue;
      }
      pending.push_back(std::move(p));
    }
  }
  return fds;
}

Stream connect_stream(const std::string& host, int port, const StreamAuth& auth, int rank, int peer,
                      Clock::time_point deadline, const std::string& what) {
  const std::string where = net::format_address(host, port);
  auto fail = [&](const std::string& why) {
    return IoError(fmt::format("{}: cannot open the data stream to rank {} at {}: {}", what, peer,
                               where, why));
  };
  const net::SockAddr addr = net::resolve(host, port);
  if (auth.local_only) {
    std::vector<std::string> local;
    if (!net::is_loopback(addr))
      for (const auto& i : net::list_interfaces())
        local.push_back(i.address);
    if (!net::is_local_peer(addr, local))
      throw ProtocolError(fmt::format(
          "{}: not opening the data stream to rank {} at {}: this node has no job secret and so "
          "connects to this machine only; set the same PUSHPULL_JOB_SECRET on every node",
          what, peer, where));
  }
  net::Fd fd;
  std::unique_ptr<net::TlsLink> tls;
  auto read_exact = [&](void* p, size_t n) {
    return tls ? net::tls_read_all(*tls, p, n, deadline) : net::read_all(fd.get(), p, n, deadline);
  };
  net::Nonce theirs;
  Millis backoff{10};
  for (;;) {
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    tls.reset();
    fd.reset();
    if (Status st = net::connect_once(addr, std::max(left, Millis(1)), &fd); !st)
      throw fail(st.message());
    Status st;
    if (auth.tls) {
      tls = std::make_unique<net::TlsLink>(auth.tls, fd.get(), net::TlsLink::Side::kClient);
      st = net::tls_handshake(*tls, deadline);
      if (!st && tls->refused()) throw ProtocolError(fail(st.message()).what());
    }
    if (st && (st = read_exact(theirs.data(), theirs.size()))) break;
    // Closed before the nonce with time left: the listener's per-source
    // limit of pending connections was full (a flood); dial again.
    if (Clock::now() + backoff >= deadline) throw fail(st.message());
    fd.reset();
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, Millis(1000));
  }
  const std::string key = auth.key();
  net::Nonce mine = net::random_nonce();
  std::byte hello[kHelloBytes];
  net::store_le<uint64_t>(hello, static_cast<uint64_t>(rank));
  std::memcpy(hello + 8, mine.data(), mine.size());
  net::Proof proof =
      net::compute_proof(key, input(auth, net::Direction::kConnector, theirs, mine, rank));
  std::memcpy(hello + 8 + mine.size(), proof.data(), proof.size());
  if (Status st = tls ? net::tls_write_all(*tls, hello, sizeof hello, deadline)
                      : net::write_all(fd.get(), hello, sizeof hello, deadline);
      !st)
    throw fail(st.message());
  net::Proof answer;
  if (Status st = read_exact(answer.data(), answer.size()); !st)
    throw fail(fmt::format("{} (refused?)", st.message()));
  if (!net::verify_proof(key, input(auth, net::Direction::kAcceptor, theirs, mine, peer), answer))
    throw ProtocolError(fmt::format(
        "{}: the listener at {} failed to prove it is rank {} of this job; refusing its data "
        "stream",
        what, where, peer));
  return Stream{std::move(fd), std::move(tls)};
}

}  // namespace pushpull::collective
