// Transport: the I/O thread (epoll loop, accept + acceptor side of the hello,
// the receive state machine, flushing send queues, closing).
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "net/conn.h"
#include "pushpull/log.h"

namespace pushpull::net {

bool transport_write_queue(int fd, std::deque<SendOp>& q, std::vector<SendOp>& completed);

namespace {
constexpr size_t kDirectRead = 16 << 10;  // payload rest read straight into place above this
constexpr size_t kReadBudget = 8 << 20;   // per wakeup per connection, for fairness
constexpr uint64_t kHandshakeMax = 4096;  // payload cap before a peer is authenticated
}  // namespace

void Transport::loop() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  while (!stopping_) {
    // The timeout only serves the handshake deadlines; otherwise this blocks.
    int n = epoll_wait(epoll_fd_.get(), events, kMaxEvents, 500);
    if (n < 0 && errno != EINTR) {
      PP_ERROR("epoll_wait failed: {}", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n && !stopping_; ++i) {
      void* p = events[i].data.ptr;
      if (p == nullptr) {
        uint64_t v;
        [[maybe_unused]] auto r = ::read(wake_fd_.get(), &v, sizeof v);
        continue;
      }
      if (p == &listen_fd_) {
        accept_all();
        continue;
      }
      auto* c = static_cast<Conn*>(p);
      // Closed connections stay in graveyard_ until this batch is done, so
      // the pointer is valid here.
      if (c->state == Conn::State::kClosed) continue;
      if (events[i].events & EPOLLOUT) flush(*c);
      if (c->state != Conn::State::kClosed && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        on_readable(*c);
    }
    std::vector<std::pair<ConnId, Status>> closing;
    std::vector<std::shared_ptr<Conn>> expired;
    auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(mu_);
      closing.swap(to_close_);
      for (auto& [id, c] : conns_)
        if (c->state == Conn::State::kHandshake && now > c->handshake_deadline)
          expired.push_back(c);
    }
    for (auto& [id, why] : closing)
      if (auto c = find(id)) close_conn(*c, why, true);
    for (auto& c : expired) {
      PP_WARN("closing connection from {}: no hello within the connect timeout", c->peer.address);
      close_conn(*c, {ErrorCode::kTimeout, "no hello"}, false);
    }
    std::vector<std::shared_ptr<Conn>> dead;
    {
      std::lock_guard lock(mu_);
      dead.swap(graveyard_);
    }
  }
  std::unordered_map<ConnId, std::shared_ptr<Conn>> all;
  {
    std::lock_guard lock(mu_);
    all.swap(conns_);
  }
  for (auto& [id, c] : all)
    close_conn(*c, {ErrorCode::kIoError, "transport stopped"}, false);
}

void Transport::accept_all() {
  while (true) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        PP_WARN("accept failed: {}", std::strerror(errno));
      return;
    }
    auto c = std::make_shared<Conn>();
    c->fd = Fd(fd);
    tune_socket(fd, config_.net.socket_buffer_bytes);
    c->peer.address = peer_address(fd);
    c->nonce = random_nonce();
    c->handshake_deadline = std::chrono::steady_clock::now() + config_.net.connect_timeout;
    add_conn(c);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = c.get();
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
    Challenge ch{config_.protocol_version, config_.net.job_id, c->nonce};
    auto payload = encode(ch);
    SendOp op;
    op.header = encode_header(stamp(Header{.type = msg::kChallenge}, payload.size()));
    op.owned = pool_.acquire(payload.size());
    std::memcpy(op.owned.data(), payload.data(), payload.size());
    op.data = op.owned.data();
    op.len = payload.size();
    enqueue(*c, std::move(op), true);
  }
}

void Transport::on_readable(Conn& c) {
  size_t budget = kReadBudget;
  auto fail_io = [&](ssize_t r) {
    if (r == 0)
      close_conn(c, {ErrorCode::kIoError, "connection closed by the peer"}, true);
    else
      close_conn(c, {ErrorCode::kIoError, fmt::format("receive failed: {}", std::strerror(errno))},
                 true);
  };
  while (budget > 0 && c.state != Conn::State::kClosed) {
    if (c.in_payload && c.st_begin == c.st_end && c.payload_left() >= kDirectRead) {
      ssize_t r = ::recv(c.fd.get(), c.dst + c.got, c.payload_left(), MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return fail_io(r);
      c.got += static_cast<size_t>(r);
      budget -= std::min(budget, static_cast<size_t>(r));
      if (c.payload_left() == 0) finish_message(c);
      continue;
    }
    if (c.st_begin == c.st_end) {
      c.st_begin = c.st_end = 0;
      ssize_t r = ::recv(c.fd.get(), c.staging.get(), Conn::kStaging, MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return fail_io(r);
      c.st_end = static_cast<size_t>(r);
      budget -= std::min(budget, static_cast<size_t>(r));
    }
    while (c.st_begin < c.st_end && c.state != Conn::State::kClosed) {
      size_t avail = c.st_end - c.st_begin;
      if (!c.in_payload) {
        size_t take = std::min(avail, kHeaderBytes - c.hdr_got);
        std::memcpy(c.hdr_bytes.data() + c.hdr_got, c.staging.get() + c.st_begin, take);
        c.hdr_got += take;
        c.st_begin += take;
        if (c.hdr_got == kHeaderBytes) on_header(c);
      } else {
        size_t take = std::min(avail, c.payload_left());
        std::memcpy(c.dst + c.got, c.staging.get() + c.st_begin, take);
        c.got += take;
        c.st_begin += take;
        if (c.payload_left() == 0) finish_message(c);
      }
    }
  }
}

void Transport::on_header(Conn& c) {
  c.hdr_got = 0;
  const bool handshake = c.state == Conn::State::kHandshake;
  Status st = decode_header(c.hdr_bytes, handshake ? kHandshakeMax : config_.net.max_message_bytes,
                            &c.hdr, config_.protocol_version);
  if (st && handshake && c.hdr.type != msg::kHello)
    st = {ErrorCode::kProtocolError,
          fmt::format("expected a hello, got message type {}", c.hdr.type)};
  if (st && !handshake) {
    // A posted receive takes the message; otherwise its type needs a handler.
    std::lock_guard lock(c.recv_mu);
    RecvMatch m{c.hdr.type, c.hdr.request_id, c.hdr.key};
    for (auto it = c.posted.begin(); it != c.posted.end(); ++it) {
      if (!(it->match == m)) continue;
      c.active = std::move(*it);
      c.posted.erase(it);
      break;
    }
    if (!c.active && !handler(c.hdr.type))
      st = {ErrorCode::kProtocolError, fmt::format("unknown message type {}", c.hdr.type)};
  }
  if (!st) {
    if (handshake) {
      // Tell the connector why before closing, so both sides log the reason.
      PP_WARN("refused connection from {}: {}", c.peer.address, st.message());
      send_hello_ack(c, st.message());
      close_conn(c, st, false);
      return;
    }
    PP_ERROR("ProtocolError from {}: {}; closing that connection", c.peer.describe(), st.message());
    close_conn(c, st, true);
    return;
  }
  c.in_payload = true;
  c.got = 0;
  c.discard = false;
  if (c.active && c.hdr.payload_bytes <= c.active->capacity) {
    c.dst = c.active->dst;
  } else {
    c.discard = c.active.has_value();
    c.buf = pool_.acquire(c.hdr.payload_bytes);
    c.dst = c.buf.data();
  }
  if (c.hdr.payload_bytes == 0) finish_message(c);
}

void Transport::finish_message(Conn& c) {
  c.in_payload = false;
  if (c.active) {
    PostedRecv p = std::move(*c.active);
    c.active.reset();
    if (c.discard) {
      c.buf.reset();
      p.done({ErrorCode::kProtocolError,
              fmt::format("message of type {} from {} has {} bytes, more than the {} posted",
                          c.hdr.type, c.peer.describe(), c.hdr.payload_bytes, p.capacity)},
             c.hdr);
    } else {
      p.done(Status{}, c.hdr);
    }
    return;
  }
  Message m{c.id, c.hdr, std::move(c.buf)};
  if (c.state == Conn::State::kHandshake) return on_hello(c, std::move(m));
  if (auto h = handler(c.hdr.type)) (*h)(std::move(m));
}

// Answers a hello: accepted (empty `reason`) or refused and why, so both
// sides log the reason. Runs on the I/O thread.
void Transport::send_hello_ack(Conn& c, const std::string& reason) {
  HelloAck ack{reason.empty(), reason, Role::kNone, -1};
  {
    std::lock_guard lock(mu_);  // set_identity() may run concurrently
    ack.role = role_;
    ack.rank = rank_;
  }
  auto payload = encode(ack);
  SendOp op;
  op.header = encode_header(stamp(Header{.type = msg::kHelloAck}, payload.size()));
  op.owned = pool_.acquire(payload.size());
  std::memcpy(op.owned.data(), payload.data(), payload.size());
  op.data = op.owned.data();
  op.len = payload.size();
  enqueue(c, std::move(op), true);
}

void Transport::on_hello(Conn& c, Message&& m) {
  Hello hello;
  Status st = decode(std::span<const std::byte>(m.payload.data(), m.payload.size()), &hello);
  std::string reason = st ? check_hello(hello, c.nonce, config_.protocol_version,
                                        config_.net.job_id, config_.net.job_secret)
                          : st.message();
  send_hello_ack(c, reason);
  if (!reason.empty()) {
    PP_WARN("refused connection from {} ({} {}): {}", c.peer.address, role_name(hello.role),
            hello.rank, reason);
    close_conn(c, {ErrorCode::kProtocolError, reason}, false);
    return;
  }
  ConnectHandler h;
  {
    std::lock_guard lock(mu_);  // peer() reads it from other threads
    c.peer.role = hello.role;
    c.peer.rank = hello.rank;
    c.peer.host = hello.host;
    c.peer.port = hello.port;
    h = on_connect_;
  }
  c.state = Conn::State::kOpen;
  if (h) h(c.id, c.peer);
}

void Transport::flush(Conn& c) {
  std::vector<SendOp> completed;
  bool ok;
  {
    std::lock_guard lock(c.send_mu);
    if (c.closed) return;
    ok = transport_write_queue(c.fd.get(), c.queue, completed);
    if (ok && c.queue.empty()) {
      c.want_out = false;
      arm_output(c);
    }
  }
  for (auto& op : completed) {
    --queued_;
    if (op.done) op.done(Status{});
  }
  if (!ok)
    close_conn(c, {ErrorCode::kIoError, fmt::format("send failed: {}", std::strerror(errno))},
               true);
}

void Transport::close_conn(Conn& c, const Status& why, bool notify) {
  if (c.state == Conn::State::kClosed) return;
  const bool was_open = c.state == Conn::State::kOpen;
  c.state = Conn::State::kClosed;
  std::deque<SendOp> sends;
  std::vector<PostedRecv> recvs;
  {
    std::lock_guard lock(c.send_mu);
    // A refusal ack may still be queued: give it one last non-blocking try.
    std::vector<SendOp> completed;
    transport_write_queue(c.fd.get(), c.queue, completed);
    for (auto& op : completed) {
      --queued_;
      if (op.done) op.done(Status{});
    }
    c.closed = true;
    c.close_status = why;
    sends.swap(c.queue);
  }
  {
    std::lock_guard lock(c.recv_mu);
    recvs.swap(c.posted);
  }
  if (c.active) recvs.push_back(std::move(*c.active));
  c.active.reset();
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  ::shutdown(c.fd.get(), SHUT_RDWR);
  CloseHandler on_close;
  {
    std::lock_guard lock(mu_);
    auto it = conns_.find(c.id);
    if (it != conns_.end()) {
      graveyard_.push_back(it->second);
      conns_.erase(it);
    }
    on_close = on_close_;
  }
  Status failure = why.is_ok() ? Status{ErrorCode::kIoError, "connection closed"} : why;
  Status peer_failure{failure.code(), fmt::format("connection to {} closed: {}", c.peer.describe(),
                                                  failure.message())};
  for (auto& op : sends) {
    --queued_;
    if (op.done) op.done(peer_failure);
  }
  for (auto& r : recvs)
    r.done(peer_failure, Header{});
  if (notify && was_open && on_close) on_close(c.id, c.peer, why);
}

}  // namespace pushpull::net
