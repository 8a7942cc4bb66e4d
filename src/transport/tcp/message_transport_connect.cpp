// SPDX-License-Identifier: Apache-2.0
// MessageTransport::connect: the connector's side of a connection (dialing with
// backoff, the local-peer policy, TLS when on, the hello: dial_hello, shared
// with open_stream; then the shared-memory offer), on the calling thread,
// bounded by the connect deadline.
#include <sys/epoll.h>
#include <sys/socket.h>

#include <thread>

#include <fmt/format.h>

#include "pushpull/log.h"
#include "transport/address.h"
#include "transport/host_identity.h"
#include "transport/peer_policy.h"
#include "transport/shm/shm_setup.h"
#include "transport/tcp/conn.h"

namespace pushpull::transport {

MessageTransport::Dialed MessageTransport::dial_hello(const std::string& host, int port,
                                                      Millis limit, HelloKind kind) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + limit;
  const std::string where = format_address(host, port);
  SockAddr addr = resolve(host, port);
  Millis backoff{10};
  std::string error;  // the last connect_once failure
  Fd fd;
  std::unique_ptr<TlsLink> link;  // with PUSHPULL_TLS, once the TCP connection is open
  Status tls_status;              // why its handshake failed
  int attempts = 0;
  auto hs_deadline = deadline;
  // Opens the TCP connection, retrying with backoff until the deadline.
  auto dial = [&] {
    while (true) {
      ++attempts;
      auto left = std::chrono::duration_cast<Millis>(deadline - clock::now());
      fd.reset();
      if (Status st = connect_once(addr, std::min(left, Millis{2000}), &fd); !st)
        error = st.message();
      if (fd.valid() || stopping_) break;
      left = std::chrono::duration_cast<Millis>(deadline - clock::now());
      if (left <= Millis{0}) break;
      std::this_thread::sleep_for(std::min(backoff, left));
      backoff = std::min(backoff * 2, Millis{1000});
    }
    if (!fd.valid())
      throw Timeout(fmt::format(
          "cannot connect to {} after {} attempts in {} ms (last error: {}); check that the node "
          "there is running, that the address and port are right (DMLC_PS_ROOT_URI / "
          "DMLC_PS_ROOT_PORT) and that no firewall blocks it",
          where, attempts, limit.count(), error));
    // Without a secret the acceptor's proof is all zeros and proves
    // nothing: only a peer on this machine may be trusted (peer_policy.h).
    if (config_.net.job_secret.empty() && !config_.net.allow_insecure) {
      SockAddr remote;
      remote.len = sizeof remote.storage;
      if (::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&remote.storage), &remote.len) == 0) {
        std::vector<std::string> local;
        if (!is_loopback(remote))
          for (const auto& i : list_interfaces())
            local.push_back(i.address);
        if (Status why = dial_refusal(remote, config_.net, local); !why) {
          PP_ERROR("not using the connection to {}: {}", where, why.message());
          throw ProtocolError(fmt::format("refused to connect to {}: {}", where, why.message()));
        }
      }
    }
    // The hello, on this thread with blocking I/O bounded by the deadline.
    hs_deadline = std::max(deadline, clock::now() + Millis{2000});
    link.reset();
    tls_status = Status::ok();
    if (tls_) {
      link = std::make_unique<TlsLink>(tls_, fd.get(), TlsLink::Side::kClient);
      tls_status = tls_handshake(*link, hs_deadline);
      if (!tls_status && link->refused()) {
        PP_ERROR("TLS with {} failed: {}", where, tls_status.message());
        throw ProtocolError(fmt::format("TLS with {} failed: {}", where, tls_status.message()));
      }
    }
  };
  auto read_exact = [&](void* p, size_t n) {
    return link ? tls_read_all(*link, p, n, hs_deadline) : read_all(fd.get(), p, n, hs_deadline);
  };
  auto write_exact = [&](const void* p, size_t n) {
    return link ? tls_write_all(*link, p, n, hs_deadline) : write_all(fd.get(), p, n, hs_deadline);
  };
  dial();
  auto fail = [&](const std::string& what) -> Dialed {
    throw IoError(fmt::format("handshake with {} failed: {}", where, what));
  };
  // Reads one handshake message of type `type` (at most kMaxHandshakeBytes).
  auto read_message = [&](uint16_t type, Header* h, std::vector<std::byte>* payload) -> Status {
    HeaderBytes hb;
    // Every failure to read is an IoError here, a timeout too: the caller
    // dials again on IoError while time is left.
    if (!tls_status) return {ErrorCode::kIoError, tls_status.message()};
    if (Status st = read_exact(hb.data(), hb.size()); !st)
      return {ErrorCode::kIoError, st.message()};
    if (Status st = decode_header(hb, kMaxHandshakeBytes, h, config_.protocol_version); !st)
      return st;
    if (h->type != type)
      return {ErrorCode::kProtocolError,
              fmt::format("expected handshake message type {}, got {}", type, h->type)};
    payload->resize(h->payload_bytes);
    if (Status st = read_exact(payload->data(), payload->size()); !st)
      return {ErrorCode::kIoError, st.message()};
    return {};
  };
  Hello hello;
  {
    std::lock_guard lock(mu_);
    hello.role = role_;
    hello.rank = rank_;
    hello.host = adv_host_;
    hello.port = adv_port_;
  }
  hello.version = config_.protocol_version;
  hello.job_tag = job_tag(config_.net.job_id);
  hello.nonce = random_nonce();
  hello.kind = kind;
  auto send_hello = [&](const Nonce& acceptor_nonce) {
    hello.proof =
        compute_proof(config_.net.job_secret, {Direction::kConnector, acceptor_nonce, hello.nonce,
                                               config_.net.job_id, hello.role, hello.rank, kind});
    auto payload = encode(hello);
    Header out = stamp(Header{.type = msg::kHello}, payload.size());
    auto ob = encode_header(out);
    if (Status st = write_exact(ob.data(), ob.size()); !st) return st;
    return write_exact(payload.data(), payload.size());
  };
  Header h;
  std::vector<std::byte> payload;
  Status st = read_message(msg::kChallenge, &h, &payload);
  // Closed before the challenge, with time left: the acceptor's per-source
  // limit of pending connections was full (peer_policy.h), or it was
  // restarting. Dial again, as for a refused connect.
  while (!st && st.code() == ErrorCode::kIoError && !stopping_ &&
         clock::now() + backoff < deadline) {
    fd.reset();
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, Millis{1000});
    dial();
    st = read_message(msg::kChallenge, &h, &payload);
  }
  if (!st && st.code() == ErrorCode::kProtocolError) {
    // E.g. another protocol version. Say hello anyway so the acceptor logs
    // the mismatch too, then fail without retrying.
    send_hello(Nonce{});
    throw ProtocolError(fmt::format("node at {} refused: {}", where, st.message()));
  }
  if (!st) return fail(st.message());
  Challenge ch;
  if (Status s = decode(payload, &ch); !s) return fail(s.message());
  if (Status s = send_hello(ch.nonce); !s) return fail(s.message());
  if (Status s = read_message(msg::kHelloAck, &h, &payload); !s)
    return fail(
        s.code() == ErrorCode::kIoError
            ? fmt::format("{} (the peer closed the connection during the hello)", s.message())
            : s.message());
  HelloAck ack;
  if (Status s = decode(payload, &ack); !s) return fail(s.message());
  if (!ack.accepted) {
    PP_ERROR("node at {} refused our connection: {}", where, ack.reason);
    throw ProtocolError(fmt::format("node at {} refused the connection: {}", where, ack.reason));
  }
  // Mutual: the acceptor proves it knows the secret too, for the identity it claims.
  if (!verify_proof(config_.net.job_secret,
                    {Direction::kAcceptor, ch.nonce, hello.nonce, config_.net.job_id, ack.role,
                     ack.rank, kind},
                    ack.proof)) {
    PP_ERROR("node at {} failed to authenticate; closing the connection", where);
    throw ProtocolError(fmt::format(
        "authentication failed: the node at {} does not know this job's secret (it claims to "
        "be {} {}); it is not a member of this job, or its secret differs from this node's "
        "(from {}): {}",
        where, role_name(ack.role), ack.rank, secret_source(config_.net), kSecretAdvice));
  }
  return Dialed{std::move(fd), std::move(link), std::move(ack), where, hs_deadline};
}

ConnId MessageTransport::connect(const std::string& host, int port, std::optional<Millis> timeout) {
  Dialed d =
      dial_hello(host, port, timeout.value_or(config_.net.connect_timeout), HelloKind::kMessages);
  Fd fd = std::move(d.fd);
  const HelloAck& ack = d.ack;
  auto c = std::make_shared<Conn>();
  set_nonblocking(fd.get(), true);
  tune_socket(fd.get(), config_.net.socket_buffer_bytes);
  set_dead_link_timeout(fd.get(), config_.dead_link_timeout);
  c->peer.role = ack.role;
  c->peer.rank = ack.rank;
  c->peer_id = node_id(ack.role, ack.rank);
  c->peer.host = host;
  c->peer.port = port;
  c->peer.address = peer_address(fd.get());
  c->peer.outgoing = true;
  c->fd = std::move(fd);
  c->tls = std::move(d.tls);
  c->state = Conn::State::kOpen;
  if (config_.shared_memory) offer_shm(*c);
  ConnId id = add_conn(c);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = c.get();
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, c->fd.get(), &ev);
  // Records that came with the hello's answer wait in the link, not the socket.
  if (c->tls && c->tls->input_buffered()) read_again_later(*c);
  if (c->shm_state == Conn::ShmState::kOffered) {
    // Same host? The acceptor answers on its I/O thread; wait for the
    // outcome so this connection's first messages already use the ring.
    queue_ctl(*c, Header{.type = msg::kShmOffer}, encode(c->shm_mine->record()), false);
    wait_shm_settled(*c, d.hs_deadline);
  }
  return id;
}

}  // namespace pushpull::transport
