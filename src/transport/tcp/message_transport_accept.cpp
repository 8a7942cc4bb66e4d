// SPDX-License-Identifier: Apache-2.0
// MessageTransport: accepting connections (the per-source limit of pending ones,
// pausing the listener when out of descriptors), the acceptor's side of the
// TLS handshake, and reading again what a TLS link holds. The I/O loop is in
// message_transport_loop.cpp.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "pushpull/log.h"
#include "transport/address.h"
#include "transport/tcp/conn.h"

namespace pushpull::transport {

namespace {
constexpr Millis kMaxAcceptBackoff{1000};

bool out_of_resources(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}
}  // namespace

void MessageTransport::accept_all() {
  while (!listen_paused_) {
    SockAddr remote;
    remote.len = sizeof remote.storage;
    int fd = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&remote.storage), &remote.len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (out_of_resources(err)) return pause_listener(err);
      PP_WARN("accept failed: {}", std::strerror(err));
      return;
    }
    accept_backoff_ = Millis{100};
    admit(Fd(fd), remote);
  }
}

void MessageTransport::accept_adopted() {
  std::vector<Fd> fds;
  {
    std::lock_guard lock(mu_);
    fds.swap(adopted_);
  }
  SockAddr in_process;  // the unnamed end of a socketpair: "inproc"
  in_process.storage.ss_family = AF_UNIX;
  in_process.len = sizeof(sa_family_t);
  for (auto& fd : fds)
    admit(std::move(fd), in_process);
}

void MessageTransport::admit(Fd fd_owned, const SockAddr& remote) {
  const int fd = fd_owned.get();
  // At most kMaxPendingPerSource connections from one address of another
  // machine may be authenticating at once; more are closed before anything
  // is sent (an honest connector retries: MessageTransport::connect). Not this
  // machine's addresses: the job's own nodes share them, so a cap would let
  // any local user lock them out (peer_policy.h).
  const std::string source = host_of(remote);
  const bool counted = !from_this_machine(remote);
  if (counted && !pending_.admit(source)) {
    refusals_.note(source, fmt::format("closed a connection from {} at once: {} connections "
                                       "from that address are already authenticating (the most "
                                       "allowed)",
                                       remote.to_string(), pending_.limit()));
    return;  // fd_owned closes it
  }
  auto c = std::make_shared<Conn>();
  c->fd = std::move(fd_owned);
  c->remote = remote;
  if (counted) c->pending_source = source;
  // TCP_NODELAY now; fixed buffers once it proves to be a message
  // connection (answer_hello): a data stream keeps autotuning.
  tune_socket(fd, 0);
  set_dead_link_timeout(fd, config_.dead_link_timeout);
  c->peer.address = remote.to_string();
  c->nonce = random_nonce();
  // With TLS the challenge below waits in the queue until the TLS
  // handshake is done (write_some, tls_accept_step).
  if (tls_) c->tls = std::make_unique<TlsLink>(tls_, fd, TlsLink::Side::kServer);
  c->handshake_deadline = std::chrono::steady_clock::now() +
                          std::min(config_.net.connect_timeout, config_.net.handshake_timeout);
  add_conn(c);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = c.get();
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
  Challenge ch{config_.protocol_version, job_tag(config_.net.job_id), c->nonce};
  auto payload = encode(ch);
  SendOp op;
  op.header = encode_header(stamp(Header{.type = msg::kChallenge}, payload.size()));
  op.owned = pool_.acquire(payload.size());
  std::memcpy(op.owned.data(), payload.data(), payload.size());
  op.data = op.owned.data();
  op.len = payload.size();
  enqueue(*c, std::move(op), true);
}

// Out of descriptors or memory: the pending connection stays in the backlog
// and the listener stays readable, so keep polling it and the loop spins.
// Stop watching it for a while instead (connections already open go on),
// doubling the pause up to a second, and log once per pause at most.
void MessageTransport::pause_listener(int error) {
  auto now = std::chrono::steady_clock::now();
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, listen_fd_.get(), nullptr);
  listen_paused_ = true;
  listen_resume_ = now + accept_backoff_;
  ++accept_failures_;
  if (now >= accept_log_next_) {
    PP_ERROR(
        "cannot accept connections: {} ({} time(s) since the last report); pausing accepts for "
        "{} ms; raise the open-files limit (ulimit -n) if this persists",
        std::strerror(error), accept_failures_, accept_backoff_.count());
    accept_failures_ = 0;
    accept_log_next_ = now + kMaxAcceptBackoff;
  }
  accept_backoff_ = std::min(accept_backoff_ * 2, kMaxAcceptBackoff);
}

void MessageTransport::resume_listener_if_due() {
  if (!listen_paused_ || std::chrono::steady_clock::now() < listen_resume_) return;
  listen_paused_ = false;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_fd_;
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
}

void MessageTransport::read_again_later(Conn& c) {
  {
    std::lock_guard lock(mu_);
    read_again_.push_back(c.id);
  }
  wake();
}

bool MessageTransport::tls_accept_step(Conn& c) {
  const auto step = c.tls->handshake();
  if (step == TlsLink::Step::kFailed) {
    refuse_stranger(c, c.tls->error(), false);
    return false;
  }
  flush(c);  // the handshake's own records, then (once done) the queued challenge
  return step == TlsLink::Step::kDone && c.state != Conn::State::kClosed;
}

}  // namespace pushpull::transport
