// SPDX-License-Identifier: Apache-2.0
// MessageTransport's data streams (transport.h, "Streams"): the connector's
// open_stream(), the acceptor's answer to a stream hello and the hand-over
// of the socket once the ack is written, and take_stream().
#include <sys/epoll.h>

#include <algorithm>

#include <fmt/format.h>

#include "pushpull/log.h"
#include "transport/tcp/conn.h"

namespace pushpull::transport {

Stream MessageTransport::open_stream(const std::string& host, int port, Role role, int32_t rank,
                                     std::optional<Millis> timeout) {
  Dialed d =
      dial_hello(host, port, timeout.value_or(config_.net.connect_timeout), HelloKind::kStream);
  // The acceptor proved who it is; a stream to anyone else is of no use
  // (the owner would mix up its peers' data).
  if (d.ack.role != role || d.ack.rank != rank)
    throw ProtocolError(fmt::format(
        "the node at {} is {} {}, not {} {}: no data stream opened (a stale address book?)",
        d.where, role_name(d.ack.role), d.ack.rank, role_name(role), rank));
  Stream s;
  s.peer.role = d.ack.role;
  s.peer.rank = d.ack.rank;
  s.peer.host = host;
  s.peer.port = port;
  s.peer.address = peer_address(d.fd.get());
  s.peer.outgoing = true;
  s.fd = std::move(d.fd);
  s.tls = std::move(d.tls);
  return s;
}

// Accepts an authenticated stream hello from a peer that may open one and
// has not yet: the ack goes out like any other, and once it is written the
// socket leaves this transport (hand_over_stream).
void MessageTransport::answer_stream(Conn& c, const Hello& hello) {
  std::string why;
  const uint32_t id = node_id(hello.role, hello.rank);
  {
    std::lock_guard lock(mu_);
    if (config_.stream_ranks <= 0)
      why = "this node takes no data streams";
    else if (hello.role == Role::kNone || hello.rank < 0 || hello.rank >= config_.stream_ranks)
      why = fmt::format("{} {} may not open a data stream here (only ranks 0 to {} may)",
                        role_name(hello.role), hello.rank, config_.stream_ranks - 1);
    else if (hello.role == role_ && hello.rank == rank_)
      why = "a data stream claiming this node's own identity";
    else if (!stream_peers_.insert(id).second)
      why = fmt::format("{} {} already opened a data stream to this node; a second one is refused",
                        role_name(hello.role), hello.rank);
  }
  if (!why.empty()) return refuse_stranger(c, why, true);
  {
    std::lock_guard lock(mu_);  // peer() reads it from other threads
    c.peer.role = hello.role;
    c.peer.rank = hello.rank;
    c.peer.host = hello.host;
    c.peer.port = hello.port;
  }
  c.peer_id = id;
  const ConnId cid = c.id;
  // Runs once: when the ack is written (on this thread, maybe before
  // send_hello_ack returns), or with an error when the connection closed first.
  send_hello_ack(c, {}, &hello, [this, cid, id](const Status& st) {
    if (st.is_ok()) return hand_over_stream(cid, id);
    std::lock_guard lock(mu_);
    stream_peers_.erase(id);  // it may try again
  });
}

// The ack is written: the socket and its TLS link leave the epoll loop and
// wait for take_stream(). I/O thread; never throws (a send completion).
void MessageTransport::hand_over_stream(ConnId cid, uint32_t peer_id) {
  std::shared_ptr<Conn> c = find(cid);
  // Closed meanwhile (close_conn completes a last-chance write with send_mu
  // held: state is kClosed then, and nothing here may take send_mu).
  if (!c || c->state != Conn::State::kHandshake) {
    std::lock_guard lock(mu_);
    stream_peers_.erase(peer_id);
    return;
  }
  // The connector sends nothing between its hello and our ack: bytes
  // already read past the hello break the protocol (and would be lost).
  if (c->st_begin != c->st_end || c->hdr_got != 0 || c->in_payload) {
    refuse_stranger(*c, "sent data before its stream was accepted", false);
    std::lock_guard lock(mu_);
    stream_peers_.erase(peer_id);
    return;
  }
  {
    std::lock_guard lock(c->send_mu);
    c->closed = true;  // no send() reaches the socket from here on
    c->close_status = Status(ErrorCode::kIoError, "handed over as a data stream");
  }
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
  c->state = Conn::State::kClosed;  // the loop skips it from now on
  Stream s;
  s.fd = std::move(c->fd);
  s.tls = std::move(c->tls);
  {
    std::lock_guard lock(mu_);
    s.peer = c->peer;
    // Kept alive until this loop turn ends: the caller still holds `c`.
    graveyard_.push_back(c);
    conns_.erase(cid);
  }
  {
    std::lock_guard lock(streams_mu_);
    streams_in_.push_back(std::move(s));
  }
  streams_cv_.notify_all();
}

Status MessageTransport::take_stream(Role role, int32_t rank,
                                     std::chrono::steady_clock::time_point deadline, Stream* out) {
  {
    std::unique_lock lock(streams_mu_);
    auto match = [&] {
      return std::find_if(streams_in_.begin(), streams_in_.end(), [&](const Stream& s) {
        return s.peer.role == role && s.peer.rank == rank;
      });
    };
    auto it = match();
    while (it == streams_in_.end()) {
      if (stopping_) return {ErrorCode::kIoError, "transport stopped"};
      if (streams_cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
          (it = match()) == streams_in_.end())
        return {ErrorCode::kTimeout, fmt::format("{} {} opened no data stream to this node in time",
                                                 role_name(role), rank)};
      it = match();
    }
    *out = std::move(*it);
    streams_in_.erase(it);
  }
  // With TLS the ack may still sit in the link: the peer waits for it.
  if (out->tls && out->tls->output_pending())
    if (Status st = tls_write_all(*out->tls, nullptr, 0, deadline); !st) return st;
  return Status::ok();
}

}  // namespace pushpull::transport
